// The suffix-index keeper's actor shell: every decision is keeper_core's (keeper_core.hpp).
// This file decodes SuffixResponses through suffix_wire, calls the core and sends what it
// returns.

#include "actors/suffix_index/keeper_actor.hpp"

#include <map>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/suffix_index/keeper_core.hpp"
#include "actors/suffix_index/suffix_wire.hpp"

namespace sorl {

namespace {

struct keeper_state {
  static inline const char* name = "sorl.suffix_index_keeper";
  std::string me;
  suffix_index::keeper_core core;
  std::map<std::string, caf::actor> workers; ///< rollout workers by name
};

using keeper_actor_t = caf::stateful_actor<keeper_state>;

void on(keeper_actor_t* self, msg::SuffixResponses::Reader r) {
  auto& st = self->state;
  const auto m = suffix_index::from_msg(r);
  const auto f = st.core.on_responses(m.origin, m.responses);
  if (!f.refusal.empty())
    return spdlog::warn("{}: {}", st.me, f.refusal);
  if (f.destinations.empty())
    return;
  // Encoded once: in-process, every destination shares the same bytes.
  const auto env = suffix_index::to_msg(m);
  for (const auto& to : f.destinations)
    self->send(st.workers.at(to), env);
  spdlog::debug("{}: {} responses from {} forwarded to {} workers", st.me, m.responses.size(),
                m.origin, f.destinations.size());
}

caf::behavior keeper_actor(keeper_actor_t* self, role_context ctx) {
  self->state.me = ctx.name();
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      for (const auto& p : peers_with_role(roster, role::rollout_worker)) {
        st.workers.emplace(p.name(), p.handle);
        st.core.join(p.name());
      }
      spdlog::debug("{}: keeping {} rollout workers current", st.me, st.core.workers());
    },
    [self](const envelope& e) {
      if (!handle_as<msg::SuffixResponses>(e, self->state.me,
                                           [self](msg::SuffixResponses::Reader r) { on(self, r); }))
        log_unhandled(e, self->state.me);
    },
    [self](peer_down_atom, const peer_info& who, const std::string&) {
      auto& st = self->state;
      if (who.role == role::rollout_worker && st.core.leave(who.name()))
        st.workers.erase(who.name());
    },
    [self](shutdown_atom, bool, const std::string&) {
      spdlog::info("{}: {}", self->state.me, self->state.core.summary());
      self->quit();
    },
  };
}

} // namespace

caf::actor spawn_suffix_index_keeper(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(keeper_actor, ctx);
}

} // namespace sorl
