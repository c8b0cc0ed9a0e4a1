// The scheduler's actor shell: every decision is scheduler_core's (scheduler_core.hpp). This
// file decodes the rollout messages through rollout_wire, calls the core and sends what it
// returns; the placement's checkpointed state goes out and comes back through train_wire.

#include "actors/scheduler/scheduler_actor.hpp"

#include <map>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/rollout/rollout_wire.hpp"
#include "actors/rollout/worker_core.hpp"
#include "actors/scheduler/scheduler_core.hpp"
#include "actors/trainer/train_wire.hpp"

namespace sorl {

namespace {

/// The scheduler's peers in the roster.
struct scheduler_peers {
  std::map<std::string, caf::actor> workers; ///< rollout workers by name
};

scheduler_peers peers_from(const std::vector<peer_info>& roster) {
  scheduler_peers out;
  for (auto& p : peers_with_role(roster, role::rollout_worker))
    out.workers.emplace(p.name(), p.handle);
  return out;
}

struct scheduler_state {
  static inline const char* name = "sorl.scheduler";
  std::string me;
  caf::actor directory;
  std::unique_ptr<scheduler::scheduler_core> core;
  scheduler_peers peers;
};

using scheduler_actor_t = caf::stateful_actor<scheduler_state>;

/// Sends `d`'s requests and aborts, then ends the job for each failure and logs each warning.
void carry_out(scheduler_actor_t* self, const scheduler::dispatch_result& d) {
  auto& st = self->state;
  for (const auto& s : d.sends)
    self->send(st.peers.workers.at(s.worker), rollout::to_msg(s.request));
  for (const auto& a : d.aborts)
    self->send(st.peers.workers.at(a.worker), rollout::to_msg(a.abort));
  for (const auto& why : d.failures)
    fail_job(st.directory, st.me, why);
  for (const auto& w : d.warnings)
    spdlog::warn("{}: {}", st.me, w);
}

// -- one handler per message: decode, call the core, send what it returns -----------------

void on(scheduler_actor_t* self, msg::GenerateRequest::Reader r) {
  carry_out(self, self->state.core->submit(rollout::from_msg(r)));
}
void on(scheduler_actor_t* self, msg::AbortRollouts::Reader a) {
  carry_out(self, self->state.core->abort(rollout::from_msg(a)));
}
void on(scheduler_actor_t* self, msg::RolloutEvent::Reader r) {
  self->state.core->on_event(rollout::from_msg(r));
}
void on(scheduler_actor_t* self, msg::RoleStateQuery::Reader r) {
  const auto q = trainer::from_msg(r);
  self->send(caf::actor_cast<caf::actor>(self->current_sender()),
             trainer::to_msg(trainer::ev::role_state{q.step, role::scheduler,
                                                     self->state.core->save_state(), true, ""}));
}
void on(scheduler_actor_t* self, msg::RoleStateRestore::Reader r) {
  auto why = self->state.core->restore_state(trainer::from_msg(r).state);
  self->send(caf::actor_cast<caf::actor>(self->current_sender()),
             trainer::to_msg(trainer::ev::role_state_restored{role::scheduler, why.empty(), why}));
}

/// The core for `cfg`: with a cache-aware policy it builds each request's prompt as the workers
/// do, and sizes each worker's estimated index to the workers' prefix-cache budget.
std::unique_ptr<scheduler::scheduler_core> make_core(const experiment_config& cfg) {
  const auto dims = model_dims_from(cfg);
  const int64_t blocks = rollout::worker_core::prefix_cache_tokens(dims, cfg.rollout.prefix_cache_bytes)
                         / ml::kv_cache_options{}.block_size;
  auto options = scheduler::placement_options_from(cfg, blocks);
  if (cfg.scheduler.policy != placement_kind::cache_aware
      && cfg.scheduler.policy != placement_kind::sglang_cache_aware)
    return std::make_unique<scheduler::scheduler_core>(options);
  auto task = std::make_shared<ml::any_task>(make_task_from(cfg));
  auto format = std::make_shared<ml::prompt_format>(prompt_format_from(cfg));
  return std::make_unique<scheduler::scheduler_core>(
    options, [task, format](const rollout::rollout_request& r) {
      return rollout::first_prompt_tokens(*task, *format, r.split, r.task_index);
    });
}

caf::behavior scheduler_actor(scheduler_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.directory = ctx.directory;
  st.core = make_core(*ctx.config);
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.peers = peers_from(roster);
      for (const auto& w : st.peers.workers)
        st.core->join(w.first);
    },
    [self](const envelope& e) {
      if (!handle_any<msg::GenerateRequest, msg::AbortRollouts, msg::RolloutEvent,
                      msg::RoleStateQuery, msg::RoleStateRestore>(e, self->state.me,
                                                                  [self](auto r) { on(self, r); }))
        log_unhandled(e, self->state.me);
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      if (who.role == role::rollout_worker)
        carry_out(self, self->state.core->worker_lost(who.name(), why));
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_scheduler(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(scheduler_actor, ctx);
}

} // namespace sorl
