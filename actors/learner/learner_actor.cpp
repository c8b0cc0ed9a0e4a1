#include "actors/learner/learner_actor.hpp"

#include <filesystem>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/learner/learner_core.hpp"
#include "actors/trainer/train_wire.hpp"
#include "actors/sync/weight_sync.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/metrics.hpp"
#include "runtime/ml/checkpoint.hpp"
#include "runtime/ml/evaluate.hpp"
#include "runtime/ml/tokenizer.hpp"

namespace sorl {

namespace {

namespace fs = std::filesystem;

struct learner_state {
  static inline const char* name = "sorl.learner";
  std::string me;
  const experiment_config* cfg = nullptr;
  caf::actor trainer;
  caf::actor publisher;
  caf::actor directory;
  std::unique_ptr<ml::policy_model> model;
  std::unique_ptr<learner::learner_core> core;
  ml::any_task task;
  int64_t step = 0;
};

using learner_actor_t = caf::stateful_actor<learner_state>;

/// XXH3 over every tensor's bytes in order: a fingerprint of exactly what is saved / loaded.
uint64_t fingerprint(const std::vector<ml::named_tensor>& tensors) {
  std::vector<uint64_t> hashes;
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().contiguous().cpu();
    hashes.push_back(sync::hash_bytes(c.data_ptr(), c.numel() * c.element_size()));
    hashes.push_back(sync::hash_bytes(name.data(), name.size()));
  }
  return sync::model_hash(hashes);
}

fs::path checkpoint_root(const experiment_config& cfg) {
  return fs::path{cfg.run.run_dir()} / "checkpoints";
}

/// The bf16 rollout weights, in model order, as one envelope for the sync publisher.
envelope snapshot(const ml::policy_model& model, uint64_t version) {
  std::vector<at::Tensor> bf16;
  for (const auto& [name, t] : model.parameters())
    bf16.push_back(t.detach().to(at::kBFloat16).contiguous());
  return build_envelope<msg::WeightSnapshot>([&](msg::WeightSnapshot::Builder b) {
    const auto& params = model.parameters();
    b.setVersion(version);
    b.setDtype(msg::WeightDtype::BF16);
    auto names = b.initNames(static_cast<unsigned>(params.size()));
    auto shapes = b.initShapes(static_cast<unsigned>(params.size()));
    auto data = b.initData(static_cast<unsigned>(params.size()));
    for (size_t i = 0; i < params.size(); ++i) {
      auto k = static_cast<unsigned>(i);
      names.set(k, params[i].first);
      auto sizes = params[i].second.sizes();
      auto shape = shapes.init(k, static_cast<unsigned>(sizes.size()));
      for (size_t d = 0; d < sizes.size(); ++d)
        shape.set(static_cast<unsigned>(d), sizes[d]);
      data.set(k, kj::arrayPtr(static_cast<const kj::byte*>(bf16[i].data_ptr()),
                               static_cast<size_t>(bf16[i].numel() * 2)));
    }
  });
}

/// Loads the policy; returns (source description, trainer state JSON, resumed).
std::tuple<std::string, std::string, bool> load_policy(learner_actor_t* self) {
  auto& st = self->state;
  const auto& cfg = *st.cfg;
  st.model = std::make_unique<ml::policy_model>(model_dims_from(cfg), cfg.run.seed);
  std::optional<fs::path> dir;
  bool resumed = false;
  if (cfg.run.resume) {
    dir = ml::latest_checkpoint(checkpoint_root(cfg));
    if (!dir) {
      // `latest` lost (deleted by hand, or a crash before the first one was written):
      // the newest complete step directory is the next best thing.
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(checkpoint_root(cfg), ec)) {
        auto name = entry.path().filename().string();
        if (entry.is_directory() && name.rfind("step-", 0) == 0
            && fs::exists(entry.path() / "state.json") && (!dir || entry.path() > *dir))
          dir = entry.path();
      }
      if (dir)
        spdlog::warn("{}: no `latest` in {}; resuming from the newest step directory {}",
                     st.me, checkpoint_root(cfg).string(), dir->string());
    }
    if (!dir)
      throw std::runtime_error(
        fmt::format("--resume: no checkpoint under {}", checkpoint_root(cfg).string()));
    resumed = true;
  } else if (!cfg.model.checkpoint.empty()) {
    dir = ml::latest_checkpoint(cfg.model.checkpoint);
    if (!dir)
      throw std::runtime_error(fmt::format("model.checkpoint: no checkpoint under {} (run "
                                           "`sorl sft` or set model.warm_start = true)",
                                           cfg.model.checkpoint));
  }
  std::string source = fmt::format("fresh {} init (seed {})", cfg.model.preset, cfg.run.seed);
  std::string trainer_state;
  ml::loaded_checkpoint loaded;
  if (dir) {
    loaded = ml::load_checkpoint(*dir, st.model->parameters());
    source = dir->string();
  }
  st.model->set_requires_grad(true);
  st.core = std::make_unique<learner::learner_core>(*st.model, learner::learner_options_from(cfg),
                                                    cfg.run.seed);
  if (resumed) {
    learner::optimizer_state os;
    os.step = loaded.state.step;
    os.tensors = loaded.optimizer;
    st.core->load_optimizer_state(os);
    st.step = loaded.state.step;
    // Compared with the line written at save time (tests do): restore is bit for bit.
    spdlog::info("{}: resumed step {}: weights {:016x} optimizer {:016x}", st.me, st.step,
                 fingerprint(st.model->parameters()),
                 fingerprint(st.core->save_optimizer_state().tensors));
    auto it = loaded.state.metadata.find("sorl.trainer");
    if (it != loaded.state.metadata.end())
      trainer_state = it->second;
  }
  return {source, trainer_state, resumed};
}

std::vector<learner::rollout_sample> decode_batch(msg::TrainBatch::Reader batch) {
  std::vector<learner::rollout_sample> out;
  for (auto t : batch.getTrajectories()) {
    learner::rollout_sample s;
    s.group_id = t.getGroupId();
    for (auto x : t.getPromptTokens())
      s.prompt.push_back(x);
    for (auto x : t.getResponseTokens())
      s.response.push_back(x);
    auto mask = t.getLossMask();
    s.loss_mask.assign(mask.begin(), mask.end());
    for (auto x : t.getSamplingLogprobs())
      s.sampling_logprobs.push_back(x);
    if (s.loss_mask.size() != s.response.size() || s.sampling_logprobs.size() != s.response.size())
      throw std::invalid_argument(fmt::format("trajectory {}: {} response tokens, {} mask "
                                              "bytes, {} log-probs",
                                              t.getRequestId(), s.response.size(),
                                              s.loss_mask.size(), s.sampling_logprobs.size()));
    // Whatever a worker could not score (or serve) is masked out, never trained as a 0.
    s.reward_failed = t.getStatus() != msg::RolloutStatus::OK || !std::isfinite(t.getReward());
    s.reward = s.reward_failed ? 0.0f : t.getReward();
    s.truncated = t.getFinishReason() == msg::FinishReason::LENGTH;
    out.push_back(std::move(s));
  }
  return out;
}

void fail_job(learner_actor_t* self, std::string why) {
  sorl::fail_job(self->state.directory, self->state.me, std::move(why));
}

caf::behavior learner_actor(learner_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.cfg = ctx.config;
  st.directory = ctx.directory;
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.trainer = single_peer(roster, role::trainer);
      st.publisher = single_peer(roster, role::sync_publisher);
      try {
        st.task = make_task_from(*st.cfg);
        auto [source, trainer_state, resumed] = load_policy(self);
        spdlog::info("{}: policy from {} ({} parameters), version {}", st.me, source,
                     st.model->dims().parameter_count(), st.step);
        self->send(st.publisher, snapshot(*st.model, static_cast<uint64_t>(st.step)));
        self->send(st.trainer, trainer::to_msg(trainer::ev::learner_ready{
                                 static_cast<uint64_t>(st.step), resumed, source, trainer_state}));
      } catch (const std::exception& ex) {
        fail_job(self, fmt::format("cannot load the policy: {}", ex.what()));
      }
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::TrainBatch>(e, st.me, [&](msg::TrainBatch::Reader batch) {
            learner::step_metrics m;
            try {
              m = st.core->train_step(decode_batch(batch));
            } catch (const std::exception& ex) {
              // Answered: the trainer waits for this step's result and ends the job with the
              // reason (a malformed batch, every update non-finite...).
              self->send(st.trainer,
                         build_envelope<msg::TrainResult>([&](msg::TrainResult::Builder b) {
                           b.setStep(batch.getStep());
                           b.setVersion(static_cast<uint64_t>(st.step));
                           b.setOk(false);
                           b.setReason(ex.what());
                         }));
              return;
            }
            ++st.step;
            std::vector<std::pair<const char*, double>> metrics{
              {metric::loss.key, m.loss},
              {metric::pg_loss.key, m.pg_loss},
              {metric::kl.key, m.kl},
              {metric::clip_frac_low.key, m.clip_frac_low},
              {metric::clip_frac_high.key, m.clip_frac_high},
              {metric::ratio_max.key, m.ratio_max},
              {metric::grad_norm.key, m.grad_norm},
              {metric::mismatch_mean.key, m.mismatch_mean},
              {metric::mismatch_max.key, m.mismatch_max},
              {metric::entropy.key, m.entropy},
              {metric::advantage_abs_mean.key, m.advantage_abs_mean},
              {metric::zero_signal_groups.key, static_cast<double>(m.zero_signal_groups)},
              {metric::tokens_trained.key, static_cast<double>(m.tokens_trained)},
              {metric::overlong_filtered.key, static_cast<double>(m.overlong_filtered)},
              {metric::overlong_penalty_mean.key, m.overlong_penalty_mean},
              {metric::overlong_shaped.key, static_cast<double>(m.overlong_shaped)},
              {metric::updates.key, static_cast<double>(m.updates)},
              {metric::skipped_updates.key, static_cast<double>(m.skipped_updates)},
              {metric::nonfinite_updates.key, static_cast<double>(m.nonfinite_updates)},
            };
            auto result = build_envelope<msg::TrainResult>([&](msg::TrainResult::Builder b) {
              b.setStep(batch.getStep());
              b.setVersion(static_cast<uint64_t>(st.step));
              auto names = b.initMetricNames(static_cast<unsigned>(metrics.size()));
              auto values = b.initMetricValues(static_cast<unsigned>(metrics.size()));
              for (size_t i = 0; i < metrics.size(); ++i) {
                names.set(static_cast<unsigned>(i), metrics[i].first);
                values.set(static_cast<unsigned>(i), metrics[i].second);
              }
              b.setOk(true);
            });
            // The result first: the trainer then usually hears of the step before the version.
            self->send(st.trainer, result);
            self->send(st.publisher, snapshot(*st.model, static_cast<uint64_t>(st.step)));
          }))
        return;
      if (handle_as<msg::EvalRequest>(e, st.me, [&](msg::EvalRequest::Reader req) {
            ml::eval_options o;
            o.count = req.getCount();
            o.max_new_tokens = st.cfg->task.max_new_tokens;
            ml::byte_tokenizer tok;
            ml::eval_report rep;
            try {
              rep = ml::evaluate(*st.model, tok, st.task, o);
            } catch (const std::exception& ex) {
              fail_job(self, fmt::format("evaluation failed: {}", ex.what()));
              return;
            }
            self->send(st.trainer, trainer::to_msg(trainer::ev::eval_result{
                                     req.getTag().cStr(), static_cast<uint32_t>(rep.count),
                                     rep.accuracy, rep.mean_reward, rep.mean_response_tokens,
                                     rep.seconds}));
          }))
        return;
      if (handle_as<msg::CheckpointRequest>(e, st.me, [&](msg::CheckpointRequest::Reader req) {
            std::string path;
            std::string why;
            try {
              auto os = st.core->save_optimizer_state();
              ml::checkpoint_state cs;
              cs.step = st.step;
              cs.metadata["sorl.trainer"] = req.getTrainerState();
              cs.metadata["sorl.preset"] = st.cfg->model.preset;
              path = ml::save_checkpoint(checkpoint_root(*st.cfg), st.model->parameters(),
                                         os.tensors, cs)
                       .string();
              spdlog::info("{}: checkpoint step {}: weights {:016x} optimizer {:016x}", st.me,
                           st.step, fingerprint(st.model->parameters()), fingerprint(os.tensors));
            } catch (const std::exception& ex) {
              why = ex.what();
            }
            self->send(st.trainer, trainer::to_msg(trainer::ev::checkpoint_done{
                                     req.getStep(), path, why.empty(), why}));
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
