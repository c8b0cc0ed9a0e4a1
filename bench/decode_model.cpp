// Decode throughput of a real model (a Hugging Face directory) on this machine, each figure
// printed next to this machine's limits measured in the same run:
//   memory bound  = bytes a decode step must read (the bf16 weights of every linear layer and
//                   the LM head, the norms, the KV cache of the batch) / streaming read
//                   bandwidth, measured here with the bench's threads;
//   compute bound = FLOPs of a decode step (2 per weight per token, plus attention) / the
//                   fastest fp32 GEMM rate measured here on the model's own shapes;
// and next to sorl's previous decode path (decode_gemm::fp32_image: the fp32 image of the
// weights through oneDNN), measured alternately with the current one.
//   steady:   tokens/s of one-token decode steps (forward_cached) of B sequences at about
//             prompt + new/2 cached positions, logits only;
//   rollouts: tokens/s of whole rollouts as a worker runs them: one group of B samples of one
//             prompt through the generator (prefill, decode, sampling at --temperature, no
//             stop token: every sample runs --new tokens).
// --profile B,... adds a table of one decode step's time by kind of operation; --gemm-rows
// R,... one of bf16_linear's GFLOP/s against at::linear's at those row counts.
// bench/decode_model.sh runs it with the thread settings and, when the bench virtualenv exists,
// the Hugging Face and llama.cpp baselines. --record PATH writes the run's record
// (bench/record.hpp; tables "limits", "gemm", "decode", "profile"), by default under runs/bench/.

#include "bench/record_ml.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/policy/decode_kernels.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/policy/kv_cache.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/policy/sampler.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sorl::ml;

namespace {

struct options {
  std::string model_dir;
  std::vector<std::int64_t> batches = {1, 8, 32, 64};
  std::vector<std::int64_t> profile = {1, 32};
  std::vector<std::int64_t> gemm_rows;
  std::int64_t prompt = 32;
  std::int64_t new_tokens = 64;
  std::int64_t repeats = 3;
  double temperature = 0.7;
  int threads = 2;
  std::string json;
  std::string prompt_out;
  std::string record;
  bool baseline = true;
};

std::vector<std::int64_t> split_ints(const std::string& s) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

void usage() {
  std::cerr << "usage: decode_model_bench MODEL_DIR [--batches 1,8,32,64] [--profile 1,32] [--prompt 32]\n"
               "                          [--new 64] [--repeats 3] [--temperature 0.7] [--threads 2]\n"
               "                          [--no-baseline] [--json FILE] [--prompt-out FILE] [--record FILE]\n"
               "                          [--gemm-rows 1,8,32,64,256]\n"
               "  --batches ''   no decode table; --profile '' no profile\n"
               "  --gemm-rows    bf16_linear against at::linear on the fp32 image through the model's\n"
               "                 shapes at each row count: a table of its own (\"gemm\")\n"
               "  --prompt-out  writes the rollouts' prompt as a JSONL line {\"ids\": [...]}, for\n"
               "                bench/decode_baselines.py --prompts\n";
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--batches") o.batches = split_ints(value());
    else if (a == "--profile") o.profile = split_ints(value());
    else if (a == "--gemm-rows") o.gemm_rows = split_ints(value());
    else if (a == "--prompt") o.prompt = std::stoll(value());
    else if (a == "--new") o.new_tokens = std::stoll(value());
    else if (a == "--repeats") o.repeats = std::stoll(value());
    else if (a == "--temperature") o.temperature = std::stod(value());
    else if (a == "--threads") o.threads = std::stoi(value());
    else if (a == "--json") o.json = value();
    else if (a == "--prompt-out") o.prompt_out = value();
    else if (a == "--record") o.record = value();
    else if (a == "--no-baseline") o.baseline = false;
    else if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else if (!a.empty() && a[0] != '-' && o.model_dir.empty()) o.model_dir = a;
    else {
      usage();
      throw std::invalid_argument("unknown argument " + a);
    }
  }
  if (o.model_dir.empty()) {
    usage();
    throw std::invalid_argument("a model directory is needed");
  }
  if (o.repeats < 1 || o.prompt < 1 || o.new_tokens < 2 || o.threads < 1)
    throw std::invalid_argument("--repeats, --prompt, --threads must be >= 1 and --new >= 2");
  return o;
}

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point a) { return std::chrono::duration<double>(clock_type::now() - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<std::int32_t> random_tokens(std::int64_t n, std::int64_t vocab, std::uint64_t salt) {
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

// ---------------------------------------------------------------------------------------------
// The machine's limits

#if defined(__x86_64__)
__attribute__((target("avx2"))) std::uint64_t sum_chunk(const std::uint64_t* p, std::int64_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  std::uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) s += p[i];
  return s;
}
#else
std::uint64_t sum_chunk(const std::uint64_t* p, std::int64_t n) {
  std::uint64_t s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}
#endif

// Best of `reps` full reads of a `bytes` buffer, split over at::parallel_for's threads. GB/s.
double stream_read_gbs(std::int64_t bytes, int reps) {
  const std::int64_t n = bytes / 8;
  at::Tensor buf = at::ones({n}, at::kLong);  // 64-byte aligned by libtorch's allocator
  const auto* p = reinterpret_cast<const std::uint64_t*>(buf.data_ptr<std::int64_t>());
  double best = 0.0;
  std::uint64_t sink = 0;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<std::uint64_t> part(static_cast<std::size_t>(at::get_num_threads()) * 8, 0);
    const auto t0 = clock_type::now();
    const std::int64_t chunk = 1 << 16;  // 512 KB
    std::atomic<std::uint64_t> total{0};
    at::parallel_for(0, (n + chunk - 1) / chunk, 1, [&](std::int64_t b, std::int64_t e) {
      std::uint64_t s = 0;
      for (std::int64_t c = b; c < e; ++c) s += sum_chunk(p + c * chunk, std::min(chunk, n - c * chunk));
      total += s;
    });
    const double t = since(t0);
    sink += total.load();
    if (r > 0) best = std::max(best, static_cast<double>(bytes) / t / 1e9);  // the first warms pages
  }
  if (sink != static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(reps + 1))
    throw std::runtime_error("stream read: wrong sum");
  return best;
}

struct gemm_shape {
  std::string name;
  std::int64_t n, k, per_token;  // out features, in features, times per token (layers)
};

std::vector<gemm_shape> model_shapes(const model_dims& d) {
  const std::int64_t q = d.n_heads * d.head_dim(), kv = d.n_kv_heads * d.head_dim();
  return {{"q/o proj", q, d.d_model, 2 * d.n_layers},
          {"k/v proj", kv, d.d_model, 2 * d.n_layers},
          {"gate/up proj", d.d_ff, d.d_model, 2 * d.n_layers},
          {"down proj", d.d_model, d.d_ff, d.n_layers},
          {"lm head", d.vocab, d.d_model, 1}};
}

// FLOP/s of `rows` rows through every linear layer of the model once (each shape timed as
// often as a token meets it), with `lin`, best of `reps`.
template <class Linear>
double gemm_rate(const model_dims& d, std::int64_t rows, int reps, Linear lin, bool bf16) {
  double flops = 0.0, secs = 0.0;
  for (const auto& s : model_shapes(d)) {
    const at::Tensor x = at::randn({rows, s.k});
    at::Tensor w = at::randn({s.n, s.k}) * 0.02;
    if (bf16) w = w.to(at::kBFloat16);
    double best = 1e30;
    for (int r = 0; r < reps + 1; ++r) {
      const auto t0 = clock_type::now();
      const at::Tensor y = lin(x, w);
      const double t = since(t0);
      if (r > 0) best = std::min(best, t);
    }
    flops += 2.0 * static_cast<double>(rows * s.n * s.k * s.per_token);
    secs += best * static_cast<double>(s.per_token);
  }
  return flops / secs;
}

// ---------------------------------------------------------------------------------------------
// sorl's decode

struct model_costs {
  double weight_bytes = 0.0;      // bf16 bytes a decode step reads: linear layers, LM head, norms
  double flops_per_token = 0.0;   // linear layers and LM head
  double kv_bytes_per_pos = 0.0;  // fp32 K and V of one position, all layers
  double attn_flops_per_pos = 0.0;  // QK and PV of one query against one position, all layers
};

model_costs costs_of(const model_dims& d) {
  model_costs c;
  double weights = 0.0;
  for (const auto& s : model_shapes(d)) weights += static_cast<double>(s.n * s.k * s.per_token);
  c.flops_per_token = 2.0 * weights;
  weights += static_cast<double>(d.d_model * (2 * d.n_layers + 1));  // norms
  c.weight_bytes = 2.0 * weights;
  c.kv_bytes_per_pos = 4.0 * 2.0 * static_cast<double>(d.n_layers * d.n_kv_heads * d.head_dim());
  c.attn_flops_per_pos = 2.0 * 2.0 * static_cast<double>(d.n_layers * d.n_heads * d.head_dim());
  return c;
}

// Tokens/s of `steps` one-token decode steps of `batch` sequences prefilled with `prompt`
// tokens; with `prof`, the steps' time by kind of operation is added to it.
double steady_decode(policy_model& m, std::int64_t batch, std::int64_t prompt, std::int64_t steps,
                     decode_profile* prof = nullptr) {
  kv_cache_options co;
  co.initial_blocks = batch * ((prompt + steps + 15) / 16) + 1;
  kv_cache cache(m.dims(), co);
  std::vector<seq_id> seqs;
  std::vector<std::vector<std::int32_t>> toks;
  for (std::int64_t b = 0; b < batch; ++b) {
    seqs.push_back(cache.create());
    toks.push_back(random_tokens(prompt, m.dims().vocab, 100 + static_cast<std::uint64_t>(b)));
  }
  m.forward_cached(cache, seqs, toks);
  const std::vector<std::int32_t> next = random_tokens(batch * steps, m.dims().vocab, 7);
  m.set_decode_profile(prof);
  const auto t0 = clock_type::now();
  for (std::int64_t t = 0; t < steps; ++t) {
    for (std::int64_t b = 0; b < batch; ++b) toks[static_cast<std::size_t>(b)] = {next[static_cast<std::size_t>(t * batch + b)]};
    m.forward_cached(cache, seqs, toks);
  }
  const double secs = since(t0);
  m.set_decode_profile(nullptr);
  return static_cast<double>(batch * steps) / secs;
}

// The prompt of the rollouts (token ids < vocab): the same for every batch size and baseline.
std::vector<std::int32_t> rollout_prompt(std::int64_t n, std::int64_t vocab) { return random_tokens(n, vocab, 3); }

// Tokens/s of one group of `batch` samples of one prompt through the generator, as a rollout
// worker runs it; *sampling_share gets the fraction of the time spent outside forward_cached.
double rollouts(policy_model& m, std::int64_t batch, std::int64_t prompt, std::int64_t new_tokens,
                double temperature, double* sampling_share) {
  generator_options go;
  go.max_batch = batch;
  go.cache.initial_blocks = batch * ((prompt + new_tokens + 15) / 16) + 1;
  generator g(m, go);
  sampling_params sp;
  sp.temperature = temperature;
  sp.max_new_tokens = new_tokens;
  sp.seed = 1;
  g.submit(rollout_prompt(prompt, m.dims().vocab), sp, batch);
  decode_profile prof;
  m.set_decode_profile(&prof);
  const auto t0 = clock_type::now();
  const auto results = g.run_until_idle();
  const double secs = since(t0);
  m.set_decode_profile(nullptr);
  std::int64_t tokens = 0;
  for (const auto& r : results) tokens += static_cast<std::int64_t>(r.tokens.size());
  double model_secs = 0.0;
  for (double s : prof.seconds) model_secs += s;
  if (sampling_share != nullptr) *sampling_share = 1.0 - model_secs / secs;
  return static_cast<double>(tokens) / secs;
}

std::string join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : ", ") + fmt::format("{:.2f}", x);
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  sorl::bench::bench_record rec("decode-model", argc, argv);
  at::set_num_threads(o.threads);
  rec.set_threads(o.threads);
  hf_load_options lo;
  lo.max_seq = std::max<std::int64_t>(o.prompt + o.new_tokens + 16, 512);
  policy_model m = load_hf_model(o.model_dir, lo).model.clone(at::kBFloat16);
  const model_dims& d = m.dims();
  const model_costs c = costs_of(d);
  std::ofstream json;
  if (!o.json.empty()) json.open(o.json);
  if (!o.prompt_out.empty()) {
    std::ofstream p(o.prompt_out);
    std::string ids;
    for (const std::int32_t t : rollout_prompt(o.prompt, d.vocab)) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    p << "{\"ids\": [" << ids << "]}\n";
  }

  fmt::print("model: {} ({} layers, d {}, vocab {}); bf16 weights read per decode step: {:.1f} MB\n",
             o.model_dir, d.n_layers, d.d_model, d.vocab, c.weight_bytes / 1e6);
  const int team = kernel_threads();
  fmt::print("threads: {} (sorl's kernels run on {}); bf16_linear: {}\n", o.threads, team, bf16_linear_isa());
  if (team != o.threads)
    throw std::runtime_error(fmt::format("sorl's kernels run on {} threads, not the {} asked for", team, o.threads));
  rec.set_runtime(sorl::bench::ml_record_runtime());
  rec.set_parameter("model_dir", o.model_dir);
  rec.set_parameter("prompt_tokens", o.prompt);
  rec.set_parameter("new_tokens", o.new_tokens);
  rec.set_parameter("repeats", o.repeats);
  rec.set_parameter("temperature", o.temperature);
  rec.set_parameter("bf16_linear_isa", bf16_linear_isa());

  // Limits, measured first, with the bench's threads.
  const double bw = stream_read_gbs(std::int64_t{1} << 30, 4);
  const double bw_weights = stream_read_gbs(static_cast<std::int64_t>(c.weight_bytes), 6);
  const std::int64_t gemm_rows = 256;
  const double rate_aten = gemm_rate(d, gemm_rows, 3, [](const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); }, false);
  double rate_onednn = 0.0;
  if (at::hasMKLDNN())
    rate_onednn = gemm_rate(d, gemm_rows, 3, [](const at::Tensor& x, const at::Tensor& w) {
      return at::mkldnn_linear(x.to_mkldnn(), w, {}).to_dense(); }, false);
  const double rate_bf16 = gemm_rate(d, gemm_rows, 3, [](const at::Tensor& x, const at::Tensor& w) { return bf16_linear(x, w); }, true);
  const double rate = std::max({rate_aten, rate_onednn, rate_bf16});
  fmt::print("streaming read: {:.1f} GB/s (1 GiB buffer), {:.1f} GB/s (a buffer the size of the weights)\n", bw, bw_weights);
  fmt::print("fp32 GEMM on the model's shapes, {} rows: at::linear {:.1f}, oneDNN {:.1f}, bf16_linear {:.1f} GFLOP/s\n",
             gemm_rows, rate_aten / 1e9, rate_onednn / 1e9, rate_bf16 / 1e9);
  fmt::print("memory bound uses {:.1f} GB/s (the 1 GiB read); compute bound uses {:.1f} GFLOP/s (the fastest)\n\n", bw,
             rate / 1e9);
  auto& limits = rec.add_table("limits", "this machine's limits, measured with the bench's threads",
                               {{"limit", "limit"}, {"value", "value", "", 1}, {"unit", "unit"}});
  limits.add_row({"streaming read, 1 GiB buffer (the memory bound's)", bw, "GB/s"});
  limits.add_row({"streaming read, a buffer the size of the weights", bw_weights, "GB/s"});
  limits.add_row({fmt::format("fp32 GEMM on the model's shapes at {} rows, at::linear", gemm_rows), rate_aten / 1e9,
                  "GFLOP/s"});
  limits.add_row({fmt::format("the same, oneDNN"), rate_onednn / 1e9, "GFLOP/s"});
  limits.add_row({fmt::format("the same, bf16_linear ({})", bf16_linear_isa()), rate_bf16 / 1e9, "GFLOP/s"});
  limits.add_row({"bf16 weights read per decode step", c.weight_bytes / 1e6, "MB"});
  if (!o.gemm_rows.empty()) {
    auto& gemm = rec.add_table("gemm", "bf16_linear against at::linear on the fp32 image, through every linear layer's shape once per layer, best of 5",
                               {{"rows", "rows"},
                                {"bf16_gflops", "bf16_linear", "GFLOP/s", 1},
                                {"aten_gflops", "at::linear (fp32 weights)", "GFLOP/s", 1, true},
                                {"ratio", "bf16_linear / at::linear", "x", 2},
                                {"bf16_weight_gbs", "bf16_linear's weight read", "GB/s", 1}});
    fmt::print("{:>5}  {:>20}  {:>20}  {:>8}  {:>16}\n", "rows", "bf16_linear GFLOP/s", "at::linear GFLOP/s", "ratio",
               "weights GB/s");
    for (const std::int64_t r : o.gemm_rows) {
      const double b = gemm_rate(d, r, 5, [](const at::Tensor& x, const at::Tensor& w) { return bf16_linear(x, w); }, true);
      const double a = gemm_rate(d, r, 5, [](const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); }, false);
      // Every weight is 2 bytes and is met by `r` rows: 2 FLOPs per row.
      const double gbs = b / static_cast<double>(r) / 1e9;
      fmt::print("{:>5}  {:>20.1f}  {:>20.1f}  {:>8.2f}  {:>16.1f}\n", r, b / 1e9, a / 1e9, b / a, gbs);
      gemm.add_row({r, b / 1e9, a / 1e9, b / a, gbs});
    }
    fmt::print("\n");
  }
  auto& decode = rec.add_table(
    "decode", "steady decode and whole rollouts, tokens/s (medians of the repeats), against this machine's bounds",
    {{"batch", "batch"},
     {"steady_tok_s", "sorl", "tokens/s", 1},
     {"rollout_tok_s", "sorl rollouts", "tokens/s", 1},
     {"before_tok_s", "sorl before", "tokens/s", 1, true},
     {"mem_bound_tok_s", "memory bound", "tokens/s", 0, true},
     {"of_mem_bound", "of memory bound", "%", 0},
     {"compute_bound_tok_s", "compute bound", "tokens/s", 0, true},
     {"of_compute_bound", "of compute bound", "%", 0},
     {"sampling_share", "rollout time outside the model", "%", 0}});
  if (json.is_open())
    json << fmt::format(R"({{"kind":"limits","read_gbs":{:.3f},"read_weights_gbs":{:.3f},"gemm_rows":{},"aten_gflops":{:.3f},"onednn_gflops":{:.3f},"bf16_linear_gflops":{:.3f},"weight_bytes":{:.0f},"threads":{},"isa":"{}"}})",
                        bw, bw_weights, gemm_rows, rate_aten / 1e9, rate_onednn / 1e9, rate_bf16 / 1e9, c.weight_bytes,
                        o.threads, bf16_linear_isa())
         << "\n";

  fmt::print("{:>5}  {:>22}  {:>12}  {:>12}  {:>8}  {:>8}  {:>14}  {:>10}\n", "batch", "steady tok/s (median)",
             "before", "mem bound", "of mem", "of comp", "rollouts tok/s", "sampling");
  for (const std::int64_t B : o.batches) {
    const std::int64_t steps = std::max<std::int64_t>(8, std::min<std::int64_t>(o.new_tokens, 512 / B));
    std::vector<double> now, before, roll;
    double share = 0.0;
    for (std::int64_t r = 0; r < o.repeats; ++r) {
      m.set_decode_gemm(decode_gemm::automatic);
      now.push_back(steady_decode(m, B, o.prompt, steps));
      if (o.baseline) {
        m.set_decode_gemm(decode_gemm::fp32_image);
        before.push_back(steady_decode(m, B, o.prompt, steps));
        m.set_decode_gemm(decode_gemm::automatic);
      }
      roll.push_back(rollouts(m, B, o.prompt, o.new_tokens, o.temperature, &share));
    }
    const double pos = static_cast<double>(o.prompt) + static_cast<double>(steps) / 2.0;  // mean cached length
    const double bytes = c.weight_bytes + static_cast<double>(B) * pos * c.kv_bytes_per_pos;
    const double mem_bound = static_cast<double>(B) / (bytes / (bw * 1e9));
    const double flops = static_cast<double>(B) * (c.flops_per_token + pos * c.attn_flops_per_pos);
    const double comp_bound = static_cast<double>(B) / (flops / rate);
    const double med = median(now);
    fmt::print("{:>5}  {:>22.1f}  {:>12}  {:>12.1f}  {:>7.0f}%  {:>7.0f}%  {:>14.1f}  {:>9.0f}%\n", B, med,
               o.baseline ? fmt::format("{:.1f}", median(before)) : "-", mem_bound, 100.0 * med / mem_bound,
               100.0 * med / comp_bound, median(roll), 100.0 * share);
    decode.add_row({B, med, median(roll), o.baseline ? sorl::bench::record_cell(median(before)) : sorl::bench::record_cell{},
                    mem_bound, 100.0 * med / mem_bound, comp_bound, 100.0 * med / comp_bound, 100.0 * share});
    if (json.is_open())
      json << fmt::format(R"({{"kind":"decode","batch":{},"steady_tok_s":[{}],"before_tok_s":[{}],"rollout_tok_s":[{}],"mem_bound_tok_s":{:.3f},"compute_bound_tok_s":{:.3f},"prompt":{},"new_tokens":{},"temperature":{}}})",
                          B, join(now), join(before), join(roll), mem_bound, comp_bound, o.prompt, o.new_tokens,
                          o.temperature)
           << "\n";
  }

  std::vector<sorl::bench::record_column> prof_cols{{"kind", "kind"}};
  for (const std::int64_t B : o.profile) {
    prof_cols.emplace_back(fmt::format("ms_b{}", B), fmt::format("batch {}", B), "ms", 2);
    prof_cols.emplace_back(fmt::format("share_b{}", B), "share", "%", 1);
  }
  auto& profile = rec.add_table("profile", "one decode step's time by kind of operation (forward_cached)",
                                std::move(prof_cols));
  std::vector<std::vector<sorl::bench::record_cell>> prof_rows(decode_profile::kinds + 1);
  for (int k = 0; k < decode_profile::kinds; ++k)
    prof_rows[static_cast<std::size_t>(k)].emplace_back(decode_profile::name(k));
  prof_rows.back().emplace_back("step");
  for (const std::int64_t B : o.profile) {
    decode_profile prof;
    const std::int64_t steps = std::max<std::int64_t>(8, std::min<std::int64_t>(o.new_tokens, 512 / B));
    steady_decode(m, B, o.prompt, steps, &prof);
    double total = 0.0;
    for (double s : prof.seconds) total += s;
    fmt::print("\nprofile of one decode step at batch {} ({} steps, {:.2f} ms per step):\n", B, prof.calls,
               1e3 * total / static_cast<double>(prof.calls));
    std::string js;
    for (int k = 0; k < decode_profile::kinds; ++k) {
      const double ms = 1e3 * prof.seconds[k] / static_cast<double>(prof.calls);
      fmt::print("  {:<14} {:>8.3f} ms  {:>5.1f}%\n", decode_profile::name(k), ms, 100.0 * prof.seconds[k] / total);
      js += fmt::format("{}\"{}\":{:.4f}", js.empty() ? "" : ",", decode_profile::name(k), ms);
      prof_rows[static_cast<std::size_t>(k)].emplace_back(ms);
      prof_rows[static_cast<std::size_t>(k)].emplace_back(100.0 * prof.seconds[k] / total);
    }
    prof_rows.back().emplace_back(1e3 * total / static_cast<double>(prof.calls));
    prof_rows.back().emplace_back();
    if (json.is_open()) json << fmt::format(R"({{"kind":"profile","batch":{},"ms":{{{}}}}})", B, js) << "\n";
  }
  if (!o.profile.empty())
    for (auto& row : prof_rows)
      profile.add_row(std::move(row));
  const std::string record_path = sorl::bench::record_path("decode-model", o.record);
  if (rec.write(record_path))
    std::cerr << "record: " << record_path << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "decode_model_bench: " << e.what() << "\n";
  return 1;
}
