// The learner's actor shell: every decision is the learner service's
// (actors/learner/learner_service.hpp). This file only decodes each message through its
// protocol's codec (actors/trainer/train_wire.hpp, actors/rollout/rollout_wire.hpp,
// actors/sync/sync_wire.hpp), calls the service and sends what it returns.

#include "actors/learner/learner_actor.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/learner/learner_service.hpp"
#include "actors/rollout/rollout_wire.hpp"
#include "actors/sync/sync_wire.hpp"
#include "actors/trainer/train_wire.hpp"

namespace sorl {

namespace {

namespace ev = trainer::ev;
using trainer::from_msg;
using trainer::to_msg;

/// The learner's peers, from the roster.
struct learner_peers {
  caf::actor trainer;
  caf::actor publisher; ///< the sync publisher
};

learner_peers learner_peers_from(const std::vector<peer_info>& roster) {
  return {single_peer(roster, role::trainer), single_peer(roster, role::sync_publisher)};
}

struct learner_state {
  static inline const char* name = "sorl.learner";
  std::string me;
  caf::actor directory;
  learner_peers peers;
  std::unique_ptr<learner::learner_service> service;
};

using learner_actor_t = caf::stateful_actor<learner_state>;

/// The current weights for the sync publisher.
void publish(learner_actor_t* self) {
  auto& st = self->state;
  self->send(st.peers.publisher, sync::encode_snapshot(st.service->snapshot()));
}

ev::train_result result_of(const learner::train_outcome& r) {
  ev::train_result x{r.version, {}, {}, r.ok, r.reason};
  for (const auto& [name, value] : r.metrics) {
    x.metric_names.emplace_back(name);
    x.metric_values.push_back(value);
  }
  return x;
}

caf::behavior learner_actor(learner_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.directory = ctx.directory;
  st.service = std::make_unique<learner::learner_service>(*ctx.config, st.me);
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.peers = learner_peers_from(roster);
      try {
        auto loaded = st.service->load_policy();
        publish(self);
        self->send(st.peers.trainer, to_msg(ev::learner_ready{st.service->version(),
                                                                loaded.resumed, loaded.source,
                                                                loaded.trainer_state}));
      } catch (const std::exception& ex) {
        fail_job(st.directory, st.me, fmt::format("cannot load the policy: {}", ex.what()));
      }
    },
    [self](const envelope& e) {
      auto& st = self->state;
      auto& svc = *st.service;
      if (handle_as<msg::Trajectory>(e, st.me,
                                     [&](auto t) { svc.keep(rollout::from_msg(t)); }))
        return;
      if (handle_as<msg::TrainBatch>(e, st.me, [&](msg::TrainBatch::Reader r) {
            auto batch = from_msg(r);
            auto result = svc.train(batch.step, batch.request_ids);
            // The result first: the trainer then usually hears of the step before the version.
            self->send(st.peers.trainer, to_msg(result_of(result), result.step));
            if (result.ok)
              publish(self);
          }))
        return;
      if (handle_as<msg::EvalRequest>(e, st.me, [&](msg::EvalRequest::Reader r) {
            auto req = from_msg(r);
            ml::eval_report rep;
            try {
              rep = svc.evaluate(req.count);
            } catch (const std::exception& ex) {
              fail_job(st.directory, st.me, fmt::format("evaluation failed: {}", ex.what()));
              return;
            }
            self->send(st.peers.trainer,
                       to_msg(ev::eval_result{req.tag, static_cast<uint32_t>(rep.count),
                                              rep.accuracy, rep.mean_reward,
                                              rep.mean_response_tokens, rep.seconds,
                                              static_cast<uint32_t>(rep.reward_failures)}));
          }))
        return;
      if (handle_as<msg::CheckpointRequest>(e, st.me, [&](msg::CheckpointRequest::Reader r) {
            auto req = from_msg(r);
            auto saved = svc.save_checkpoint(req.trainer_state);
            self->send(st.peers.trainer, to_msg(ev::checkpoint_done{
                                           req.step, saved.path, saved.error.empty(), saved.error}));
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      spdlog::debug("{}: peer down: {} ({})", self->state.me, who.name(), why);
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_learner(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn<caf::detached>(learner_actor, ctx);
}

} // namespace sorl
