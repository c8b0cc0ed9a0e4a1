#include "actors/learner/learner_service.hpp"

#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/train_setup.hpp"
#include "actors/sync/weight_sync.hpp"
#include "runtime/metrics.hpp"
#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/policy/device.hpp"

namespace sorl::learner {

namespace {

namespace fs = std::filesystem;

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

/// Logs the temporary directories of crashed checkpoint writes removed from the run's root.
void log_removed_temporaries(const std::string& me, const std::vector<fs::path>& removed) {
  for (const auto& dir : removed)
    spdlog::warn("{}: removed {}, left by a checkpoint write that did not finish", me,
                 dir.string());
}

/// "request 4", "requests 4, 5" or "requests 0, 1, …, 9 and 3 more".
std::string name_requests(const std::vector<uint64_t>& ids) {
  constexpr size_t shown = 10;
  std::string out = ids.size() == 1 ? "request " : "requests ";
  for (size_t i = 0; i < ids.size() && i < shown; ++i)
    out += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > shown)
    out += fmt::format(" and {} more", ids.size() - shown);
  return out;
}

/// The learner metrics of a step, in the schema's order: 25, truncated IS's 2 when on, and
/// SALT's 8 when it ran.
std::vector<std::pair<const char*, double>> metrics_of(const step_metrics& m) {
  std::vector<std::pair<const char*, double>> out{
    {metric::loss.key, m.loss},
    {metric::pg_loss.key, m.pg_loss},
    {metric::kl.key, m.kl},
    {metric::clip_frac_low.key, m.clip_frac_low},
    {metric::clip_frac_high.key, m.clip_frac_high},
    {metric::ratio_max.key, m.ratio_max},
    {metric::grad_norm.key, m.grad_norm},
    {metric::mismatch_mean.key, m.mismatch_mean},
    {metric::mismatch_max.key, m.mismatch_max},
    {metric::mismatch_k3.key, m.mismatch_k3},
    {metric::token_mult_prob_error.key, m.token_mult_prob_error},
    {metric::mismatch_bitwise.key, m.mismatch_bitwise},
    {metric::mismatch_tokens.key, static_cast<double>(m.mismatch_tokens)},
    {metric::learner_forwards.key, static_cast<double>(m.forwards)},
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
    {metric::zero_signal_updates.key, static_cast<double>(m.zero_signal_updates)},
  };
  if (m.tis_weight_mean > 0.0) // tis_cap > 0 (a weight is never 0)
    out.insert(out.end(), {{metric::tis_weight_mean.key, m.tis_weight_mean},
                           {metric::tis_capped_frac.key, m.tis_capped_frac}});
  if (m.salt_updates > 0) {
    out.insert(out.end(), {
      {metric::salt_cancellation.key, m.salt_cancellation},
      {metric::salt_rank.key, m.salt_rank},
      {metric::salt_gamma.key, m.salt_gamma},
      {metric::salt_norm_before.key, m.salt_norm_before},
      {metric::salt_norm_after.key, m.salt_norm_after},
      {metric::salt_noops.key, static_cast<double>(m.salt_noops)},
      {metric::salt_s.key, m.salt_seconds},
      {metric::salt_share.key, m.seconds > 0 ? m.salt_seconds / m.seconds : 0.0},
    });
  }
  return out;
}

} // namespace

rollout_sample sample_from(const rollout::trajectory_record& t) {
  const auto& r = t.result;
  rollout_sample s;
  s.group_id = r.request.group_id;
  s.prompt = r.prompt;
  s.response = r.response;
  s.loss_mask = r.loss_mask;
  s.sampling_logprobs = r.logprobs;
  if (s.loss_mask.size() != s.response.size() || s.sampling_logprobs.size() != s.response.size())
    throw std::invalid_argument(fmt::format("trajectory {}: {} response tokens, {} mask "
                                            "bytes, {} log-probs",
                                            r.request.request_id, s.response.size(),
                                            s.loss_mask.size(), s.sampling_logprobs.size()));
  // Whatever a worker could not score (or serve) is masked out, never trained as a 0.
  s.reward_failed = r.status != rollout::rollout_status::ok || !std::isfinite(r.reward);
  s.reward = s.reward_failed ? 0.0f : static_cast<float>(r.reward);
  s.truncated = r.finish == ml::finish_reason::length;
  return s;
}

// -- trajectory_buffer ---------------------------------------------------------------------

void trajectory_buffer::keep(const rollout::trajectory_record& t) {
  const auto id = t.result.request.request_id;
  entry e{t.result.request.step, std::string{}};
  try {
    e.sample = sample_from(t);
  } catch (const std::exception& ex) {
    e.sample = std::string{ex.what()};
  }
  auto [it, fresh] = kept_.emplace(id, std::move(e));
  if (!fresh)
    it->second.sample = fmt::format("two trajectories of request {} arrived", id);
}

std::vector<rollout_sample> trajectory_buffer::take(uint64_t step,
                                                    const std::vector<uint64_t>& request_ids) {
  std::vector<rollout_sample> out;
  std::vector<uint64_t> missing;
  std::vector<uint64_t> repeated;
  std::optional<std::string> malformed;
  std::set<uint64_t> named;
  for (auto id : request_ids) {
    if (!named.insert(id).second) {
      repeated.push_back(id);
      continue;
    }
    auto it = kept_.find(id);
    if (it == kept_.end()) {
      missing.push_back(id);
      continue;
    }
    if (auto* why = std::get_if<std::string>(&it->second.sample)) {
      if (!malformed)
        malformed = *why;
      continue;
    }
    out.push_back(std::move(std::get<rollout_sample>(it->second.sample)));
  }
  // Named ones go with the batch whatever their own step says; of the rest only later steps'.
  std::vector<uint64_t> left;
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (named.count(it->first) || it->second.step <= step) {
      if (!named.count(it->first))
        left.push_back(it->first);
      it = kept_.erase(it);
    } else {
      ++it;
    }
  }
  if (!missing.empty())
    throw std::invalid_argument(fmt::format("the batch of {} rollouts names {} whose trajectory "
                                            "never arrived",
                                            request_ids.size(), name_requests(missing)));
  if (!repeated.empty())
    throw std::invalid_argument(
      fmt::format("the batch names {} more than once", name_requests(repeated)));
  if (malformed)
    throw std::invalid_argument(*malformed);
  if (!left.empty())
    throw std::invalid_argument(fmt::format("trajectories of step {} arrived that the batch does "
                                            "not name: {}",
                                            step + 1, name_requests(left)));
  return out;
}

// -- learner_service -----------------------------------------------------------------------

learner_service::learner_service(const experiment_config& cfg, std::string me)
    : cfg_(cfg), me_(std::move(me)) {}

learner_service::~learner_service() = default;

loaded_policy learner_service::load_policy() {
  task_ = make_task_from(cfg_);
  format_ = std::make_unique<ml::prompt_format>(prompt_format_from(cfg_));
  const auto dims = model_dims_from(cfg_);
  const c10::Device device = ml::device_from(cfg_.run.device, "run.device");
  std::optional<fs::path> dir;
  loaded_policy out;
  if (cfg_.run.resume) {
    log_removed_temporaries(me_, ml::remove_stale_checkpoint_temporaries(checkpoint_root(cfg_)));
    dir = ml::latest_checkpoint(checkpoint_root(cfg_));
    if (!dir) {
      // `latest` lost (deleted by hand, or a crash before the first one was written):
      // the newest complete step directory is the next best thing.
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(checkpoint_root(cfg_), ec)) {
        auto name = entry.path().filename().string();
        if (entry.is_directory() && name.rfind("step-", 0) == 0
            && fs::exists(entry.path() / "state.json") && (!dir || entry.path() > *dir))
          dir = entry.path();
      }
      if (dir)
        spdlog::warn("{}: no `latest` in {}; resuming from the newest step directory {}", me_,
                     checkpoint_root(cfg_).string(), dir->string());
    }
    if (!dir)
      throw std::runtime_error(
        fmt::format("--resume: no checkpoint under {}", checkpoint_root(cfg_).string()));
    out.resumed = true;
  } else if (!cfg_.model.checkpoint.empty()) {
    dir = ml::latest_checkpoint(cfg_.model.checkpoint);
    if (!dir)
      throw std::runtime_error(fmt::format("model.checkpoint: no checkpoint under {} (run "
                                           "`sorl sft` or set model.warm_start = true)",
                                           cfg_.model.checkpoint));
  }
  ml::loaded_checkpoint loaded;
  if (!dir && !cfg_.model.hf_dir.empty()) {
    ml::hf_load_options lo;
    lo.max_seq = dims.max_seq;
    lo.device = device;
    auto hf = ml::load_hf_model(cfg_.model.hf_dir, lo);
    model_ = std::make_unique<ml::policy_model>(std::move(hf.model));
    out.source = cfg_.model.hf_dir;
  } else {
    model_ = std::make_unique<ml::policy_model>(dims, cfg_.run.seed, /*init_std=*/0.02, device);
    out.source = fmt::format("fresh {} init (seed {})", cfg_.model.preset, cfg_.run.seed);
  }
  if (dir) {
    loaded = ml::load_checkpoint(*dir, model_->parameters());
    out.source = dir->string();
  }
  model_->set_requires_grad(true);
  core_ = std::make_unique<learner_core>(*model_, learner_options_from(cfg_), cfg_.run.seed);
  if (out.resumed) {
    optimizer_state os;
    os.step = loaded.state.step;
    os.tensors = loaded.optimizer;
    core_->load_optimizer_state(os);
    step_ = loaded.state.step;
    // Compared with the line written at save time (tests do): restore is bit for bit.
    spdlog::info("{}: resumed step {}: weights {:016x} optimizer {:016x}", me_, step_,
                 fingerprint(model_->parameters()),
                 fingerprint(core_->save_optimizer_state().tensors));
    auto it = loaded.state.metadata.find("sorl.trainer");
    if (it != loaded.state.metadata.end())
      out.trainer_state = it->second;
  }
  spdlog::info("{}: policy from {} ({} parameters) on {}, version {}", me_, out.source,
               model_->dims().parameter_count(), ml::describe(device), step_);
  return out;
}

void learner_service::require_loaded() const {
  if (!core_)
    throw std::logic_error("the policy is not loaded yet");
}

sync::snapshot_view learner_service::snapshot() const {
  const auto& params = model_->parameters();
  auto bf16 = std::make_shared<std::vector<at::Tensor>>();
  sync::snapshot_view v;
  v.version = version();
  v.dtype = sync::weight_dtype::bf16;
  for (const auto& [name, t] : params) {
    // The publisher's codec reads host memory: a device's weights come over as bf16.
    bf16->push_back(t.detach().to(at::kCPU, at::kBFloat16, /*non_blocking=*/false, /*copy=*/true).contiguous());
    const auto& b = bf16->back();
    v.names.push_back(name);
    v.shapes.emplace_back(t.sizes().begin(), t.sizes().end());
    v.data.push_back({static_cast<const uint8_t*>(b.data_ptr()), static_cast<size_t>(b.numel() * 2)});
  }
  v.keep_alive = std::move(bf16);
  return v;
}

train_outcome learner_service::train(uint64_t step, const std::vector<uint64_t>& request_ids) {
  train_outcome out;
  out.step = step;
  try {
    require_loaded();
    auto m = core_->train_step(trajectories_.take(step, request_ids));
    ++step_;
    out.metrics = metrics_of(m);
  } catch (const std::exception& ex) {
    // Answered, not raised: the trainer waits for this step's result and ends the job with
    // the reason (a malformed batch, every update non-finite...).
    out.ok = false;
    out.reason = ex.what();
  }
  out.version = version();
  return out;
}

ml::eval_report learner_service::evaluate(uint32_t count) const {
  require_loaded();
  ml::eval_options o;
  o.count = count;
  o.max_new_tokens = cfg_.task.max_new_tokens;
  // A failed reward is the rollouts' rule here too: masked and counted, or the job's end.
  o.fail_on_reward_failure = cfg_.algorithm.on_reward_failure == reward_failure_kind::fail;
  return ml::evaluate(*model_, *format_, task_, o);
}

saved_checkpoint learner_service::save_checkpoint(const std::string& trainer_state) const {
  saved_checkpoint out;
  try {
    require_loaded();
    auto os = core_->save_optimizer_state();
    ml::checkpoint_state cs;
    cs.step = step_;
    cs.metadata["sorl.trainer"] = trainer_state;
    if (cfg_.model.hf_dir.empty())
      cs.metadata["sorl.preset"] = cfg_.model.preset;
    else
      cs.metadata["sorl.hf_dir"] = cfg_.model.hf_dir;
    std::vector<fs::path> removed;
    out.path = ml::save_checkpoint(checkpoint_root(cfg_), model_->parameters(), os.tensors, cs,
                                   &removed)
                 .string();
    log_removed_temporaries(me_, removed);
    spdlog::info("{}: checkpoint step {}: weights {:016x} optimizer {:016x}", me_, step_,
                 fingerprint(model_->parameters()), fingerprint(os.tensors));
  } catch (const std::exception& ex) {
    out.path.clear();
    out.error = ex.what();
  }
  return out;
}

} // namespace sorl::learner
