#include "actors/rollout/worker_actor.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/rollout/request_sampling.hpp"
#include "actors/rollout/worker_core.hpp"
#include "actors/sync/delta_receiver.hpp"
#include "actors/sync/weight_sync.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"

namespace sorl {

namespace {

constexpr uint64_t no_version = ~uint64_t{0};

/// A complete, checked version waiting for the worker to be idle.
enum class pending_apply { none, full, delta };

struct worker_state {
  static inline const char* name = "sorl.rollout_worker";
  std::unique_ptr<rollout::worker_core> core;
  sync::weight_assembler assembler;
  sync::delta_receiver receiver;
  /// The model's bf16 parameters as delta targets, in model order (tensor id = index).
  std::vector<sync::delta_target> targets;
  int64_t version_started_ns = 0;
  pending_apply pending = pending_apply::none;
  uint64_t pending_hash = 0; ///< full versions: the hash verify() computed
  std::vector<sync::tensor_meta> expected;
  uint64_t version = no_version;
  bool ticking = false;
  caf::actor trainer;
  caf::actor scheduler;
  caf::actor sagc;
  caf::actor publisher;
  std::string me;
};

msg::FinishReason to_msg(ml::finish_reason r) {
  switch (r) {
    case ml::finish_reason::eos:
      return msg::FinishReason::EOS;
    case ml::finish_reason::length:
      return msg::FinishReason::LENGTH;
    case ml::finish_reason::stop:
      return msg::FinishReason::STOP;
    case ml::finish_reason::abort:
      return msg::FinishReason::ABORT;
  }
  return msg::FinishReason::ABORT;
}

envelope encode_event(const rollout::rollout_event& ev, const std::string& worker,
                      uint32_t in_flight) {
  return build_envelope<msg::RolloutEvent>([&](msg::RolloutEvent::Builder b) {
    b.setRequestId(ev.request_id);
    b.setStep(ev.step);
    b.setGroupId(ev.group_id);
    b.setKind(ev.kind == rollout::event_kind::start   ? msg::EventKind::START
              : ev.kind == rollout::event_kind::chunk ? msg::EventKind::CHUNK
                                                      : msg::EventKind::FINISH);
    b.setWorkerNs(ev.ns);
    b.setTokens(ev.tokens);
    b.setWorker(worker);
    b.setFinishReason(to_msg(ev.reason));
    b.setInFlight(in_flight);
  });
}

envelope encode_trajectory(const rollout::rollout_result& r, const std::string& worker,
                           uint64_t version) {
  return build_envelope<msg::Trajectory>([&](msg::Trajectory::Builder b) {
    b.setRequestId(r.request.request_id);
    b.setStep(r.request.step);
    b.setGroupId(r.request.group_id);
    b.setSampleIndex(r.request.sample_index);
    auto prompt = b.initPromptTokens(static_cast<unsigned>(r.prompt.size()));
    for (size_t i = 0; i < r.prompt.size(); ++i)
      prompt.set(static_cast<unsigned>(i), r.prompt[i]);
    auto resp = b.initResponseTokens(static_cast<unsigned>(r.response.size()));
    for (size_t i = 0; i < r.response.size(); ++i)
      resp.set(static_cast<unsigned>(i), r.response[i]);
    b.setLossMask(kj::arrayPtr(r.loss_mask.data(), r.loss_mask.size()));
    auto lp = b.initSamplingLogprobs(static_cast<unsigned>(r.logprobs.size()));
    for (size_t i = 0; i < r.logprobs.size(); ++i)
      lp.set(static_cast<unsigned>(i), r.logprobs[i]);
    b.setReward(static_cast<float>(r.reward));
    b.setRewardReason(r.reward_reason);
    b.setFinishReason(to_msg(r.finish));
    b.setTurns(r.turns);
    b.setStartNs(r.start_ns);
    b.setEndNs(r.end_ns);
    b.setWeightVersion(version);
    b.setWorker(worker);
    b.setStatus(r.status == rollout::rollout_status::ok       ? msg::RolloutStatus::OK
                : r.status == rollout::rollout_status::failed ? msg::RolloutStatus::FAILED
                                                               : msg::RolloutStatus::REWARD_FAILED);
    b.setFailure(r.failure);
    b.setReplacedFrom(r.request.replaced_from);
  });
}

using worker_actor_t = caf::stateful_actor<worker_state>;

void send_ack(worker_actor_t* self, uint64_t version, bool ok, uint64_t hash,
              const std::string& reason, bool full) {
  auto ack = build_envelope<msg::WeightAck>([&](msg::WeightAck::Builder b) {
    b.setVersion(version);
    b.setWorker(self->state.me);
    b.setOk(ok);
    b.setModelHash(hash);
    b.setReason(reason);
    b.setApplyNs(steady_now_ns() - self->state.version_started_ns);
    b.setFull(full);
  });
  if (!ok)
    spdlog::error("{}: version {} not applied: {}", self->state.me, version, reason);
  self->send(self->state.publisher, ack);
}

/// Copies a verified version into the model; only called when no rollout is in flight.
void apply_version(worker_actor_t* self) {
  auto& st = self->state;
  c10::InferenceMode guard;
  const auto& params = st.core->model().parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    auto& dst = params[i].second;
    auto& bytes = st.assembler.staged(i);
    auto src = at::from_blob(const_cast<uint8_t*>(bytes.data()), dst.sizes(),
                             at::TensorOptions().dtype(dst.scalar_type()));
    dst.copy_(src);
  }
  st.core->weights_changed();
}

/// Applies a complete version once no rollout is in flight. A version can overtake the
/// abort of the previous step's stragglers (they come from different actors), so a busy
/// worker holds it until its last rollout ends instead of refusing it.
void maybe_apply(worker_actor_t* self) {
  auto& st = self->state;
  if (st.pending == pending_apply::none || !st.core->idle())
    return;
  auto kind = st.pending;
  st.pending = pending_apply::none;
  if (kind == pending_apply::full) {
    apply_version(self);
    st.version = st.assembler.version();
    st.assembler.reset();
    send_ack(self, st.version, true, st.pending_hash, "", true);
    return;
  }
  auto version = st.receiver.version();
  uint64_t hash = 0;
  std::optional<std::string> err;
  {
    c10::InferenceMode guard;
    err = st.receiver.apply(st.targets, &hash);
  }
  st.receiver.reset();
  st.core->weights_changed();
  if (err) {
    st.version = no_version; // the weights are now of unknown version until a full sync
    send_ack(self, version, false, hash, *err, false);
    return;
  }
  st.version = version;
  send_ack(self, version, true, hash, "", false);
}

/// One bucket of a sparse version: checked now, applied with the others when all are in.
void on_delta_bucket(worker_actor_t* self, uint64_t version, uint32_t index,
                     capnp::Data::Reader delta) {
  auto& st = self->state;
  if (auto err = st.receiver.add_bucket(version, index, delta.begin(), delta.size(),
                                        st.targets)) {
    if (st.receiver.active() && st.receiver.version() == version) {
      st.receiver.reset();
      send_ack(self, version, false, 0, *err, false);
    } else {
      spdlog::warn("{}: {}", st.me, *err); // a version already refused or abandoned
    }
    return;
  }
  if (!st.receiver.complete())
    return;
  st.pending = pending_apply::delta;
  maybe_apply(self);
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
    auto env = encode_event(ev, st.me, in_flight);
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
    self->send(st.trainer, encode_trajectory(r, st.me, st.version));
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
  for (const auto& [name, t] : st.core->model().parameters()) {
    sync::tensor_meta m;
    m.name = name;
    m.shape.assign(t.sizes().begin(), t.sizes().end());
    m.dtype = sync::weight_dtype::bf16;
    st.expected.push_back(std::move(m));
    if (t.scalar_type() != at::kBFloat16 || !t.is_contiguous())
      throw std::logic_error(fmt::format("rollout parameter \"{}\" is not contiguous bf16", name));
    sync::delta_target target;
    target.tensor = static_cast<uint32_t>(st.targets.size());
    target.bits = reinterpret_cast<uint16_t*>(t.data_ptr());
    target.elements = static_cast<uint64_t>(t.numel());
    st.targets.push_back(target);
  }
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.trainer = single_peer(roster, "trainer");
      st.scheduler = single_peer(roster, "scheduler");
      st.sagc = single_peer(roster, "sagc_controller");
      st.publisher = single_peer(roster, "sync_publisher");
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::GenerateRequest>(e, st.me, [&](msg::GenerateRequest::Reader r) {
            rollout::rollout_request req;
            req.request_id = r.getRequestId();
            req.step = r.getStep();
            req.group_id = r.getGroupId();
            req.sample_index = r.getSampleIndex();
            req.split = r.getSplit() == msg::TaskSplit::EVAL ? ml::task_split::eval
                                                              : ml::task_split::train;
            req.task_index = r.getTaskIndex();
            req.seed = r.getSeed();
            req.weight_version = r.getWeightVersion();
            req.max_new_tokens = r.getMaxNewTokens();
            const auto sampling = rollout::read_sampling(r);
            req.temperature = sampling.temperature;
            req.top_p = sampling.top_p;
            req.top_k = sampling.top_k;
            req.replaced_from = r.getReplacedFrom();
            // A request is never dropped: what cannot be served goes back to the trainer as a
            // failed rollout, so that the step completes without it.
            try {
              if (req.weight_version != st.version) {
                auto why = st.version == no_version
                             ? fmt::format("the worker holds no weights yet, the request wants "
                                           "version {}",
                                           req.weight_version)
                             : fmt::format("the worker holds weights version {}, the request "
                                           "wants version {}",
                                           st.version, req.weight_version);
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
            std::vector<uint64_t> ids;
            for (auto id : a.getRequestIds())
              ids.push_back(id);
            auto aborted = st.core->abort(ids);
            send_events(self); // only finish events: aborted rollouts never reach the loss
            spdlog::debug("{}: step {}: aborted {} rollout(s) ({}); {} KV blocks in use", st.me,
                          a.getStep(), aborted.size(), a.getReason().cStr(),
                          st.core->kv_blocks_in_use());
            maybe_apply(self);
          }))
        return;
      if (handle_as<msg::WeightVersion>(e, st.me, [&](msg::WeightVersion::Reader v) {
            std::vector<sync::tensor_meta> header;
            for (auto t : v.getTensors()) {
              sync::tensor_meta m;
              m.name = t.getName();
              for (auto d : t.getShape())
                m.shape.push_back(d);
              m.dtype = t.getDtype() == msg::WeightDtype::BF16 ? sync::weight_dtype::bf16
                                                               : sync::weight_dtype::fp32;
              m.hash = t.getHash();
              header.push_back(std::move(m));
            }
            st.version_started_ns = steady_now_ns();
            st.pending = pending_apply::none;
            st.assembler.reset();
            st.receiver.reset();
            if (v.getFull()) {
              if (auto err = st.assembler.begin(v.getVersion(), header, v.getModelHash(),
                                                v.getBucketCount(), st.expected))
                send_ack(self, v.getVersion(), false, 0, *err, true);
              return;
            }
            std::optional<uint64_t> held;
            if (st.version != no_version)
              held = st.version;
            if (auto err = st.receiver.begin(v.getVersion(), v.getBaseVersion(), held, header,
                                             v.getModelHash(), v.getBucketCount(),
                                             st.expected))
              send_ack(self, v.getVersion(), false, 0, *err, false);
          }))
        return;
      if (handle_as<msg::WeightBucket>(e, st.me, [&](msg::WeightBucket::Reader b) {
            auto version = b.getVersion();
            if (b.hasDelta() && b.getDelta().size() > 0) {
              on_delta_bucket(self, version, b.getIndex(), b.getDelta());
              return;
            }
            std::vector<sync::chunk_view> chunks;
            for (auto c : b.getChunks()) {
              auto data = c.getData();
              chunks.push_back({c.getTensor(), c.getOffset(), data.begin(), data.size()});
            }
            if (auto err = st.assembler.add_bucket(version, b.getIndex(), chunks,
                                                   b.getChecksum())) {
              st.assembler.reset();
              send_ack(self, version, false, 0, *err, true);
              return;
            }
            if (!st.assembler.complete())
              return;
            uint64_t hash = 0;
            if (auto err = st.assembler.verify(&hash)) {
              st.assembler.reset();
              send_ack(self, version, false, hash, *err, true);
              return;
            }
            st.pending = pending_apply::full;
            st.pending_hash = hash;
            maybe_apply(self);
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
        maybe_apply(self);
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
