// The learner step's cost on a config's own model and task, padded against packed, with the
// FLOPs it needs and the machine's GEMM rate on the model's own shapes, measured in the same run:
//
//   BUILD/bench/learner/learner_step_bench CONFIG [--repeats K] [--prompts B] [--group G]
//                                                 [--arms padded,packed,shared,packed-seq]
//                                                 [--record PATH]
//
// One batch of B prompts × G rollouts is sampled once (the bf16 rollout copy of the config's
// weights, the config's sampling settings, the task's rewards), then every arm starts from the
// config's weights and runs K learner_core::train_step calls on that batch (the first is
// reported apart: it pays one-time allocations). Arms:
//   padded      the previous learner: right-padded [N, L] forwards, [rows, vocab] logits whole
//   packed      sequences end to end, attention batched under a block-causal mask, the LM head
//               and log-softmax a chunk of rows at a time (learner_options::packed_forward)
//   shared      packed, and a group's rollouts read one copy of their prompt
//               (learner_options::share_prompts): the trunk runs over each prompt once
//   packed-seq  packed, attention one sequence at a time (ml::packed_attention::per_sequence)
//
// FLOPs needed by one forward over the batch (multiply-add = 2 FLOPs), for S real tokens,
// R response tokens (the rows whose log-probs the loss reads) and sequences of lengths n_b:
//   trunk      2 · S · L · (d·q + 2·d·kv + q·d + 3·d·ff)          (the linear layers)
//   attention  2 · L · 2 · H · hd · Σ_b n_b (n_b + 1) / 2           (QKᵀ and PV, causal half)
//   LM head    2 · R · vocab · d
// and a backward pass needs twice its forward, so a step of F forwards and U backward passes
// needs F · fwd + 2 · U · fwd (the usual ≈ 6 · params · tokens for one of each, with the LM head
// on response rows only). What an implementation adds (padding, the full attention square,
// the chunked LM head's recompute) is not counted: the rates below are useful FLOP/s. The
// shared arm needs fewer: its trunk runs over S' = the distinct prompts' tokens + R rows
// instead of S, so its rates are over its own count.
// The GEMM baseline is at::linear in fp32 on [S, in] × [in, out] for every linear shape of
// the model and [R, d] × [d, vocab] for the LM head, no autograd, best of 3; "mix" is one
// forward's linear FLOPs over the time those GEMMs take at those rates, the ceiling of a
// forward made of nothing but GEMMs.
// Peak RSS is the process's resident high-water mark over one arm's steps (reset through
// /proc/self/clear_refs before each arm, after returning freed heap to the system), and how
// far it rose above the RSS at the arm's start (the model, AdamW's moments, the sampled batch
// and libtorch are there before the first step).
// The run's record (bench/record.hpp: tables "arms", the means per arm, and "gemm", the
// baseline per shape) goes to --record PATH, else $SORL_BENCH_RECORD, else runs/bench/.

#include "actors/common/train_setup.hpp"
#include "actors/learner/learner_core.hpp"
#include "actors/roles.hpp"
#include "bench/learner/rollout_batch.hpp"
#include "bench/record_ml.hpp"
#include "bench/war/source_weights.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/policy/torch_compat.hpp"
#include "runtime/process_memory.hpp"
#include "runtime/role_names.hpp"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace sorl;

struct bench_options {
  int repeats = 3;
  std::int64_t prompts = 0; ///< 0 = the config's prompts_per_step
  std::int64_t group = 0;   ///< 0 = the config's sagc.group_size
  std::vector<std::string> arms{"padded", "packed", "shared"};
  std::string record; ///< --record PATH; "" = record_path's default
};

[[noreturn]] void usage(const std::string& why) {
  throw std::invalid_argument(why + "\nusage: learner_step_bench CONFIG [--repeats K] [--prompts B] [--group G] "
                                    "[--arms padded,packed,shared,packed-seq] [--record PATH]");
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
    if (flag == "--repeats") {
      o.repeats = static_cast<int>(positive(flag, value));
    } else if (flag == "--prompts") {
      o.prompts = positive(flag, value);
    } else if (flag == "--group") {
      o.group = positive(flag, value);
    } else if (flag == "--record") {
      o.record = value;
    } else if (flag == "--arms") {
      o.arms.clear();
      const std::string list = value;
      for (std::size_t b = 0; b <= list.size();) {
        const std::size_t e = std::min(list.find(',', b), list.size());
        const std::string arm = list.substr(b, e - b);
        if (arm != "padded" && arm != "packed" && arm != "shared" && arm != "packed-seq")
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

double seconds_of(const std::function<void()>& f) {
  const auto t = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double peak_rss_mib() {
  return proc_status_mib("VmHWM").value_or(-1.0);
}

/// Starts a new high-water mark at the current RSS, after handing freed heap back to the
/// kernel so that an arm's peak does not start from the previous arm's; false where the
/// kernel refuses.
bool reset_arm_peak() {
  malloc_trim(0);
  return reset_peak_rss();
}

/// A fresh fp32 model of the config holding `source`.
ml::policy_model master_of(const experiment_config& cfg, const ml::named_tensors& source) {
  ml::policy_model master(model_dims_from(cfg), cfg.run.seed);
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < source.size(); ++i)
    master.parameters()[i].second.copy_(source[i].second);
  return master;
}

std::vector<learner::rollout_sample> sample_batch(const experiment_config& cfg, const ml::named_tensors& source,
                                                  std::int64_t B, std::int64_t G) {
  const ml::any_task task = make_task_from(cfg);
  if (task.is_multi_turn())
    throw std::invalid_argument("learner_step_bench runs single-turn tasks only");
  const ml::prompt_format format = prompt_format_from(cfg);
  const ml::policy_model master = master_of(cfg, source);
  return bench::sample_rollouts(cfg, task, format, master.clone(at::kBFloat16), B, G, 0);
}

struct flop_count {
  double trunk = 0, attention = 0, lm_head = 0;
  double forward() const { return trunk + attention + lm_head; }
};

/// One forward's useful FLOPs (see the file comment); `shared`: each distinct prompt's trunk
/// once.
flop_count forward_flops(const ml::model_dims& d, const std::vector<learner::rollout_sample>& batch,
                         bool shared = false) {
  const double hd = static_cast<double>(d.head_dim());
  const double q = static_cast<double>(d.n_heads) * hd, kv = static_cast<double>(d.n_kv_heads) * hd;
  const double dm = static_cast<double>(d.d_model), ff = static_cast<double>(d.d_ff);
  const double per_token_macs = dm * q + 2 * dm * kv + q * dm + 3 * dm * ff;
  double S = 0, R = 0, pairs = 0;
  std::set<std::vector<std::int32_t>> prompts;
  for (const auto& s : batch) {
    const auto n = static_cast<double>(s.prompt.size() + s.response.size());
    S += shared ? static_cast<double>(s.response.size()) : n;
    if (shared && prompts.insert(s.prompt).second)
      S += static_cast<double>(s.prompt.size());
    R += static_cast<double>(s.response.size());
    pairs += n * (n + 1) / 2;
  }
  const double layers = static_cast<double>(d.n_layers);
  flop_count f;
  f.trunk = 2 * S * layers * per_token_macs;
  f.attention = 2 * layers * 2 * static_cast<double>(d.n_heads) * hd * pairs;
  f.lm_head = 2 * R * static_cast<double>(d.vocab) * dm;
  return f;
}

/// Best-of-3 seconds of at::linear on [rows, in] × [in, out] fp32, no autograd.
double gemm_seconds(std::int64_t rows, std::int64_t in, std::int64_t out) {
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({rows, in});
  const at::Tensor w = at::randn({out, in});
  at::linear(x, w); // warm-up: first-touch of the output and BLAS's buffers
  double best = 1e30;
  for (int k = 0; k < 3; ++k)
    best = std::min(best, seconds_of([&] { at::linear(x, w); }));
  return best;
}

/// What an arm is, in a record's table.
const char* arm_description(const std::string& arm) {
  if (arm == "padded")
    return "padded";
  if (arm == "packed")
    return "packed, every rollout's prompt";
  if (arm == "shared")
    return "packed, each group's prompt once";
  return "packed, attention one sequence at a time";
}

int run_bench(const experiment_config& cfg, const bench_options& o, bench::bench_record& rec) {
  const ml::named_tensors source = bench::source_weights(cfg);
  const ml::model_dims d = model_dims_from(cfg);
  const std::int64_t B = o.prompts > 0 ? o.prompts : cfg.algorithm.prompts_per_step;
  const std::int64_t G = o.group > 0 ? o.group : cfg.sagc.group_size;
  std::vector<learner::rollout_sample> batch;
  const double gen_s = seconds_of([&] { batch = sample_batch(cfg, source, B, G); });

  std::int64_t S = 0, R = 0, longest = 0, longest_resp = 0;
  for (const auto& s : batch) {
    const auto n = static_cast<std::int64_t>(s.prompt.size() + s.response.size());
    S += n;
    R += static_cast<std::int64_t>(s.response.size());
    longest = std::max(longest, n);
    longest_resp = std::max<std::int64_t>(longest_resp, static_cast<std::int64_t>(s.response.size()));
  }
  const auto N = static_cast<std::int64_t>(batch.size());
  std::printf("batch: %lld sequences sampled in %.1f s, %lld real tokens (padded %lld x %lld = %lld), %lld response "
              "rows (padded %lld), vocab %lld, %d threads\n",
              static_cast<long long>(N), gen_s, static_cast<long long>(S), static_cast<long long>(N),
              static_cast<long long>(longest), static_cast<long long>(N * longest), static_cast<long long>(R),
              static_cast<long long>(N * longest_resp), static_cast<long long>(d.vocab), at::get_num_threads());
  const flop_count f = forward_flops(d, batch), f_shared = forward_flops(d, batch, true);
  std::printf("useful FLOPs of one forward: %.2f GFLOP (trunk linear %.2f, attention %.3f, LM head %.2f); "
              "a step of one forward and one backward: %.2f GFLOP\n",
              f.forward() / 1e9, f.trunk / 1e9, f.attention / 1e9, f.lm_head / 1e9, 3 * f.forward() / 1e9);
  std::printf("with each group's prompt once (shared arm): %.2f GFLOP (trunk linear %.2f); a step: %.2f GFLOP\n",
              f_shared.forward() / 1e9, f_shared.trunk / 1e9, 3 * f_shared.forward() / 1e9);

  // The GEMM baseline on the model's own shapes.
  const std::int64_t hd = d.head_dim(), q = d.n_heads * hd, kv = d.n_kv_heads * hd;
  struct gemm_shape {
    const char* what;
    std::int64_t rows, in, out, per_layer;
  };
  const std::vector<gemm_shape> shapes{
    {"q_proj", S, d.d_model, q, 1},       {"k/v_proj", S, d.d_model, kv, 2}, {"o_proj", S, q, d.d_model, 1},
    {"gate/up_proj", S, d.d_model, d.d_ff, 2}, {"down_proj", S, d.d_ff, d.d_model, 1}, {"lm_head", R, d.d_model, d.vocab, 0},
  };
  bench::record_table& gemm = rec.add_table(
    "gemm", "at::linear fp32 on the model's shapes at the step's token count, best of 3 (the baseline)",
    {{"shape", "GEMM"}, {"rows", "rows"}, {"in", "in"}, {"out", "out"}, {"gflops", "rate", "GFLOP/s", 1, true}});
  double mix_flops = 0, mix_seconds = 0;
  for (const gemm_shape& g : shapes) {
    const double s = gemm_seconds(g.rows, g.in, g.out);
    const double flops = 2.0 * static_cast<double>(g.rows * g.in * g.out);
    const double count = g.per_layer == 0 ? 1.0 : static_cast<double>(g.per_layer * d.n_layers);
    mix_flops += flops * count;
    mix_seconds += s * count;
    std::printf("GEMM at::linear fp32 [%lld, %lld] x [%lld, %lld] (%s): %.1f GFLOP/s\n", static_cast<long long>(g.rows),
                static_cast<long long>(g.in), static_cast<long long>(g.in), static_cast<long long>(g.out), g.what,
                flops / s / 1e9);
    gemm.add_row({g.what, g.rows, g.in, g.out, flops / s / 1e9});
  }
  const double gemm_rate = mix_flops / mix_seconds;
  std::printf("GEMM mix of one forward's linear layers: %.1f GFLOP/s\n", gemm_rate / 1e9);
  rec.set_parameter("sequences", N);
  rec.set_parameter("real_tokens", S);
  rec.set_parameter("response_rows", R);
  rec.set_parameter("repeats", o.repeats);
  rec.set_parameter("sampling_s", gen_s);
  gemm.add_row({"mix of one forward's linear layers", {}, {}, {}, gemm_rate / 1e9});
  bench::record_table& arms = rec.add_table(
    "arms", "one learner step of the batch per arm, mean of the repeats after the first",
    {{"arm", "arm"},
     {"what", "learner step"},
     {"step_s", "step", "s", 2},
     {"forward_s", "forward", "s", 2},
     {"backward_s", "backward", "s", 2},
     {"needed_gflop", "FLOPs a step needs", "GFLOP", 0},
     {"gflops", "useful rate", "GFLOP/s", 1},
     {"of_gemm", "of the GEMM rate", "%", 0},
     {"gemm_gflops", "GEMM rate", "GFLOP/s", 0, true},
     {"peak_rss_mib", "peak RSS", "MiB", 0},
     {"rss_rise_mib", "RSS rise over the arm", "MiB", 0}});

  std::printf("%-11s %5s %8s %8s %8s %9s %9s %9s %7s %9s\n", "arm", "step", "step_s", "fwd_s", "bwd_s", "fwd_GF/s",
              "bwd_GF/s", "step_GF/s", "%gemm", "peakMiB");
  for (const std::string& arm : o.arms) {
    ml::policy_model master = master_of(cfg, source);
    master.set_packed_attention(arm == "packed-seq" ? ml::packed_attention::per_sequence
                                                    : ml::packed_attention::batched);
    learner::learner_options lo = learner::learner_options_from(cfg);
    lo.packed_forward = arm != "padded";
    lo.share_prompts = arm == "shared";
    const flop_count& fa = arm == "shared" ? f_shared : f;
    learner::learner_core core(master, lo, cfg.run.seed);
    const bool reset = reset_arm_peak();
    const double rss_before = proc_status_mib("VmRSS").value_or(-1.0);
    double sum_step = 0, sum_fwd = 0, sum_bwd = 0, sum_needed = 0;
    int counted = 0;
    for (int k = 0; k < o.repeats + 1; ++k) {
      const learner::step_metrics m = core.train_step(batch);
      const double backwards = static_cast<double>(m.updates - m.zero_signal_updates);
      const double fwd_flops = fa.forward() * static_cast<double>(m.forwards), bwd_flops = 2 * fa.forward() * backwards;
      const double busy = m.forward_seconds + m.backward_seconds;
      std::printf("%-11s %5s %8.3f %8.3f %8.3f %9.1f %9.1f %9.1f %7.1f %9.0f\n", arm.c_str(),
                  k == 0 ? "first" : std::to_string(k).c_str(), m.seconds, m.forward_seconds, m.backward_seconds,
                  fwd_flops / m.forward_seconds / 1e9, backwards > 0 ? bwd_flops / m.backward_seconds / 1e9 : 0.0,
                  (fwd_flops + bwd_flops) / m.seconds / 1e9, 100.0 * (fwd_flops + bwd_flops) / busy / gemm_rate,
                  peak_rss_mib());
      std::fflush(stdout);
      if (k == 0)
        continue;
      sum_step += m.seconds;
      sum_fwd += m.forward_seconds;
      sum_bwd += m.backward_seconds;
      sum_needed += fwd_flops + bwd_flops;
      ++counted;
    }
    arms.add_row({arm, arm_description(arm), sum_step / counted, sum_fwd / counted, sum_bwd / counted,
                  sum_needed / counted / 1e9, sum_needed / sum_step / 1e9, 100.0 * sum_needed / sum_step / gemm_rate,
                  gemm_rate / 1e9, peak_rss_mib(), peak_rss_mib() - rss_before});
    std::printf("%-11s mean of %d: step %.3f s (forward %.3f, backward %.3f), %.1f GFLOP/s = %.0f%% of the GEMM mix; "
                "peak RSS %.0f MiB (%.0f MiB above the RSS before its first step)%s\n",
                arm.c_str(), counted, sum_step / counted, sum_fwd / counted, sum_bwd / counted,
                sum_needed / sum_step / 1e9, 100.0 * sum_needed / sum_step / gemm_rate, peak_rss_mib(),
                peak_rss_mib() - rss_before,
                reset ? "" : " (process peak: the high-water mark could not be reset)");
  }
  std::printf("%%gemm: useful FLOPs over the forward and backward seconds, against the GEMM mix rate\n");
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    const bench_options o = parse(argc, argv);
    bench::bench_record rec("learner-step", argc, argv);
    const experiment_config cfg = load_config(argv[1], role_names(builtin_roles()));
    at::set_num_threads(static_cast<int>(cfg.run.threads > 0 ? cfg.run.threads : 1));
    rec.set_threads(at::get_num_threads());
    rec.set_runtime(bench::ml_record_runtime());
    rec.set_parameter("config", argv[1]);
    const int rc = run_bench(cfg, o, rec);
    const std::string path = bench::record_path("learner-step", o.record);
    if (rec.write(path))
      std::fprintf(stderr, "record: %s\n", path.c_str());
    return rc;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "learner_step_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "learner_step_bench: %s\n", e.what());
    return 1;
  }
}
