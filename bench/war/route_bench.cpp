// route_bench: placement of one step's rollouts across rollout workers at high load, per
// scheduler policy, on the same trace (ARCHITECTURE.md §6 WAR, cache-aware scheduling).
//
//   route_bench CONFIG [--workers 2] [--families 16] [--prefix-tokens 384] [--question-tokens 24]
//       [--groups 128] [--group-size 4] [--max-new 16] [--cache-families F/W]
//       [--policies round_robin,least_loaded,cache_aware,sglang_cache_aware] [--repeats 1]
//       [--seed 1] [--json FILE]
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
// start: every rollout is submitted then) and the rollouts each worker ran. Tokens are the same
// under every policy (a rollout's tokens depend on its prompt, seed and stream only), so the
// policies decode the same work.

#include "actors/common/train_setup.hpp"
#include "actors/roles.hpp"
#include "actors/rollout/worker_core.hpp"
#include "actors/sagc/timing.hpp"
#include "actors/scheduler/placement.hpp"
#include "actors/scheduler/prefix_index.hpp"
#include "bench/war/flag_values.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/kv_cache.hpp"
#include "runtime/ml/torch_compat.hpp"
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
  int group_size = 4;
  int max_new = 16;
  int cache_families = 0; // 0 = families / workers
  int repeats = 1;
  double zipf = 0;  // family popularity ∝ 1 / rank^zipf; 0 = uniform
  std::uint64_t seed = 1;
  std::vector<std::string> policies{"round_robin", "least_loaded", "cache_aware", "sglang_cache_aware"};
  std::string json_path;
};

scheduler::placement_policy policy_of(const std::string& name) {
  if (name == "round_robin") return scheduler::placement_policy::round_robin;
  if (name == "least_loaded") return scheduler::placement_policy::least_loaded;
  if (name == "cache_aware") return scheduler::placement_policy::cache_aware;
  if (name == "sglang_cache_aware") return scheduler::placement_policy::sglang_cache_aware;
  throw std::invalid_argument("--policies: unknown policy \"" + name +
                              "\" (round_robin, least_loaded, cache_aware, sglang_cache_aware)");
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
  t.dataset = std::filesystem::temp_directory_path() / fmt::format("sorl_route_bench_{}.jsonl", ::getpid());
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

struct worker_run {
  std::vector<double> finish_s;  // per rollout, from the common start
  double end_s = 0;
  std::uint64_t tokens = 0;
  ml::prefill_stats prefill;
};

struct measured {
  double tokens_per_s = 0, makespan_s = 0, hit_rate = 0, estimated_hit_rate = 0, p50_s = 0, p99_s = 0;
  std::int64_t prefill_tokens = 0, evictions = 0;
  std::vector<std::int64_t> per_worker;
};

measured run_policy(const experiment_config& cfg, const ml::model_dims& dims, const ml::named_tensors& weights,
                    const ml::any_task& task, const ml::prompt_format& format, const bench_options& o,
                    const std::string& policy) {
  const std::int64_t per_token = dims.n_layers * 2 * dims.n_kv_heads * dims.head_dim() * 4;
  const int cache_families = o.cache_families > 0 ? o.cache_families : std::max(1, o.families / o.workers);
  // Each family's prefix, and the question and completion blocks the finished rollouts add.
  const std::int64_t cache_tokens =
      static_cast<std::int64_t>(cache_families) * (o.prefix_tokens + 2 * (o.question_tokens + o.max_new) + 32);
  rollout::worker_options wo = rollout::worker_options_from(cfg);
  wo.speculative = rollout::speculation_mode::off;
  wo.prefix_cache_bytes = cache_tokens * per_token;

  // As the scheduler shell builds them from [scheduler], with the policy under test.
  scheduler::placement_options po = scheduler::placement_options_from(
      cfg, rollout::worker_core::prefix_cache_tokens(dims, wo.prefix_cache_bytes) / ml::kv_cache_options{}.block_size);
  po.policy = policy_of(policy);
  po.group_affinity = po.policy != scheduler::placement_policy::sglang_cache_aware;  // as placement_options_from
  scheduler::placement place(po);
  std::vector<std::string> names;
  for (int w = 0; w < o.workers; ++w) {
    names.push_back(fmt::format("w{}", w));
    place.join(names.back());
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
      r.temperature = 1.0;
      auto got = place.place(
          scheduler::placement_request{id, r.group_id, static_cast<std::int64_t>(prompt.size()), chain});
      if (!got) throw std::logic_error(got.error);
      share[*got.worker].push_back(r);
    }
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
    workers.push_back(std::move(wc));
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
        }
      run.end_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      run.prefill = core.take_prefill_stats();
    });
  for (auto& t : threads) t.join();

  measured m;
  std::uint64_t tokens = 0;
  std::int64_t prompt = 0, hit = 0;
  std::vector<double> latency;
  for (std::size_t w = 0; w < runs.size(); ++w) {
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
  m.hit_rate = prompt > 0 ? static_cast<double>(hit) / static_cast<double>(prompt) : 0.0;
  const auto& st = place.stats();
  m.estimated_hit_rate =
      st.prompt_tokens > 0 ? static_cast<double>(st.matched_tokens) / static_cast<double>(st.prompt_tokens) : 0.0;
  m.p50_s = sagc::nearest_rank_percentile(latency, 50);
  m.p99_s = sagc::nearest_rank_percentile(latency, 99);
  return m;
}

double median(std::vector<double> v) { return sagc::nearest_rank_percentile(std::move(v), 50); }

int run_bench(const experiment_config& cfg, const bench_options& o) {
  ml::model_dims dims = model_dims_from(cfg);
  const std::int64_t need = o.prefix_tokens + o.question_tokens + o.max_new + 2;
  if (need > dims.max_seq)
    throw std::invalid_argument(fmt::format("--prefix-tokens + --question-tokens + --max-new need {} tokens of "
                                            "context; the model has {}",
                                            need, dims.max_seq));
  const trace t = write_trace(o);
  ml::task_options to;
  to.eval_fraction = 0.0;
  to.jsonl.path = t.dataset.string();
  const ml::any_task task = ml::make_task("jsonl", to);
  const ml::prompt_format format = prompt_format_from(cfg);
  const ml::named_tensors weights = ml::policy_model(dims, cfg.run.seed).parameters();
  std::fprintf(stderr,
               "trace: %d groups x %d rollouts over %d families (prefix %d + question %d tokens, %d new), "
               "%d workers, max_batch %lld\n",
               o.groups, o.group_size, o.families, o.prefix_tokens, o.question_tokens, o.max_new, o.workers,
               static_cast<long long>(cfg.rollout.max_batch));

  std::map<std::string, std::vector<double>> rate, ratio, hit, est, p50, p99, wall;
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
      last[p] = m;
    }
  }
  std::filesystem::remove(t.dataset);
  std::printf("%-19s %10s %8s %8s %8s %12s %10s %8s %8s %9s  %s\n", "policy", "tokens/s", "speedup", "hit_rate",
              "est_hit", "prefill_tok", "evictions", "p50_s", "p99_s", "makespan", "rollouts per worker");
  json rows = json::array();
  for (const auto& p : o.policies) {
    const auto& m = last[p];
    std::string per;
    for (const auto n : m.per_worker) per += (per.empty() ? "" : " ") + std::to_string(n);
    std::printf("%-19s %10.1f %7.2fx %8.3f %8.3f %12lld %10lld %8.2f %8.2f %9.2f  %s\n", p.c_str(), median(rate[p]),
                median(ratio[p]), median(hit[p]), median(est[p]), static_cast<long long>(m.prefill_tokens),
                static_cast<long long>(m.evictions), median(p50[p]), median(p99[p]), median(wall[p]), per.c_str());
    rows.push_back({{"policy", p},         {"tokens_per_s", rate[p]}, {"speedup", ratio[p]},
                    {"hit_rate", hit[p]},  {"estimated_hit_rate", est[p]},
                    {"p50_s", p50[p]},     {"p99_s", p99[p]},         {"makespan_s", wall[p]},
                    {"prefill_tokens", m.prefill_tokens},             {"evictions", m.evictions},
                    {"rollouts_per_worker", m.per_worker}});
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
                {"repeats", o.repeats},
                {"rows", rows}}
               .dump(1)
        << '\n';
  }
  return 0;
}

const char* usage =
    "usage: route_bench CONFIG [--workers 2] [--families 16] [--prefix-tokens 384] [--question-tokens 24]\n"
    "                   [--groups 128] [--group-size 4] [--max-new 16] [--cache-families F/W]\n"
    "                   [--policies round_robin,least_loaded,cache_aware,sglang_cache_aware]\n"
    "                   [--repeats 1] [--zipf 0] [--seed 1] [--json FILE]\n"
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
    else if (name == "zipf") o.zipf = sorl::bench::number(name, v, 0.0, 10.0);
    else if (name == "seed") o.seed = static_cast<std::uint64_t>(integer(name, v, 0, 1LL << 62));
    else if (name == "json") o.json_path = v;
    else if (name == "policies") {
      o.policies = split(v);
      for (const auto& p : o.policies) policy_of(p);
      if (o.policies.empty() || o.policies[0] != "round_robin")
        throw std::invalid_argument("--policies must start with round_robin (the baseline)");
    } else
      throw std::invalid_argument("unknown option " + key);
  }
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
    const experiment_config cfg = load_config(argv[1], role_names(builtin_roles()));
    return run_bench(cfg, o);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "route_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "route_bench: %s\n", e.what());
    return 1;
  }
}
