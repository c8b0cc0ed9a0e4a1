// Train/inference mismatch and the learner's cost, per way of choosing the learner's weights
// and π_old, on a config's own model and single-turn task, without actors:
//
//   BUILD/bench/learner/onpolicy_bench CONFIG [--steps K] [--prompts B] [--group G]
//                                             [--arms LIST] [--gemm automatic|aten]
//                                             [--record PATH]
//
// Each arm starts from the config's weights (bench/war/source_weights.hpp) and runs K steps of
// the synchronous loop in one thread: the bf16 rollout copy of the learner's master (cast as
// the sync publishes it) samples B prompts × G rollouts of the training split through the
// batched generator with the config's sampling settings, the task scores them, and one
// learner_core::train_step learns from them. Arms (comma-separated, all by default):
//   bf16-rollout    the default: forwards on the bf16 image, π_old = the rollout's log-probs
//   bf16-recompute  forwards on the bf16 image, π_old recomputed by a no-grad pass
//   fp32-recompute  forwards on the fp32 master, π_old recomputed (the previous learner)
// Per step it prints the learner's seconds and forwards and the mismatch figures of the step
// (runtime/metrics.hpp), and, before the update, where the bitwise share is lost: for each
// trained token, the learner's log-prob (fp32 log_softmax of its batched packed forward), the
// worker's (the sampler's fp64 formula over its cached-decode logits, runtime/ml/policy/sampler.hpp
// training_logprob) and the sampler's formula over the learner's logits. Equal formula-over-
// learner and worker values mean the two passes' logits agree to that float; equal learner
// and formula-over-learner values mean the two formulas agree on identical logits.
// --gemm aten decodes with at::linear (the learner's BLAS) instead of oneDNN. The run's record
// (bench/record.hpp: tables "steps" and "arms") goes to --record PATH, else
// $SORL_BENCH_RECORD, else runs/bench/.

#include "actors/common/train_setup.hpp"
#include "actors/learner/learner_core.hpp"
#include "actors/roles.hpp"
#include "bench/learner/rollout_batch.hpp"
#include "bench/record_ml.hpp"
#include "bench/war/source_weights.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/policy/sampler.hpp"
#include "runtime/ml/policy/torch_compat.hpp"
#include "runtime/role_names.hpp"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace sorl;

struct bench_options {
  int steps = 3;
  std::int64_t prompts = 0; ///< 0 = the config's prompts_per_step
  std::int64_t group = 0;   ///< 0 = the config's sagc.group_size
  std::vector<std::string> arms{"bf16-rollout", "bf16-recompute", "fp32-recompute"};
  ml::decode_gemm gemm = ml::decode_gemm::automatic;
  std::string record; ///< --record PATH; "" = record_path's default
};

[[noreturn]] void usage(const std::string& why) {
  throw std::invalid_argument(why + "\nusage: onpolicy_bench CONFIG [--steps K] [--prompts B] [--group G] "
                                    "[--arms bf16-rollout,bf16-recompute,fp32-recompute] [--gemm automatic|aten] "
                                    "[--record PATH]");
}

std::int64_t positive(const std::string& flag, const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 1)
    usage(fmt::format("{} needs a positive integer, got '{}'", flag, text));
  return v;
}

bench_options parse(int argc, char** argv) {
  if (argc < 2)
    usage("missing CONFIG");
  bench_options o;
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc)
      usage(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--steps") {
      o.steps = static_cast<int>(positive(flag, value));
    } else if (flag == "--prompts") {
      o.prompts = positive(flag, value);
    } else if (flag == "--group") {
      o.group = positive(flag, value);
    } else if (flag == "--record") {
      o.record = value;
    } else if (flag == "--gemm") {
      const std::string g = value;
      if (g != "automatic" && g != "aten")
        usage("--gemm is automatic or aten, got '" + g + "'");
      o.gemm = g == "aten" ? ml::decode_gemm::aten : ml::decode_gemm::automatic;
    } else if (flag == "--arms") {
      o.arms.clear();
      std::string list = value;
      for (std::size_t b = 0; b <= list.size();) {
        const std::size_t e = std::min(list.find(',', b), list.size());
        const std::string arm = list.substr(b, e - b);
        if (arm != "bf16-rollout" && arm != "bf16-recompute" && arm != "fp32-recompute")
          usage("unknown arm '" + arm + "'");
        o.arms.push_back(arm);
        b = e + 1;
      }
    } else {
      usage("unknown flag " + flag);
    }
  }
  return o;
}

/// Where the bitwise share is lost, over a batch's trained tokens (see the file comment).
struct bitwise_sources {
  double tokens = 0, learner_eq_worker = 0, formula_eq_worker = 0, learner_eq_formula = 0;
};

/// The learner's batched forward over `batch` (its sequences packed end to end, as learner_core
/// packs them), then, per response token, the fp32 log_softmax log-prob of its logits (what
/// train_step computes, up to the chunked LM head's rounding) and the sampler's formula over
/// the same logits row.
bitwise_sources sources_of(const ml::policy_model& model, const std::vector<learner::rollout_sample>& batch,
                           double temperature) {
  at::NoGradGuard no_grad;
  std::vector<std::int64_t> ids, lens, rows;
  for (const auto& s : batch) {
    const auto start = static_cast<std::int64_t>(ids.size());
    ids.insert(ids.end(), s.prompt.begin(), s.prompt.end());
    ids.insert(ids.end(), s.response.begin(), s.response.end());
    lens.push_back(static_cast<std::int64_t>(s.prompt.size() + s.response.size()));
    for (std::size_t t = 0; t < s.response.size(); ++t)
      rows.push_back(start + static_cast<std::int64_t>(s.prompt.size() + t) - 1);
  }
  at::Tensor picked =
    model.forward_packed(at::tensor(ids, at::kLong), lens, at::tensor(rows, at::kLong)); // [R, V] fp32
  const at::Tensor raw = picked.contiguous();
  if (temperature != 1.0)
    picked = (picked.to(at::kDouble) / temperature).to(at::kFloat);
  const at::Tensor lsm = at::log_softmax(picked, -1).contiguous();
  const std::int64_t V = raw.size(1);
  bitwise_sources out;
  const float* logits = raw.data_ptr<float>();
  const float* logp = lsm.data_ptr<float>();
  std::int64_t r = 0;
  for (const auto& s : batch) {
    for (std::size_t t = 0; t < s.response.size(); ++t, ++r) {
      if (s.loss_mask[t] == 0)
        continue;
      const std::int64_t row = r * V;
      const float learner = logp[row + s.response[t]];
      const auto formula = static_cast<float>(ml::training_logprob(logits + row, V, temperature, s.response[t]));
      const float worker = s.sampling_logprobs[t];
      out.tokens += 1;
      out.learner_eq_worker += learner == worker ? 1 : 0;
      out.formula_eq_worker += formula == worker ? 1 : 0;
      out.learner_eq_formula += learner == formula ? 1 : 0;
    }
  }
  return out;
}

int run_bench(const experiment_config& cfg, const bench_options& o, bench::bench_record& rec) {
  const ml::any_task task = make_task_from(cfg);
  if (task.is_multi_turn())
    throw std::invalid_argument("onpolicy_bench runs single-turn tasks only");
  const ml::prompt_format format = prompt_format_from(cfg);
  const ml::named_tensors source = bench::source_weights(cfg);
  const std::int64_t B = o.prompts > 0 ? o.prompts : cfg.algorithm.prompts_per_step;
  const std::int64_t G = o.group > 0 ? o.group : cfg.sagc.group_size;
  const double temperature = cfg.algorithm.temperature > 0 ? cfg.algorithm.temperature : 1.0;
  bench::record_table& steps = rec.add_table(
    "steps", "per arm and step: the learner's time, the mismatch and where the bitwise share is lost",
    {{"arm", "arm"},
     {"step", "step"},
     {"reward", "reward", "", 3},
     {"learn_s", "learner", "s", 2},
     {"forwards", "forwards"},
     {"mismatch_mean", "mean |Δ|", "nats", -1, false, 2},
     {"mismatch_max", "max |Δ|", "nats", -1, false, 2},
     {"k3", "k3", "", -1, false, 2},
     {"bitwise", "learner == worker", "%", 2},
     {"formula", "learner == formula on the learner's logits", "%", 2},
     {"logits", "formula on the learner's logits == worker", "%", 2},
     {"tokens", "trained tokens"},
     {"gen_s", "generation", "s", 1}});
  bench::record_table& means = rec.add_table(
    "arms", "per arm: the mean learner time over the steps",
    {{"arm", "arm"}, {"steps", "steps"}, {"learn_s", "learner", "s", 2}});
  std::printf("%-15s %4s %8s %8s %6s %10s %10s %10s %9s %9s %9s %9s %7s\n", "arm", "step", "reward", "learn_s",
              "fwd", "mis_mean", "mis_max", "k3", "bitwise", "formula", "logits", "tokens", "gen_s");
  for (const std::string& arm : o.arms) {
    ml::policy_model master(model_dims_from(cfg), cfg.run.seed);
    {
      at::NoGradGuard no_grad;
      for (std::size_t i = 0; i < source.size(); ++i)
        master.parameters()[i].second.copy_(source[i].second);
    }
    learner::learner_options lo = learner::learner_options_from(cfg);
    lo.weights = arm.rfind("fp32", 0) == 0 ? learner::forward_weights::fp32 : learner::forward_weights::bf16;
    lo.old_logprobs = arm.find("rollout") != std::string::npos ? learner::old_logprob_source::rollout
                                                                : learner::old_logprob_source::recompute;
    lo.tis_cap = 0.0;
    learner::learner_core core(master, lo, cfg.run.seed);
    double learn_sum = 0.0;
    for (int step = 0; step < o.steps; ++step) {
      ml::policy_model worker = master.clone(at::kBFloat16);
      worker.set_decode_gemm(o.gemm);
      const auto t_gen = std::chrono::steady_clock::now();
      const std::vector<learner::rollout_sample> batch = bench::sample_rollouts(cfg, task, format, worker, B, G, step * B);
      const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_gen).count();
      double reward_sum = 0.0;
      for (const auto& s : batch)
        reward_sum += s.reward;
      const bitwise_sources src = sources_of(master, batch, temperature);
      const learner::step_metrics m = core.train_step(batch);
      learn_sum += m.seconds;
      std::printf("%-15s %4d %8.3f %8.2f %6lld %10.3g %10.3g %10.3g %9.4f %9.4f %9.4f %9.0f %7.1f\n", arm.c_str(),
                  step + 1, reward_sum / static_cast<double>(batch.size()), m.seconds,
                  static_cast<long long>(m.forwards), m.mismatch_mean, m.mismatch_max, m.mismatch_k3,
                  src.learner_eq_worker / src.tokens, src.learner_eq_formula / src.tokens,
                  src.formula_eq_worker / src.tokens, src.tokens, gen_s);
      std::fflush(stdout);
      steps.add_row({arm, step + 1, reward_sum / static_cast<double>(batch.size()), m.seconds, m.forwards,
                     m.mismatch_mean, m.mismatch_max, m.mismatch_k3, 100.0 * src.learner_eq_worker / src.tokens,
                     100.0 * src.learner_eq_formula / src.tokens, 100.0 * src.formula_eq_worker / src.tokens,
                     src.tokens, gen_s});
    }
    std::printf("%-15s mean learner time %.2f s over %d steps\n", arm.c_str(), learn_sum / o.steps, o.steps);
    means.add_row({arm, o.steps, learn_sum / o.steps});
  }
  std::printf("bitwise: learner == worker; formula: learner == the sampler's formula on the learner's logits;\n"
              "logits: the sampler's formula on the learner's logits == worker (the passes' logits agree)\n");
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    const bench_options o = parse(argc, argv);
    bench::bench_record rec("onpolicy", argc, argv);
    const experiment_config cfg = load_config(argv[1], role_names(builtin_roles()));
    at::set_num_threads(static_cast<int>(cfg.run.threads > 0 ? cfg.run.threads : 1));
    rec.set_threads(at::get_num_threads());
    rec.set_runtime(bench::ml_record_runtime());
    rec.set_parameter("config", argv[1]);
    rec.set_parameter("decode_gemm", o.gemm == ml::decode_gemm::aten ? "aten" : "automatic");
    const int rc = run_bench(cfg, o, rec);
    const std::string path = bench::record_path("onpolicy", o.record);
    if (rec.write(path))
      std::fprintf(stderr, "record: %s\n", path.c_str());
    return rc;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "onpolicy_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "onpolicy_bench: %s\n", e.what());
    return 1;
  }
}
