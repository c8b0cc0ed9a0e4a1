#include "actors/sagc/controller_actor.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/sagc/group_policy.hpp"
#include "actors/sagc/timing.hpp"
#include "messages/rollout.capnp.h"
#include "messages/train.capnp.h"

namespace sorl {

namespace {

struct controller_state {
  static inline const char* name = "sorl.sagc_controller";
  std::string me;
  std::unique_ptr<sagc::rollout_timing> timing;
  std::unique_ptr<sagc::group_policy> policy;
};

using controller_actor_t = caf::stateful_actor<controller_state>;

caf::behavior controller_actor(controller_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  sagc::straggler_rule_options rule;
  rule.kappa = ctx.config->sagc.kappa;
  rule.window = static_cast<size_t>(ctx.config->sagc.window);
  rule.min_samples = std::min<size_t>(rule.min_samples, rule.window);
  st.timing = std::make_unique<sagc::rollout_timing>(rule);
  if (ctx.config->sagc.policy != "static")
    spdlog::warn("{}: sagc.policy = \"{}\" is not built yet; using the static policy",
                 st.me, ctx.config->sagc.policy);
  st.policy = std::make_unique<sagc::static_group_policy>(ctx.config->sagc.group_size);
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
            st.timing->observe(t);
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
            st.policy->observe(t);
            auto reply = build_envelope<msg::StepTiming>([&](msg::StepTiming::Builder b) {
              b.setStep(q.getStep());
              b.setRollouts(static_cast<uint32_t>(t.finished));
              b.setDurationP50Ns(t.duration_p50_ns);
              b.setDurationP90Ns(t.duration_p90_ns);
              b.setDurationMaxNs(t.duration_max_ns);
              b.setStragglers(static_cast<uint32_t>(t.stragglers.size()));
              b.setStragglerEvent(t.straggler_event);
              b.setThresholdNs(t.threshold_ns ? static_cast<int64_t>(*t.threshold_ns) : 0);
            });
            self->send(caf::actor_cast<caf::actor>(self->current_sender()), reply);
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
