#include "actors/rollout/worker_actor.hpp"

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/rollout/rollout_wire.hpp"
#include "actors/rollout/worker_core.hpp"
#include "actors/sync/sync_wire.hpp"
#include "actors/sync/weight_receiver.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"

namespace sorl {

namespace {

constexpr uint64_t no_version = sync::weight_receiver::no_version;

struct worker_state {
  static inline const char* name = "sorl.rollout_worker";
  std::unique_ptr<rollout::worker_core> core;
  /// Receives versions into the model's bf16 parameters.
  std::unique_ptr<sync::weight_receiver> weights;
  bool ticking = false;
  caf::actor trainer;
  caf::actor scheduler;
  caf::actor sagc;
  caf::actor publisher;
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
    self->send(st.publisher, sync::encode_ack(*r.ack, st.me));
}

/// Sends the core's pending timing events to the controller and the scheduler, stamped
/// with the worker's load after them; start events also to the trainer, whose rollout-phase
/// watchdog names the worker of each rollout it still waits for.
void send_events(worker_actor_t* self) {
  auto& st = self->state;
  auto in_flight = static_cast<uint32_t>(st.core->in_flight());
  auto events = st.core->take_events();
  // Logged before the events leave: a request counted here has sent no finish event yet,
  // so the last such line bounds from below what the scheduler still sees in flight here.
  if (!events.empty())
    spdlog::debug("{}: holds {} requests", st.me, in_flight);
  for (auto& ev : events) {
    auto env = rollout::to_msg(ev, st.me, in_flight);
    self->send(st.sagc, env);
    self->send(st.scheduler, env);
    if (ev.kind == rollout::event_kind::start)
      self->send(st.trainer, env);
  }
}

void send_results(worker_actor_t* self, const std::vector<rollout::rollout_result>& results) {
  auto& st = self->state;
  send_events(self);
  for (auto& r : results)
    self->send(st.trainer, rollout::to_msg(r, st.me, st.weights->version()));
}

void pump(worker_actor_t* self) {
  send_results(self, self->state.core->step());
}

void start_ticking(worker_actor_t* self) {
  if (!self->state.ticking) {
    self->state.ticking = true;
    self->send(self, tick_atom::value);
  }
}

caf::behavior worker_actor(worker_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.core = std::make_unique<rollout::worker_core>(model_dims_from(*ctx.config),
                                                   make_task_from(*ctx.config),
                                                   rollout::worker_options_from(*ctx.config));
  std::vector<sync::tensor_meta> expected;
  std::vector<sync::delta_target> targets; // tensor id = index in model order
  for (const auto& [name, t] : st.core->model().parameters()) {
    sync::tensor_meta m;
    m.name = name;
    m.shape.assign(t.sizes().begin(), t.sizes().end());
    m.dtype = sync::weight_dtype::bf16;
    expected.push_back(std::move(m));
    if (t.scalar_type() != at::kBFloat16 || !t.is_contiguous())
      throw std::logic_error(fmt::format("rollout parameter \"{}\" is not contiguous bf16", name));
    targets.push_back({static_cast<uint32_t>(targets.size()),
                       reinterpret_cast<uint16_t*>(t.data_ptr()),
                       static_cast<uint64_t>(t.numel())});
  }
  st.weights = std::make_unique<sync::weight_receiver>(st.me, std::move(expected),
                                                       std::move(targets), steady_now_ns);
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.trainer = single_peer(roster, role::trainer);
      st.scheduler = single_peer(roster, role::scheduler);
      st.sagc = single_peer(roster, role::sagc_controller);
      st.publisher = single_peer(roster, role::sync_publisher);
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::GenerateRequest>(e, st.me, [&](msg::GenerateRequest::Reader r) {
            const auto req = rollout::from_msg(r);
            // A request is never dropped: what cannot be served goes back to the trainer as a
            // failed rollout, so that the step completes without it.
            try {
              auto held = st.weights->version();
              if (req.weight_version != held) {
                auto why = held == no_version
                             ? fmt::format("the worker holds no weights yet, the request wants "
                                           "version {}",
                                           req.weight_version)
                             : fmt::format("the worker holds weights version {}, the request "
                                           "wants version {}",
                                           held, req.weight_version);
                spdlog::warn("{}: request {}: {}", st.me, req.request_id, why);
                st.core->reject(req, why);
              } else {
                st.core->enqueue(req);
              }
            } catch (const std::exception& ex) {
              // Only a request id already held: the rollout in flight answers for it.
              spdlog::error("{}: cannot take request {}: {}", st.me, req.request_id, ex.what());
              return;
            }
            start_ticking(self);
          }))
        return;
      if (handle_as<msg::AbortRollouts>(e, st.me, [&](msg::AbortRollouts::Reader a) {
            const auto req = rollout::from_msg(a);
            auto aborted = st.core->abort(req.request_ids);
            send_events(self); // only finish events: aborted rollouts never reach the loss
            spdlog::debug("{}: step {}: aborted {} rollout(s) ({}); {} KV blocks in use", st.me,
                          req.step, aborted.size(), req.reason, st.core->kv_blocks_in_use());
            if (st.core->idle())
              carry_out(self, st.weights->on_idle());
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
      log_unhandled(e, st.me);
    },
    [self](tick_atom) {
      auto& st = self->state;
      try {
        pump(self);
      } catch (const std::exception& ex) {
        // The generator's state is unknown now: every rollout held goes back as failed (the
        // step completes without them), then the worker leaves and the scheduler places new
        // requests elsewhere.
        spdlog::critical("{}: decoding failed: {}", st.me, ex.what());
        auto lost = st.core->abort_all();
        for (auto& r : lost) {
          if (r.finish != ml::finish_reason::abort || r.status != rollout::rollout_status::ok)
            continue; // finished (or failed) before the error: sent as it is
          r.status = rollout::rollout_status::failed;
          r.failure = std::string{"decoding failed on "} + st.me + ": " + ex.what();
          r.reward_reason = r.failure;
        }
        send_results(self, lost);
        self->quit(caf::make_error(caf::sec::runtime_error, std::string{ex.what()}));
        return;
      }
      if (st.core->idle()) {
        st.ticking = false;
        carry_out(self, st.weights->on_idle());
      } else
        self->send(self, tick_atom::value); // behind whatever arrived meanwhile
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      spdlog::warn("{}: peer down: {} ({})", self->state.me, who.name(), why);
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
