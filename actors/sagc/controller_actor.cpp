#include "actors/sagc/controller_actor.hpp"

#include <map>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/sagc/controller_state.hpp"
#include "actors/sagc/group_policy.hpp"
#include "actors/sagc/timing.hpp"
#include "actors/trainer/train_wire.hpp"
#include "messages/rollout.capnp.h"
#include "messages/train.capnp.h"

namespace sorl {

namespace {

struct controller_state {
  static inline const char* name = "sorl.sagc_controller";
  std::string me;
  std::unique_ptr<sagc::rollout_timing> timing;
  std::unique_ptr<sagc::group_policy> policy;
  /// Rollouts flagged as stragglers from their chunk messages while still running, by step.
  /// Cleared when the step closes.
  std::map<int64_t, std::set<uint64_t>> flagged;
};

using controller_actor_t = caf::stateful_actor<controller_state>;

caf::behavior controller_actor(controller_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.timing = std::make_unique<sagc::rollout_timing>(sagc::straggler_rule_from(*ctx.config));
  st.policy = sagc::make_group_policy(sagc::group_policy_options_from(*ctx.config));
  return {
    [](roster_atom, const std::vector<peer_info>&) {},
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::RolloutEvent>(e, st.me, [&](msg::RolloutEvent::Reader ev) {
            sagc::timing_event t;
            t.request_id = ev.getRequestId();
            t.step = static_cast<int64_t>(ev.getStep());
            t.group_id = ev.getGroupId();
            switch (ev.getKind()) {
              case msg::EventKind::START:
                t.kind = sagc::timing_kind::start;
                break;
              case msg::EventKind::CHUNK:
                t.kind = sagc::timing_kind::chunk;
                break;
              case msg::EventKind::FINISH:
                t.kind = ev.getFinishReason() == msg::FinishReason::ABORT
                           ? sagc::timing_kind::abort
                           : sagc::timing_kind::finish;
                break;
            }
            t.worker_ns = ev.getWorkerNs();
            t.tokens = ev.getTokens();
            t.worker = ev.getWorker();
            if (!st.timing->observe(t) || t.kind != sagc::timing_kind::chunk)
              return;
            // The chunk's own timestamp is the worker's "now": no clocks are compared.
            for (const auto& f : st.timing->in_flight_stragglers(t.step)) {
              if (st.flagged[t.step].insert(f.request_id).second)
                spdlog::debug("{}: step {}: rollout {} on {} is a straggler in flight "
                              "({:.2f} s, {} tokens)",
                              st.me, t.step, f.request_id, f.worker, f.elapsed_ns / 1e9,
                              f.tokens);
            }
          }))
        return;
      if (handle_as<msg::GroupSizeQuery>(e, st.me, [&](msg::GroupSizeQuery::Reader q) {
            auto d = st.policy->decide(static_cast<int64_t>(q.getStep()));
            spdlog::debug("{}: step {}: G = {} ({})", st.me, d.step, d.group_size, d.reason);
            auto reply = build_envelope<msg::GroupSizeDecision>(
              [&](msg::GroupSizeDecision::Builder b) {
                b.setStep(q.getStep());
                b.setGroupSize(static_cast<uint32_t>(d.group_size));
                b.setReason(d.policy + ": " + d.reason);
                b.setPolicy(d.policy);
                b.setVirtualQueue(d.virtual_queue);
                b.setPStraggler(d.p_straggler);
                b.setUtility(d.utility);
                b.setDeadlineNs(d.deadline_ns.value_or(0));
                b.setMinFinished(static_cast<uint32_t>(d.min_finished));
              });
            self->send(caf::actor_cast<caf::actor>(self->current_sender()), reply);
          }))
        return;
      if (handle_as<msg::StepTimingQuery>(e, st.me, [&](msg::StepTimingQuery::Reader q) {
            sagc::step_timing t;
            try {
              t = st.timing->close_step(static_cast<int64_t>(q.getStep()));
            } catch (const std::exception& ex) {
              spdlog::warn("{}: step {}: {}", st.me, q.getStep(), ex.what());
              t = st.timing->summary(static_cast<int64_t>(q.getStep()));
            }
            st.policy->observe(t, st.timing->rule());
            auto step = static_cast<int64_t>(q.getStep());
            uint32_t flagged = 0;
            for (auto it = st.flagged.begin(); it != st.flagged.end();) {
              if (it->first == step)
                flagged = static_cast<uint32_t>(it->second.size());
              it = it->first <= step ? st.flagged.erase(it) : std::next(it);
            }
            auto reply = build_envelope<msg::StepTiming>([&](msg::StepTiming::Builder b) {
              b.setStep(q.getStep());
              b.setRollouts(static_cast<uint32_t>(t.finished));
              b.setDurationP50Ns(t.duration_p50_ns);
              b.setDurationP90Ns(t.duration_p90_ns);
              b.setDurationMaxNs(t.duration_max_ns);
              b.setStragglers(static_cast<uint32_t>(t.stragglers.size()));
              b.setStragglerEvent(t.straggler_event);
              b.setThresholdNs(t.threshold_ns ? static_cast<int64_t>(*t.threshold_ns) : 0);
              b.setFlaggedInFlight(flagged);
              b.setAborted(static_cast<uint32_t>(t.aborted));
              b.setRolloutsTimed(static_cast<uint32_t>(t.timed));
            });
            self->send(caf::actor_cast<caf::actor>(self->current_sender()), reply);
          }))
        return;
      if (handle_as<msg::RoleStateQuery>(e, st.me, [&](msg::RoleStateQuery::Reader q) {
            self->send(caf::actor_cast<caf::actor>(self->current_sender()),
                       trainer::to_msg(trainer::ev::role_state{
                         q.getStep(), role::sagc_controller,
                         sagc::save_controller_state(*st.timing, *st.policy), true, ""}));
          }))
        return;
      if (handle_as<msg::RoleStateRestore>(e, st.me, [&](msg::RoleStateRestore::Reader r) {
            std::string why;
            bool ok = true;
            try {
              why = sagc::restore_controller_state(r.getState().cStr(), *st.timing, *st.policy);
              spdlog::info("{}: restored from {}: virtual queue {}, window {} durations", st.me,
                           r.getSource().cStr(), st.policy->memory().virtual_queue,
                           st.timing->rule().samples());
            } catch (const std::exception& ex) {
              ok = false;
              why = ex.what();
            }
            self->send(caf::actor_cast<caf::actor>(self->current_sender()),
                       trainer::to_msg(
                         trainer::ev::role_state_restored{role::sagc_controller, ok, why}));
          }))
        return;
      log_unhandled(e, st.me);
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
