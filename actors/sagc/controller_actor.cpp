#include "actors/sagc/controller_actor.hpp"

#include <optional>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/sagc/controller_core.hpp"
#include "actors/sagc/sagc_wire.hpp"

namespace sorl {

namespace {

struct controller_state {
  static inline const char* name = "sorl.sagc_controller";
  std::string me;
  std::optional<sagc::controller_core> core;
};

using controller_actor_t = caf::stateful_actor<controller_state>;

caf::behavior controller_actor(controller_actor_t* self, role_context ctx) {
  self->state.me = ctx.name();
  self->state.core.emplace(sagc::straggler_rule_from(*ctx.config),
                           sagc::group_policy_options_from(*ctx.config));
  // Every message the controller sends answers the one being handled: it has no peers.
  auto reply = [self](envelope m) {
    self->send(caf::actor_cast<caf::actor>(self->current_sender()), std::move(m));
  };
  return {
    [](roster_atom, const std::vector<peer_info>&) {},
    [self, reply](const envelope& e) {
      auto& me = self->state.me;
      auto& core = *self->state.core;
      if (handle_as<msg::RolloutEvent>(e, me, [&](msg::RolloutEvent::Reader r) {
            const auto t = sagc::timing_event_of(rollout::from_msg(r));
            for (const auto& f : core.observe(t))
              spdlog::debug("{}: step {}: rollout {} on {} is a straggler in flight "
                            "({:.2f} s, {} tokens)",
                            me, t.step, f.request_id, f.worker, f.elapsed_ns / 1e9, f.tokens);
          }))
        return;
      if (handle_as<msg::GroupSizeQuery>(e, me, [&](msg::GroupSizeQuery::Reader q) {
            const auto d = core.decide(static_cast<int64_t>(trainer::from_msg(q).step));
            spdlog::debug("{}: step {}: G = {} ({})", me, d.step, d.group_size, d.reason);
            reply(trainer::to_msg(sagc::decision_message(d)));
          }))
        return;
      if (handle_as<msg::StepTimingQuery>(e, me, [&](msg::StepTimingQuery::Reader q) {
            const auto step = trainer::from_msg(q).step;
            const auto report = core.step_timing(static_cast<int64_t>(step));
            if (!report.warning.empty())
              spdlog::warn("{}: step {}: {}", me, step, report.warning);
            reply(trainer::to_msg(sagc::step_timing_message(report)));
          }))
        return;
      if (handle_as<msg::RoleStateQuery>(e, me, [&](msg::RoleStateQuery::Reader q) {
            reply(trainer::to_msg(trainer::ev::role_state{
              trainer::from_msg(q).step, role::sagc_controller, core.save(), true, ""}));
          }))
        return;
      if (handle_as<msg::RoleStateRestore>(e, me, [&](msg::RoleStateRestore::Reader r) {
            const auto c = trainer::from_msg(r);
            trainer::ev::role_state_restored done{role::sagc_controller, true, ""};
            try {
              done.reason = core.restore(c.state);
              spdlog::info("{}: restored from {}: virtual queue {}, window {} durations", me,
                           c.source, core.policy().memory().virtual_queue,
                           core.timing().rule().samples());
            } catch (const std::exception& ex) {
              done = {role::sagc_controller, false, ex.what()};
            }
            reply(trainer::to_msg(done));
          }))
        return;
      log_unhandled(e, me);
    },
    [](peer_down_atom, const peer_info&, const std::string&) {},
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_sagc_controller(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(controller_actor, ctx);
}

} // namespace sorl
