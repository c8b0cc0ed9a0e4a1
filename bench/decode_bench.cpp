// Decode throughput of sorl's generator (paged KV cache, continuous batching, per-sample
// sampling) for the model presets at several batch sizes, next to the same decode loop on
// reference_llama (bench/decode_parity.hpp: dense preallocated KV cache, driven from C++ with
// no interpreter in the loop), the strong baseline, once with at::linear and once with
// sorl's oneDNN routing (which GEMM wins depends on the BLAS and threads). Each configuration
// runs --repeats times, the three alternating so that load from other processes hits all
// alike; one JSON line per configuration carries every run's tokens/s.
// bench/decode_reference.py runs the same configurations through an eager PyTorch loop and
// prints them side by side as median and min-max (bench/decode.sh does all of it).
//
// With --dump DIR it also writes the parity fixture of the tiny preset: weights, a batch of
// token ids, sorl's logits (full and cached paths) and the baseline's, for the Python
// reference to compare; it checks sorl against the baseline itself first and exits 1 when
// they differ by more than parity_tolerance.
//
// The run's record (bench/record.hpp: table "decode", or "mixed" with --mixed; decode_reference.py
// adds the eager loop's columns) goes to --record PATH, else $SORL_BENCH_RECORD, else runs/bench/.

#include "bench/decode_parity.hpp"
#include "bench/record_ml.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/policy/model.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sorl::ml;
using sorl::bench::reference_llama;

namespace {

struct options {
  std::vector<std::string> presets = {"tiny", "50m"};
  std::vector<std::int64_t> batches = {1, 8, 64};
  std::int64_t prompt = 8;
  std::int64_t new_tiny = 64;
  std::int64_t new_50m = 32;  // capped at max(8, 256 / batch): the eager reference is slow here
  std::int64_t repeats = 5;
  std::string gemm = "auto";
  int threads = 2;
  std::string json;
  std::string dump;
  std::string record;
  bool mixed = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void usage() {
  std::cerr << "usage: decode_bench [--quick] [--presets tiny,50m] [--batches 1,8,64] [--prompt 8]\n"
               "                    [--new-tiny 64] [--new-50m 32] [--repeats 5] [--threads 2]\n"
               "                    [--gemm auto|aten] [--json FILE] [--dump DIR] [--mixed] [--record FILE]\n"
               "  --quick     tiny preset, batches 1 and 8, 3 repeats (options after it still apply)\n"
               "  --repeats   timed runs per configuration and implementation; medians are reported\n"
               "  --mixed     instead: time of a step that admits one prefill of 8..1024 tokens next to\n"
               "              batch - 1 decoding samples (tiny-2k), in one forward pass and in two\n";
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") {
      o.presets = {"tiny"};
      o.batches = {1, 8};
      o.repeats = 3;
    } else if (a == "--presets") o.presets = split(value());
    else if (a == "--batches") {
      o.batches.clear();
      for (const auto& b : split(value())) o.batches.push_back(std::stoll(b));
    } else if (a == "--prompt") o.prompt = std::stoll(value());
    else if (a == "--new-tiny") o.new_tiny = std::stoll(value());
    else if (a == "--new-50m") o.new_50m = std::stoll(value());
    else if (a == "--repeats") o.repeats = std::stoll(value());
    else if (a == "--threads") o.threads = std::stoi(value());
    else if (a == "--gemm") o.gemm = value();
    else if (a == "--json") o.json = value();
    else if (a == "--dump") o.dump = value();
    else if (a == "--record") o.record = value();
    else if (a == "--mixed") o.mixed = true;
    else if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else {
      usage();
      throw std::invalid_argument("unknown argument " + a);
    }
  }
  if (o.gemm != "auto" && o.gemm != "aten") throw std::invalid_argument("--gemm must be auto or aten, got " + o.gemm);
  if (o.repeats < 1) throw std::invalid_argument("--repeats must be >= 1");
  if (o.prompt < 1 || o.new_tiny < 2 || o.new_50m < 2)
    throw std::invalid_argument("--prompt must be >= 1 and --new-tiny / --new-50m >= 2");
  return o;
}

std::vector<std::int32_t> random_prompt(std::int64_t n, std::int64_t vocab, std::uint64_t salt) {
  std::vector<std::int32_t> out;
  std::uint64_t x = salt * 0x9E3779B97F4A7C15ULL + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    out.push_back(static_cast<std::int32_t>((x * 0x2545F4914F6CDD1DULL >> 33) % static_cast<std::uint64_t>(vocab)));
  }
  return out;
}

using clock_type = std::chrono::steady_clock;

double seconds(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Steady-decode tokens/s of sorl's generator: B single-sample requests with distinct prompts,
// sampled at temperature 1 without stop tokens so that every sample runs exactly
// `new_tokens`. The first step (prefill + first token) is not timed.
double run_sorl(const policy_model& m, std::int64_t batch, std::int64_t prompt, std::int64_t new_tokens) {
  generator_options go;
  go.max_batch = batch;
  go.cache.block_size = 16;
  go.cache.initial_blocks = batch * ((prompt + new_tokens + 15) / 16) + 1;
  generator g(m, go);
  for (std::int64_t b = 0; b < batch; ++b) {
    sampling_params p;
    p.temperature = 1.0f;
    p.max_new_tokens = new_tokens;
    p.seed = static_cast<std::uint64_t>(b);
    g.submit(random_prompt(prompt, m.dims().vocab, static_cast<std::uint64_t>(b) + 1), p);
  }
  g.step();
  const auto t0 = clock_type::now();
  std::int64_t steps = 0;
  while (!g.idle()) {
    g.step();
    ++steps;
  }
  return static_cast<double>(steps * batch) / seconds(t0, clock_type::now());
}

// The same protocol on the baseline: prefill (not timed), then new_tokens - 1 steps of
// temperature-1 sampling with the sampled token's log-prob (what a rollout records) and a
// one-token forward into the preallocated cache.
double run_reference(const reference_llama& ref, std::int64_t vocab, std::int64_t batch, std::int64_t prompt,
                     std::int64_t new_tokens) {
  at::InferenceMode inference;
  at::Tensor ids = at::empty({batch, prompt}, at::kLong);
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto p = random_prompt(prompt, vocab, static_cast<std::uint64_t>(b) + 1);
    for (std::int64_t t = 0; t < prompt; ++t) ids[b][t] = p[static_cast<std::size_t>(t)];
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  auto cache = ref.new_cache(batch, prompt + new_tokens);
  at::Tensor logits = ref.forward(ids, &cache, 0).select(1, prompt - 1);
  const auto t0 = clock_type::now();
  for (std::int64_t i = 0; i + 1 < new_tokens; ++i) {
    const at::Tensor logp = at::log_softmax(logits, -1);
    const at::Tensor tok = at::multinomial(logp.exp(), 1, false, gen);
    (void)logp.gather(1, tok);  // the sampled log-prob, as sorl's sampler records it
    logits = ref.forward(tok, &cache, prompt + i).select(1, 0);
  }
  (void)logits.sum().item<float>();  // the last step's result is used
  return static_cast<double>((new_tokens - 1) * batch) / seconds(t0, clock_type::now());
}

// Seconds of the one step() that admits a prompt of `prefill` tokens next to batch - 1 samples
// decoding at ~100 tokens of context each; separate = generator_options::separate_prefill_tokens.
double run_mixed_step(const policy_model& m, std::int64_t batch, std::int64_t prefill, std::int64_t separate) {
  generator_options go;
  go.max_batch = batch;
  go.separate_prefill_tokens = separate;
  go.cache.initial_blocks = batch * 11 + prefill / 16 + 2;  // no pool growth in the timed step
  generator g(m, go);
  sampling_params p;
  p.temperature = 1.0f;
  p.max_new_tokens = 64;
  for (std::int64_t b = 0; b + 1 < batch; ++b) {
    p.seed = static_cast<std::uint64_t>(b);
    g.submit(random_prompt(100, m.dims().vocab, static_cast<std::uint64_t>(b) + 1), p);
  }
  g.step();
  g.step();
  g.submit(random_prompt(prefill, m.dims().vocab, 999), p);
  const auto t0 = clock_type::now();
  g.step();
  return seconds(t0, clock_type::now());
}

// --mixed: median step time of a prefill joining decoding samples, one pass vs two.
void mixed(const options& o, sorl::bench::bench_record& rec) {
  const policy_model m(preset("tiny-2k"), 0, 0.02);
  auto& table = rec.add_table("mixed", "median step time of one prefill joining batch - 1 decoding samples (tiny-2k)",
                              {{"batch", "batch"},
                               {"prefill", "prefill", "tokens"},
                               {"one_pass_ms", "one pass", "ms", 2},
                               {"two_passes_ms", "two passes", "ms", 2, true},
                               {"ratio", "one / two", "", 2}});
  std::printf("%6s %8s %14s %14s %7s\n", "batch", "prefill", "one pass ms", "two passes ms", "ratio");
  run_mixed_step(m, 8, 8, 2);  // warm up
  for (const std::int64_t b : o.batches) {
    for (const std::int64_t n : {8, 16, 32, 64, 256, 1024}) {
      std::vector<double> one, two;
      for (std::int64_t k = 0; k < o.repeats; ++k) {
        one.push_back(run_mixed_step(m, b, n, 1 << 30));
        two.push_back(run_mixed_step(m, b, n, 2));
      }
      std::sort(one.begin(), one.end());
      std::sort(two.begin(), two.end());
      const double a = one[one.size() / 2] * 1e3, c = two[two.size() / 2] * 1e3;
      std::printf("%6lld %8lld %14.2f %14.2f %7.2f\n", static_cast<long long>(b), static_cast<long long>(n), a, c, a / c);
      table.add_row({b, n, a, c, a / c});
    }
  }
}

std::string json_list(const std::vector<double>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{:.3f}", i ? "," : "", v[i]);
  return out + "]";
}

void write_raw(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

// The parity fixture: the tiny preset with weights of std 0.3 (attention far from uniform, so
// a wrong mask or position shows in the logits), 3 x 24 token ids, and the logits of sorl's
// full forward, of its cached path (ragged prefill of 5, 9, 13 tokens, then chunks of 1-3)
// and of the baseline. Returns false when sorl and the baseline are not within parity.
bool dump(const std::string& dir) {
  const model_dims d = preset("tiny");
  const policy_model m(d, 7, 0.3);
  std::ofstream index(dir + "/params.txt");
  for (std::size_t i = 0; i < m.parameters().size(); ++i) {
    const auto& [name, t] = m.parameters()[i];
    index << name;
    for (const auto s : t.sizes()) index << ' ' << s;
    index << '\n';
    write_raw(fmt::format("{}/param_{}.bin", dir, i), t);
  }
  const std::int64_t B = 3, T = 24;
  at::Tensor ids = at::empty({B, T}, at::kLong);
  for (std::int64_t b = 0; b < B; ++b) {
    const auto p = random_prompt(T, d.vocab, static_cast<std::uint64_t>(100 + b));
    for (std::int64_t t = 0; t < T; ++t) ids[b][t] = p[static_cast<std::size_t>(t)];
  }
  at::NoGradGuard no_grad;
  const at::Tensor full = m.forward(ids);
  const at::Tensor cached = sorl::bench::cached_logits_in_chunks(m, ids, {5, 9, 13});
  const at::Tensor baseline = reference_llama(d, m.parameters()).forward(ids);
  write_raw(dir + "/ids.bin", ids);
  write_raw(dir + "/logits_full.bin", full);
  write_raw(dir + "/logits_cached.bin", cached);
  write_raw(dir + "/logits_libtorch.bin", baseline);
  std::ofstream meta(dir + "/meta.txt");
  meta << B << ' ' << T << ' ' << d.vocab << ' ' << d.d_model << ' ' << d.n_layers << ' ' << d.n_heads << ' '
       << d.n_kv_heads << ' ' << d.d_ff << ' ' << d.rope_theta << ' ' << d.norm_eps << ' '
       << sorl::bench::parity_tolerance << '\n';
  const double scale = baseline.abs().max().item<double>();
  bool ok = true;
  for (const auto& [what, t] : {std::pair{"full", full}, std::pair{"cached", cached}}) {
    const double diff = (t - baseline).abs().max().item<double>();
    const bool pass = sorl::bench::within_parity(diff, scale);
    ok = ok && pass;
    std::cerr << fmt::format("decode_bench: parity, sorl {} vs libtorch loop model: max |delta| {:.2e} (max |logit| "
                             "{:.2f}, tolerance {:.0e} x max(1, max |logit|)): {}\n",
                             what, diff, scale, sorl::bench::parity_tolerance, pass ? "PASS" : "FAIL");
  }
  return ok;
}

}  // namespace

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  sorl::bench::bench_record rec("decode", argc, argv);
  at::set_num_threads(o.threads);
  rec.set_threads(o.threads);
  rec.set_runtime(sorl::bench::ml_record_runtime());
  rec.set_parameter("repeats", o.repeats);
  rec.set_parameter("prompt_tokens", o.prompt);
  rec.set_parameter("gemm", o.gemm);
  const std::string record_path = sorl::bench::record_path("decode", o.record);
  auto write_record = [&] {
    if (rec.write(record_path))
      std::cerr << "record: " << record_path << "\n";
  };
  if (o.mixed) {
    mixed(o, rec);
    write_record();
    return 0;
  }
  auto& table = rec.add_table(
    "decode", "steady decode of the presets, tokens/s: medians of the repeats, the libtorch loop the baseline",
    {{"preset", "preset"},
     {"params_m", "params", "M", 2},
     {"batch", "batch"},
     {"new_tokens", "new", "tokens"},
     {"sorl_tok_s", "sorl", "tokens/s", 1},
     {"sorl_min", "sorl min", "tokens/s", 0},
     {"sorl_max", "sorl max", "tokens/s", 0},
     {"loop_aten_tok_s", "libtorch loop, at::linear", "tokens/s", 1, true},
     {"loop_onednn_tok_s", "libtorch loop, oneDNN", "tokens/s", 1, true},
     {"sorl_over_loop", "sorl / faster loop", "x", 2}});
  std::FILE* json = o.json.empty() ? stdout : std::fopen(o.json.c_str(), "w");
  if (json == nullptr) throw std::runtime_error("cannot open " + o.json);
  if (!o.dump.empty() && !dump(o.dump)) return 1;
  for (const auto& name : o.presets) {
    const model_dims d = preset(name);
    policy_model m(d, 0, 0.02);
    m.set_decode_gemm(o.gemm == "aten" ? decode_gemm::aten : decode_gemm::automatic);
    reference_llama ref(d, m.parameters());
    run_sorl(m, 1, o.prompt, 4);  // warm up allocator and thread pool
    run_reference(ref, d.vocab, 1, o.prompt, 4);
    for (const std::int64_t b : o.batches) {
      const std::int64_t new_tokens =
          name == "tiny" ? o.new_tiny : std::min(o.new_50m, std::max<std::int64_t>(8, 256 / b));
      std::vector<double> sorl_runs, ref_runs, ref_onednn_runs;
      double load = -1.0;  // 1-minute load average when the runs start: other work skews them
      if (getloadavg(&load, 1) != 1) load = -1.0;
      for (std::int64_t k = 0; k < o.repeats; ++k) {
        sorl_runs.push_back(run_sorl(m, b, o.prompt, new_tokens));
        ref.use_onednn(false);
        ref_runs.push_back(run_reference(ref, d.vocab, b, o.prompt, new_tokens));
        ref.use_onednn(true);
        ref_onednn_runs.push_back(run_reference(ref, d.vocab, b, o.prompt, new_tokens));
      }
      std::fprintf(json,
                   "{\"preset\":\"%s\",\"vocab\":%lld,\"d_model\":%lld,\"n_layers\":%lld,"
                   "\"n_heads\":%lld,\"n_kv_heads\":%lld,\"d_ff\":%lld,\"rope_theta\":%g,\"norm_eps\":%g,"
                   "\"params\":%lld,\"batch\":%lld,\"prompt\":%lld,\"new_tokens\":%lld,\"threads\":%d,\"gemm\":\"%s\","
                   "\"repeats\":%lld,\"sorl_tokens_per_s\":%s,\"libtorch_tokens_per_s\":%s,"
                   "\"libtorch_onednn_tokens_per_s\":%s,\"load_1min\":%.2f}\n",
                   name.c_str(), static_cast<long long>(d.vocab), static_cast<long long>(d.d_model),
                   static_cast<long long>(d.n_layers), static_cast<long long>(d.n_heads),
                   static_cast<long long>(d.n_kv_heads), static_cast<long long>(d.d_ff), d.rope_theta,
                   d.norm_eps, static_cast<long long>(d.parameter_count()), static_cast<long long>(b),
                   static_cast<long long>(o.prompt), static_cast<long long>(new_tokens), o.threads, o.gemm.c_str(),
                   static_cast<long long>(o.repeats), json_list(sorl_runs).c_str(), json_list(ref_runs).c_str(),
                   json_list(ref_onednn_runs).c_str(), load);
      std::fflush(json);
      const double loop = std::max(median_of(ref_runs), median_of(ref_onednn_runs));
      table.add_row({name, static_cast<double>(d.parameter_count()) / 1e6, b, new_tokens, median_of(sorl_runs),
                     *std::min_element(sorl_runs.begin(), sorl_runs.end()),
                     *std::max_element(sorl_runs.begin(), sorl_runs.end()), median_of(ref_runs),
                     median_of(ref_onednn_runs), median_of(sorl_runs) / loop});
    }
  }
  if (json != stdout) std::fclose(json);
  write_record();
  return 0;
} catch (const std::exception& e) {
  std::cerr << "decode_bench: " << e.what() << '\n';
  return 1;
}
