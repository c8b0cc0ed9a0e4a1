#include "actors/rollout/worker_actor.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/rollout/rollout_wire.hpp"
#include "actors/rollout/worker_serving.hpp"
#include "actors/suffix_index/keeper_core.hpp"
#include "actors/suffix_index/suffix_wire.hpp"
#include "actors/sync/sync_wire.hpp"
#include "actors/sync/weight_receiver.hpp"

namespace sorl {

namespace {

/// The worker's peers, by role.
struct worker_peers {
  caf::actor trainer, scheduler, sagc, publisher;
  caf::actor keeper; ///< the suffix-index keeper; optional, invalid when absent or gone

  static worker_peers from(const std::vector<peer_info>& roster) {
    return {single_peer(roster, role::trainer), single_peer(roster, role::scheduler),
            single_peer(roster, role::sagc_controller), single_peer(roster, role::sync_publisher),
            single_peer(roster, role::suffix_index_keeper)};
  }
  const caf::actor& of(rollout::event_peer p) const {
    return p == rollout::event_peer::trainer ? trainer
           : p == rollout::event_peer::scheduler ? scheduler : sagc;
  }
};

struct worker_state {
  static inline const char* name = "sorl.rollout_worker";
  std::unique_ptr<rollout::worker_core> core;
  std::unique_ptr<sync::weight_receiver> weights; ///< writes versions into core->model()
  bool ticking = false;
  worker_peers peers;
  std::string me;
};

using worker_actor_t = caf::stateful_actor<worker_state>;

/// Does what the weight receiver asked, in its order.
void carry_out(worker_actor_t* self, const sync::weight_receiver::result& r) {
  auto& st = self->state;
  if (r.weights_changed)
    st.core->weights_changed();
  sync::write_logs(r.logs);
  if (r.ack)
    self->send(st.peers.publisher, sync::encode_ack(*r.ack, st.me));
}

/// An idle worker applies the version that waited for its last rollout.
void settle(worker_actor_t* self) {
  if (self->state.core->idle())
    carry_out(self, self->state.weights->on_idle());
}

/// Sends the core's pending timing events where event_destinations says, stamped with the
/// load after them, then `results` to the trainer.
void send_out(worker_actor_t* self, const std::vector<rollout::rollout_result>& results = {}) {
  auto& st = self->state;
  auto in_flight = static_cast<uint32_t>(st.core->in_flight());
  auto events = st.core->take_events();
  // Logged before the events leave: a request counted here has sent no finish event yet,
  // so the last such line bounds from below what the scheduler still sees in flight here.
  if (!events.empty())
    spdlog::debug("{}: holds {} requests", st.me, in_flight);
  for (auto& ev : events) {
    auto env = rollout::to_msg(ev, st.me, in_flight);
    for (auto to : rollout::event_destinations(ev.kind))
      self->send(st.peers.of(to), env);
  }
  for (auto& r : results)
    self->send(st.peers.trainer, rollout::to_msg(r, st.me, st.weights->version()));
}

/// Sends the turns the core finished since the last call to the suffix-index keeper, in
/// messages within its bounds. Taken even without a keeper, so that they do not pile up.
void share_finished_turns(worker_actor_t* self) {
  auto& st = self->state;
  auto turns = st.core->take_finished_turns();
  if (turns.empty() || !st.peers.keeper)
    return;
  size_t left_out = 0;
  for (auto& batch : suffix_index::split_for_keeper(std::move(turns), &left_out))
    self->send(st.peers.keeper, suffix_index::to_msg({st.me, std::move(batch)}));
  if (left_out > 0)
    spdlog::debug("{}: {} finished turns not shared (longer than {} tokens)", st.me, left_out,
                  suffix_index::max_response_tokens);
}

caf::behavior worker_actor(worker_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.core = std::make_unique<rollout::worker_core>(model_dims_from(*ctx.config),
                                                   make_task_from(*ctx.config),
                                                   rollout::worker_options_from(*ctx.config),
                                                   prompt_format_from(*ctx.config));
  auto layout = rollout::receiver_layout_of(st.core->sync_targets());
  st.weights = std::make_unique<sync::weight_receiver>(
    st.me, std::move(layout.expected), std::move(layout.targets), steady_now_ns);
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      self->state.peers = worker_peers::from(roster);
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::GenerateRequest>(e, st.me, [&](msg::GenerateRequest::Reader r) {
            const auto req = rollout::from_msg(r);
            const auto a = rollout::admit(*st.core, req, st.weights->version());
            if (!a.held)
              return spdlog::error("{}: cannot take request {}: {}", st.me, req.request_id, a.error);
            if (!a.refusal.empty())
              spdlog::warn("{}: request {}: {}", st.me, req.request_id, a.refusal);
            if (!std::exchange(st.ticking, true))
              self->send(self, tick_atom::value);
          }))
        return;
      if (handle_as<msg::AbortRollouts>(e, st.me, [&](msg::AbortRollouts::Reader a) {
            const auto req = rollout::from_msg(a);
            auto aborted = st.core->abort(req.request_ids);
            send_out(self); // only finish events: aborted rollouts never reach the loss
            spdlog::debug("{}: step {}: aborted {} rollout(s) ({}); {} KV blocks in use", st.me,
                          req.step, aborted.size(), req.reason, st.core->kv_blocks_in_use());
            settle(self);
          }))
        return;
      if (handle_as<msg::WeightVersion>(e, st.me, [&](msg::WeightVersion::Reader v) {
            carry_out(self, st.weights->on_header(sync::decode_version_header(v)));
          }))
        return;
      if (handle_as<msg::WeightBucket>(e, st.me, [&](msg::WeightBucket::Reader b) {
            carry_out(self, st.weights->on_bucket(sync::decode_bucket(b), st.core->idle()));
          }))
        return;
      if (handle_as<msg::SuffixResponses>(e, st.me, [&](msg::SuffixResponses::Reader r) {
            const auto m = suffix_index::from_msg(r);
            if (!st.core->drafting())
              return spdlog::debug("{}: {} responses from {} ignored: speculation is off", st.me,
                                   m.responses.size(), m.origin);
            const auto taken = st.core->add_peer_responses(m.responses);
            if (taken < m.responses.size())
              spdlog::warn("{}: skipped {} of {} responses from {} (empty or a token id outside "
                           "the vocabulary)",
                           st.me, m.responses.size() - taken, m.responses.size(), m.origin);
            spdlog::debug("{}: {} responses from {} into the global suffix tree", st.me, taken,
                          m.origin);
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](tick_atom) {
      auto& st = self->state;
      auto t = rollout::decode_tick(*st.core, st.me);
      for (const auto& line : st.core->take_log())
        spdlog::info("{}: {}", st.me, line);
      if (t.failure)
        spdlog::critical("{}: decoding failed: {}", st.me, *t.failure);
      send_out(self, t.results);
      share_finished_turns(self);
      if (t.failure) // the scheduler places new requests elsewhere
        return self->quit(caf::make_error(caf::sec::runtime_error, *t.failure));
      if (!st.core->idle())
        return self->send(self, tick_atom::value); // behind whatever arrived meanwhile
      st.ticking = false;
      settle(self);
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      spdlog::warn("{}: peer down: {} ({})", self->state.me, who.name(), why);
      if (who.role == role::suffix_index_keeper) // drafting goes on from the worker's own text
        self->state.peers.keeper = caf::actor{};
    },
    [self](shutdown_atom, bool, const std::string&) {
      self->state.core->abort_all();
      self->quit();
    },
  };
}

} // namespace

caf::actor spawn_rollout_worker(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn<caf::detached>(worker_actor, ctx);
}

} // namespace sorl
