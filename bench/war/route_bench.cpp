// route_bench: placement of one step's rollouts across rollout workers at high load, per
// scheduler policy, on the same trace (ARCHITECTURE.md §6 WAR, cache-aware scheduling).
//
//   route_bench CONFIG [--workers 2] [--families 16] [--prefix-tokens 384] [--question-tokens 24]
//       [--groups 128] [--group-size 4] [--max-new 16] [--cache-families F/W]
//       [--policies round_robin,least_loaded,cache_aware,sglang_cache_aware] [--repeats 1]
//       [--temperature T] [--warm N] [--cache-imbalance R] [--seed 1] [--json FILE] [--write-trace FILE] [--task trace|config]
//       [--record PATH]
//
// --task config runs CONFIG's own task instead of the trace (episodes of a multi-turn task
// included: each worker runs its episodes' environments), with the config's weights (its
// checkpoint or Hugging Face directory, as the learner loads them), group size, tokens per
// turn and prefix-cache budget. --temperature defaults to the config's algorithm.temperature.
// --cache-imbalance R overrides the config's scheduler.cache_imbalance_threshold (requests) for
// cache_aware.
// --warm N (--task config only; default 32) first runs N untimed rollouts of
// other prompts on each worker and then changes the weight version, as between two training
// steps: the workers' global suffix trees hold earlier responses and `auto` has measured its
// arms, while no KV survives into the timed step; the placement's generation estimate
// (placement.hpp) comes from those rollouts' lengths, as the scheduler's would from the
// previous step's finishes (without --warm it has none, and a group's siblings never move
// for balance below cache_imbalance_threshold).
//
// --write-trace writes the trace's prompts (one JSON object per line, as task "jsonl" reads
// them) and stops, so that `sorl train` and `sorl node` can run the same trace
// (bench/war/route_nodes.sh); it prints the prefix-cache budget the in-process runs give
// each worker, as a line of TOML.
//
// A policy may carry a speculation mode, POLICY+MODE with MODE off (the default), on or auto
// ([rollout] speculative): "round_robin+on" is speculation alone, "cache_aware+auto" both
// halves of WAR together, so one run measures the load where each half pays.
//
// The trace is SGLang's "generated-shared-prefix" workload (the one its router's published
// figures use): F families of prompts, each a long shared prefix (a system prompt or tool
// description, random bytes) followed by a short question of its own. A step of N groups of
// G rollouts, each group drawing its family at random (seeded; uniformly, or with popularity
// 1 / rank^zipf under --zipf), is submitted at once, as the
// trainer submits a step; the policy places every rollout (`placement`, placement.hpp, fed
// the prompt's block chain exactly as the scheduler shell feeds it), then every worker runs
// its share on its own thread (one core each, `at::set_num_threads(1)`), all starting at
// once, with CONFIG's model shape (fresh weights, seeded), max_batch and a prefix KV cache of
// --cache-families families' prompts plus their questions and completions (default: the
// families over the workers, so that the workers' caches together hold every family and
// one alone holds its share).
//
// Per policy (medians over --repeats rounds, the policies in turn each round): generated
// tokens per second over the step's makespan (first start to last finish), the speed-up over
// that round's round_robin, the prefix hit rate the workers measured (cached / prompt tokens),
// prefill tokens computed, prefix-cache evictions, p50 / p99 rollout latency (from the step's
// start: every rollout is submitted then), the draft acceptance rate (accepted / drafted
// tokens; 0 without speculation) and the rollouts each worker ran; the JSON adds the last
// round's placement counters (siblings kept with or moved from their group's home, prompts
// routed by a cached prefix or balanced away) and the generation estimate the siblings' moves
// were weighed against (placement.hpp). Tokens are the same
// under every policy (a rollout's tokens depend on its prompt, seed and stream only), so the
// policies decode the same work. The run's record (bench/record.hpp: table "placement") goes to
// --record PATH, else $SORL_BENCH_RECORD, else runs/bench/.

#include "actors/common/train_setup.hpp"
#include "actors/roles.hpp"
#include "actors/rollout/worker_core.hpp"
#include "actors/sagc/timing.hpp"
#include "actors/scheduler/placement.hpp"
#include "actors/scheduler/prefix_index.hpp"
#include "bench/record_ml.hpp"
#include "bench/war/flag_values.hpp"
#include "bench/war/source_weights.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/policy/kv_cache.hpp"
#include "runtime/ml/policy/sampler.hpp"
#include "runtime/ml/policy/torch_compat.hpp"
#include "runtime/role_names.hpp"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace sorl;
using json = nlohmann::json;
using sorl::bench::integer;
using sorl::bench::split;

namespace {

struct bench_options {
  int workers = 2;
  int families = 16;
  int prefix_tokens = 384;
  int question_tokens = 24;
  int groups = 128;
  int group_size = 0;  // 0 = 4 on the trace, the config's sagc.group_size with --task config
  int max_new = 0;     // 0 = 16 on the trace, the config's task.max_new_tokens with --task config
  int cache_families = 0; // 0 = families / workers
  int repeats = 1;
  double cache_imbalance = -1;  // < 0: the config's scheduler.cache_imbalance_threshold
  int warm = -1;  // untimed rollouts per worker first; < 0 = 32 with --task config, 0 on the trace
  double zipf = 0;  // family popularity ∝ 1 / rank^zipf; 0 = uniform
  double temperature = -1;  // < 0: the config's algorithm.temperature
  bool config_task = false;  // --task config: the config's own task instead of the trace
  std::uint64_t seed = 1;
  std::vector<std::string> policies{"round_robin", "least_loaded", "cache_aware", "sglang_cache_aware"};
  std::string json_path;
  std::string write_trace;  // write the trace's prompts here and stop
  std::string record;  // --record PATH; "" = record_path's default
};

// One arm of the bench: a placement policy and the workers' speculation mode.
struct arm {
  scheduler::placement_policy policy;
  rollout::speculation_mode speculative;
};

arm arm_of(const std::string& name) {
  const auto plus = name.find('+');
  const std::string policy = name.substr(0, plus), mode = plus == std::string::npos ? "off" : name.substr(plus + 1);
  arm a{};
  if (policy == "round_robin") a.policy = scheduler::placement_policy::round_robin;
  else if (policy == "least_loaded") a.policy = scheduler::placement_policy::least_loaded;
  else if (policy == "cache_aware") a.policy = scheduler::placement_policy::cache_aware;
  else if (policy == "sglang_cache_aware") a.policy = scheduler::placement_policy::sglang_cache_aware;
  else
    throw std::invalid_argument("--policies: unknown policy \"" + policy +
                                "\" (round_robin, least_loaded, cache_aware, sglang_cache_aware)");
  if (mode == "off") a.speculative = rollout::speculation_mode::off;
  else if (mode == "on") a.speculative = rollout::speculation_mode::on;
  else if (mode == "auto") a.speculative = rollout::speculation_mode::automatic;
  else
    throw std::invalid_argument("--policies: unknown speculation mode \"" + mode + "\" in \"" + name +
                                "\" (off, on, auto)");
  return a;
}

// Printable bytes that are not JSON escapes, so each byte is one token of the byte format.
std::string random_text(std::mt19937_64& rng, int n) {
  static const std::string alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:";
  std::string s;
  for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
  return s;
}

// The trace: line k of the dataset is group k's prompt (its family's prefix, then its question).
struct trace {
  std::filesystem::path dataset;
  std::vector<int> family_of_group;
};

trace write_trace(const bench_options& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<std::string> prefixes;
  for (int f = 0; f < o.families; ++f) prefixes.push_back(random_text(rng, o.prefix_tokens));
  std::vector<double> weight;
  for (int f = 0; f < o.families; ++f) weight.push_back(1.0 / std::pow(f + 1.0, o.zipf));
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  trace t;
  t.dataset = !o.write_trace.empty()
                  ? std::filesystem::path(o.write_trace)
                  : std::filesystem::temp_directory_path() / fmt::format("sorl_route_bench_{}.jsonl", ::getpid());
  std::ofstream out(t.dataset);
  if (!out) throw std::runtime_error("cannot write " + t.dataset.string());
  for (int k = 0; k < o.groups; ++k) {
    const int f = pick(rng);
    t.family_of_group.push_back(f);
    out << json{{"prompt", prefixes[static_cast<std::size_t>(f)] + random_text(rng, o.question_tokens)},
                {"answer", "0"}}
                   .dump()
        << '\n';
  }
  return t;
}

// Each worker's prefix-cache budget, bytes of fp32 KV: --cache-families families' prefixes and
// the question and completion blocks their finished rollouts add.
std::int64_t cache_bytes(const ml::model_dims& dims, const bench_options& o) {
  const std::int64_t per_token = dims.n_layers * 2 * dims.n_kv_heads * dims.head_dim() * 4;
  const int cache_families = o.cache_families > 0 ? o.cache_families : std::max(1, o.families / o.workers);
  return static_cast<std::int64_t>(cache_families) * (o.prefix_tokens + 2 * (o.question_tokens + o.max_new) + 32) *
         per_token;
}

struct worker_run {
  std::vector<double> finish_s;  // per rollout, from the common start
  double end_s = 0;
  std::uint64_t tokens = 0;
  ml::prefill_stats prefill;
  rollout::speculation_counts speculation;
};

struct measured {
  double tokens_per_s = 0, makespan_s = 0, hit_rate = 0, estimated_hit_rate = 0, p50_s = 0, p99_s = 0,
         acceptance = 0;
  std::int64_t prefill_tokens = 0, evictions = 0;
  std::vector<std::int64_t> per_worker;
  scheduler::placement_stats placement;  // how the policy decided (affinity kept or overridden, ...)
  double generation_estimate = 0;        // tokens a rollout was expected to add, at placement
};

measured run_policy(const experiment_config& cfg, const ml::model_dims& dims, const ml::named_tensors& weights,
                    const ml::any_task& task, const ml::prompt_format& format, const bench_options& o,
                    const std::string& policy) {
  rollout::worker_options wo = rollout::worker_options_from(cfg);
  const arm a = arm_of(policy);
  wo.speculative = a.speculative;
  if (!o.config_task) wo.prefix_cache_bytes = cache_bytes(dims, o);

  // As the scheduler shell builds them from [scheduler], with the policy under test.
  scheduler::placement_options po = scheduler::placement_options_from(
      cfg, rollout::worker_core::prefix_cache_tokens(dims, wo.prefix_cache_bytes) / ml::kv_cache_options{}.block_size);
  po.policy = a.policy;
  if (o.cache_imbalance >= 0) po.cache_imbalance_threshold = o.cache_imbalance;
  po.group_affinity = po.policy != scheduler::placement_policy::sglang_cache_aware;  // as placement_options_from
  scheduler::placement place(po);
  std::vector<std::string> names;
  for (int w = 0; w < o.workers; ++w) {
    names.push_back(fmt::format("w{}", w));
    place.join(names.back());
  }
  // Workers are built before the clock starts: weights copied, caches empty.
  std::vector<std::unique_ptr<rollout::worker_core>> workers;
  for (int w = 0; w < o.workers; ++w) {
    auto wc = std::make_unique<rollout::worker_core>(dims, task, wo, format);
    std::map<std::string, at::Tensor> src(weights.begin(), weights.end());
    {
      at::NoGradGuard no_grad;
      for (auto& [name, t] : wc->model().parameters()) t.copy_(src.at(name));
    }
    wc->weights_changed();
    // As between two training steps: earlier responses in the global suffix tree and the
    // speculation switch's measurements kept, their KV dropped by a weight version change.
    // Other prompts (task indices from 1 000 000), so nothing timed is drafted from itself.
    for (int k = 0; k < o.warm; ++k) {
      rollout::rollout_request r;
      r.request_id = 1'000'000'000 + static_cast<std::uint64_t>(k);
      r.group_id = r.task_index = 1'000'000 + static_cast<std::uint64_t>(w * o.warm + k);
      r.seed = r.task_index;
      r.max_new_tokens = static_cast<std::uint32_t>(o.max_new);
      r.temperature = o.temperature;
      r.top_p = cfg.algorithm.top_p;
      r.top_k = static_cast<std::uint32_t>(cfg.algorithm.top_k);
      wc->enqueue(r);
    }
    // The scheduler saw those rollouts finish: its generation estimate comes from them.
    while (!wc->idle())
      for (const auto& r : wc->step()) place.observe_generation(static_cast<std::int64_t>(r.response.size()));
    if (o.warm > 0) {
      wc->take_prefill_stats();
      wc->weights_changed();
    }
    workers.push_back(std::move(wc));
  }
  std::map<std::string, std::vector<rollout::rollout_request>> share;
  std::uint64_t id = 1;
  for (int k = 0; k < o.groups; ++k) {
    const auto prompt = rollout::first_prompt_tokens(task, format, ml::task_split::train, static_cast<std::uint64_t>(k));
    const auto chain = scheduler::block_chain(prompt, po.block_size);
    for (int s = 0; s < o.group_size; ++s, ++id) {
      rollout::rollout_request r;
      r.request_id = id;
      r.group_id = static_cast<std::uint64_t>(k);
      r.sample_index = static_cast<std::uint32_t>(s);
      r.task_index = static_cast<std::uint64_t>(k);
      r.seed = o.seed * 1000003 + static_cast<std::uint64_t>(k);
      r.max_new_tokens = static_cast<std::uint32_t>(o.max_new);
      r.temperature = o.temperature;
      r.top_p = cfg.algorithm.top_p;
      r.top_k = static_cast<std::uint32_t>(cfg.algorithm.top_k);
      auto got = place.place(
          scheduler::placement_request{id, r.group_id, static_cast<std::int64_t>(prompt.size()), chain});
      if (!got) throw std::logic_error(got.error);
      share[*got.worker].push_back(r);
    }
  }

  std::vector<worker_run> runs(static_cast<std::size_t>(o.workers));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w)
    threads.emplace_back([&, w] {
      auto& core = *workers[static_cast<std::size_t>(w)];
      auto& run = runs[static_cast<std::size_t>(w)];
      for (const auto& r : share[names[static_cast<std::size_t>(w)]]) core.enqueue(r);
      while (!core.idle())
        for (const auto& r : core.step()) {
          run.finish_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          for (const auto x : r.loss_mask) run.tokens += x;
          run.speculation += r.speculation;
        }
      run.end_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      run.prefill = core.take_prefill_stats();
    });
  for (auto& t : threads) t.join();

  measured m;
  std::uint64_t tokens = 0;
  std::int64_t prompt = 0, hit = 0;
  std::vector<double> latency;
  rollout::speculation_counts spec;
  for (std::size_t w = 0; w < runs.size(); ++w) {
    spec += runs[w].speculation;
    m.makespan_s = std::max(m.makespan_s, runs[w].end_s);
    tokens += runs[w].tokens;
    prompt += runs[w].prefill.prompt_tokens;
    hit += runs[w].prefill.hit_tokens + runs[w].prefill.parked_tokens;
    m.prefill_tokens += runs[w].prefill.computed_tokens;
    m.evictions += runs[w].prefill.evicted_blocks;
    latency.insert(latency.end(), runs[w].finish_s.begin(), runs[w].finish_s.end());
    m.per_worker.push_back(static_cast<std::int64_t>(share[names[w]].size()));
  }
  m.tokens_per_s = static_cast<double>(tokens) / m.makespan_s;
  m.acceptance = spec.drafted_tokens > 0
                     ? static_cast<double>(spec.accepted_tokens) / static_cast<double>(spec.drafted_tokens)
                     : 0.0;
  m.hit_rate = prompt > 0 ? static_cast<double>(hit) / static_cast<double>(prompt) : 0.0;
  const auto& st = place.stats();
  m.placement = st;
  m.generation_estimate = place.generation_estimate().value_or(0.0);
  m.estimated_hit_rate =
      st.prompt_tokens > 0 ? static_cast<double>(st.matched_tokens) / static_cast<double>(st.prompt_tokens) : 0.0;
  m.p50_s = sagc::nearest_rank_percentile(latency, 50);
  m.p99_s = sagc::nearest_rank_percentile(latency, 99);
  return m;
}

double median(std::vector<double> v) { return sagc::nearest_rank_percentile(std::move(v), 50); }

// Every policy in turn, --repeats rounds; prints the table and writes the JSON and the record's table.
int report(const experiment_config& cfg, const ml::model_dims& dims, const ml::named_tensors& weights,
           const ml::any_task& task, const ml::prompt_format& format, const bench_options& o,
           bench::bench_record& rec) {
  std::map<std::string, std::vector<double>> rate, ratio, hit, est, p50, p99, wall, acc;
  std::map<std::string, measured> last;
  for (int r = 0; r < o.repeats; ++r) {
    double base = 0;
    for (const auto& p : o.policies) {
      const measured m = run_policy(cfg, dims, weights, task, format, o, p);
      if (p == "round_robin") base = m.tokens_per_s;
      rate[p].push_back(m.tokens_per_s);
      ratio[p].push_back(base > 0 ? m.tokens_per_s / base : 0.0);
      hit[p].push_back(m.hit_rate);
      est[p].push_back(m.estimated_hit_rate);
      p50[p].push_back(m.p50_s);
      p99[p].push_back(m.p99_s);
      wall[p].push_back(m.makespan_s);
      acc[p].push_back(m.acceptance);
      last[p] = m;
    }
  }
  std::printf("%-24s %10s %8s %8s %8s %12s %10s %8s %8s %9s %7s  %s\n", "policy", "tokens/s", "speedup",
              "hit_rate", "est_hit", "prefill_tok", "evictions", "p50_s", "p99_s", "makespan", "accept",
              "rollouts per worker");
  json rows = json::array();
  bench::record_table& table = rec.add_table(
    "placement", "one step's rollouts placed across the workers per policy; medians of the rounds, round_robin the baseline",
    {{"policy", "policy"},
     {"tokens_per_s", "decode", "tokens/s", 1},
     {"speedup", "over round_robin", "x", 2},
     {"hit_rate", "prefix hit rate", "", 3},
     {"estimated_hit_rate", "estimated hit rate", "", 3},
     {"prefill_tokens", "prefill", "tokens"},
     {"evictions", "evictions"},
     {"p50_s", "p50 latency", "s", 2},
     {"p99_s", "p99 latency", "s", 2},
     {"makespan_s", "makespan", "s", 2},
     {"acceptance", "acceptance", "", 3},
     {"per_worker", "rollouts per worker"}});
  for (const auto& p : o.policies) {
    const auto& m = last[p];
    std::string per;
    for (const auto n : m.per_worker) per += (per.empty() ? "" : " ") + std::to_string(n);
    if (p == "round_robin")
      table.baseline_rows.push_back(table.rows.size());
    table.add_row({p, median(rate[p]), median(ratio[p]), median(hit[p]), median(est[p]), m.prefill_tokens,
                   m.evictions, median(p50[p]), median(p99[p]), median(wall[p]), median(acc[p]), per});
    std::printf("%-24s %10.1f %7.2fx %8.3f %8.3f %12lld %10lld %8.2f %8.2f %9.2f %7.3f  %s\n", p.c_str(),
                median(rate[p]), median(ratio[p]), median(hit[p]), median(est[p]),
                static_cast<long long>(m.prefill_tokens), static_cast<long long>(m.evictions), median(p50[p]),
                median(p99[p]), median(wall[p]), median(acc[p]), per.c_str());
    rows.push_back({{"policy", p},         {"tokens_per_s", rate[p]}, {"speedup", ratio[p]},
                    {"hit_rate", hit[p]},  {"estimated_hit_rate", est[p]},
                    {"p50_s", p50[p]},     {"p99_s", p99[p]},         {"makespan_s", wall[p]},
                    {"acceptance", acc[p]},
                    {"prefill_tokens", m.prefill_tokens},             {"evictions", m.evictions},
                    {"rollouts_per_worker", m.per_worker},
                    {"affinity_hits", m.placement.affinity_hits},
                    {"affinity_overrides", m.placement.affinity_overrides},
                    {"cache_routed", m.placement.cache_routed},
                    {"cache_balanced", m.placement.cache_balanced},
                    {"generation_estimate", m.generation_estimate}});
  }
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << json{{"workers", o.workers},
                {"families", o.families},
                {"prefix_tokens", o.prefix_tokens},
                {"question_tokens", o.question_tokens},
                {"groups", o.groups},
                {"group_size", o.group_size},
                {"max_new", o.max_new},
                {"temperature", o.temperature},
                {"repeats", o.repeats},
                {"warm", o.warm},
                {"cache_imbalance_threshold", o.cache_imbalance >= 0 ? o.cache_imbalance : cfg.scheduler.cache_imbalance_threshold},
                {"rows", rows}}
               .dump(1)
        << '\n';
  }
  return 0;
}

int run_bench(const experiment_config& cfg, bench_options o, bench::bench_record& rec) {
  ml::model_dims dims = model_dims_from(cfg);
  const ml::prompt_format format = prompt_format_from(cfg);
  if (o.temperature < 0) o.temperature = cfg.algorithm.temperature;
  if (o.config_task) {
    // The config's own task, weights and prefix-cache budget; its group size and tokens per
    // turn unless the flags say otherwise.
    if (o.group_size == 0) o.group_size = static_cast<int>(std::max<std::int64_t>(1, cfg.sagc.group_size));
    if (o.max_new == 0) o.max_new = static_cast<int>(cfg.task.max_new_tokens);
    if (o.warm < 0) o.warm = 32;
    const ml::any_task task = make_task_from(cfg);
    const ml::named_tensors weights = sorl::bench::source_weights(cfg);
    std::fprintf(stderr, "task: %s, %d groups x %d rollouts, %d new tokens per turn, %d workers, max_batch %lld, "
                 "temperature %g, prefix cache %lld bytes per worker\n",
                 cfg.task.name.c_str(), o.groups, o.group_size, o.max_new, o.workers,
                 static_cast<long long>(cfg.rollout.max_batch), o.temperature,
                 static_cast<long long>(cfg.rollout.prefix_cache_bytes));
    return report(cfg, dims, weights, task, format, o, rec);
  }
  if (o.group_size == 0) o.group_size = 4;
  if (o.warm < 0) o.warm = 0;
  if (o.max_new == 0) o.max_new = 16;
  const std::int64_t need = o.prefix_tokens + o.question_tokens + o.max_new + 2;
  if (need > dims.max_seq)
    throw std::invalid_argument(fmt::format("--prefix-tokens + --question-tokens + --max-new need {} tokens of "
                                            "context; the model has {}",
                                            need, dims.max_seq));
  const trace t = write_trace(o);
  if (!o.write_trace.empty()) {
    std::fprintf(stderr, "trace: %d prompts over %d families written to %s\n", o.groups, o.families,
                 o.write_trace.c_str());
    // The budget the in-process runs give each worker, for a config running the same trace.
    std::printf("prefix_cache_bytes = %lld\n", static_cast<long long>(cache_bytes(dims, o)));
    return 0;
  }
  ml::task_options to;
  to.eval_fraction = 0.0;
  to.jsonl.path = t.dataset.string();
  const ml::any_task task = ml::make_task("jsonl", to);
  // A fresh init: placement and prefill do not depend on what the model learned.
  const ml::named_tensors weights = ml::policy_model(dims, cfg.run.seed).parameters();
  std::fprintf(stderr,
               "trace: %d groups x %d rollouts over %d families (prefix %d + question %d tokens, %d new), "
               "%d workers, max_batch %lld, temperature %g\n",
               o.groups, o.group_size, o.families, o.prefix_tokens, o.question_tokens, o.max_new, o.workers,
               static_cast<long long>(cfg.rollout.max_batch), o.temperature);
  const int rc = report(cfg, dims, weights, task, format, o, rec);
  std::filesystem::remove(t.dataset);
  return rc;
}

const char* usage =
    "usage: route_bench CONFIG [--workers 2] [--families 16] [--prefix-tokens 384] [--question-tokens 24]\n"
    "                   [--groups 128] [--group-size 4] [--max-new 16] [--cache-families F/W]\n"
    "                   [--policies round_robin,least_loaded,cache_aware,sglang_cache_aware]\n"
    "                   [--repeats 1] [--warm N] [--cache-imbalance R] [--zipf 0] [--temperature T] [--seed 1] [--json FILE]\n"
    "                   [--record PATH]\n"
    "                   [--write-trace FILE: write the trace's prompts (JSONL, task \"jsonl\") and stop]\n"
    "                   [--task trace|config: the shared-prefix trace (default) or CONFIG's own task]\n"
    "       a policy may be POLICY+MODE, MODE = off | on | auto (speculative decoding)\n"
    "(bench/war/route_bench.cpp explains each figure)\n";

bench_options parse(int argc, char** argv) {
  bench_options o;
  for (int i = 2; i < argc; i += 2) {
    const std::string key = argv[i];
    if (key.rfind("--", 0) != 0) throw std::invalid_argument("expected an --option, got '" + key + "'");
    if (i + 1 >= argc) throw std::invalid_argument(key + " needs a value");
    const std::string name = key.substr(2), v = argv[i + 1];
    if (name == "workers") o.workers = static_cast<int>(integer(name, v, 1, 64));
    else if (name == "families") o.families = static_cast<int>(integer(name, v, 1, 100000));
    else if (name == "prefix-tokens") o.prefix_tokens = static_cast<int>(integer(name, v, 0, 1 << 20));
    else if (name == "question-tokens") o.question_tokens = static_cast<int>(integer(name, v, 1, 1 << 20));
    else if (name == "groups") o.groups = static_cast<int>(integer(name, v, 1, 1000000));
    else if (name == "group-size") o.group_size = static_cast<int>(integer(name, v, 1, 4096));
    else if (name == "max-new") o.max_new = static_cast<int>(integer(name, v, 1, 1 << 20));
    else if (name == "cache-families") o.cache_families = static_cast<int>(integer(name, v, 1, 100000));
    else if (name == "repeats") o.repeats = static_cast<int>(integer(name, v, 1, 100));
    else if (name == "cache-imbalance") o.cache_imbalance = sorl::bench::number(name, v, 0.0, 1e9);
    else if (name == "warm") o.warm = static_cast<int>(integer(name, v, 0, 100000));
    else if (name == "zipf") o.zipf = sorl::bench::number(name, v, 0.0, 10.0);
    else if (name == "temperature") {
      o.temperature = sorl::bench::number(name, v, 0.0, 100.0);
      if (o.temperature > 0 && o.temperature < ml::min_temperature)
        throw std::invalid_argument(fmt::format("--temperature: 0 (greedy) or at least {}", ml::min_temperature));
    }
    else if (name == "seed") o.seed = static_cast<std::uint64_t>(integer(name, v, 0, 1LL << 62));
    else if (name == "json") o.json_path = v;
    else if (name == "record") o.record = v;
    else if (name == "write-trace") o.write_trace = v;
    else if (name == "task") {
      if (v != "trace" && v != "config")
        throw std::invalid_argument("--task " + v + ": expected trace (the shared-prefix trace) or config");
      o.config_task = v == "config";
    }
    else if (name == "policies") {
      o.policies = split(v);
      for (const auto& p : o.policies) arm_of(p);
      if (o.policies.empty() || o.policies[0] != "round_robin")
        throw std::invalid_argument("--policies must start with round_robin (the baseline)");
      for (std::size_t i = 0; i < o.policies.size(); ++i)
        if (std::find(o.policies.begin(), o.policies.begin() + static_cast<std::ptrdiff_t>(i), o.policies[i]) !=
            o.policies.begin() + static_cast<std::ptrdiff_t>(i))
          throw std::invalid_argument("--policies: " + o.policies[i] + " given twice");
    } else
      throw std::invalid_argument("unknown option " + key);
  }
  if (!o.config_task && o.warm > 0)
    throw std::invalid_argument("--warm goes with --task config (the trace has no other prompts to warm with)");
  if (o.config_task && !o.write_trace.empty())
    throw std::invalid_argument("--write-trace writes the shared-prefix trace; it does not go with --task config");
  if (!o.json_path.empty()) {
    std::ofstream probe(o.json_path);
    if (!probe) throw std::invalid_argument("--json " + o.json_path + ": cannot write");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string first = argc > 1 ? argv[1] : "";
  if (first == "--help" || first == "-h") {
    std::fputs(usage, stdout);
    return 0;
  }
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  // One core per worker thread: BLAS and OpenMP pools of their own would make the workers share
  // cores (and spin). Their sizes are read when the libraries load, so the bench restarts
  // itself once with them set.
  if (std::getenv("OMP_NUM_THREADS") == nullptr || std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", "1", 0);
    ::setenv("OPENBLAS_NUM_THREADS", "1", 0);
    ::execv("/proc/self/exe", argv);
    std::perror("route_bench: restarting with OMP_NUM_THREADS=1");
    return 1;
  }
  // Large temporaries (a long prompt's attention scores) otherwise come from mmap and go back
  // on free; the page faults of two workers then serialise on the kernel's memory map lock.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 30);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  try {
    at::set_num_threads(1);
    const bench_options o = parse(argc, argv);
    bench::bench_record rec("route", argc, argv);
    rec.set_threads(o.workers);
    rec.set_runtime(bench::ml_record_runtime());
    rec.set_parameter("config", argv[1]);
    rec.set_parameter("workers", o.workers);
    rec.set_parameter("task", o.config_task ? "config" : "trace");
    rec.set_parameter("groups", o.groups);
    rec.set_parameter("repeats", o.repeats);
    const experiment_config cfg = load_config(argv[1], role_names(builtin_roles()));
    const int rc = run_bench(cfg, o, rec);
    // --write-trace measures nothing.
    const std::string path = o.write_trace.empty() ? bench::record_path("route", o.record) : "none";
    if (rec.write(path)) std::fprintf(stderr, "record: %s\n", path.c_str());
    return rc;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "route_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "route_bench: %s\n", e.what());
    return 1;
  }
}
