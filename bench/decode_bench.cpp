// Decode throughput of sorl's generator (paged KV cache, continuous batching, per-sample
// sampling) for the model presets at several batch sizes. Prints one JSON line per run so
// bench/decode_reference.py can run the same configurations through an eager PyTorch loop and
// print both side by side (bench/decode.sh does all of it in one command).
//
// Also writes, with --dump DIR, the tiny preset's weights, a batch of token ids and the logits
// sorl computes for them (full and cached paths), so the reference can check logits parity.

#include "runtime/ml/generate.hpp"
#include "runtime/ml/kv_cache.hpp"
#include "runtime/ml/model.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

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

namespace {

struct options {
  std::vector<std::string> presets = {"tiny", "50m"};
  std::vector<std::int64_t> batches = {1, 8, 64};
  std::int64_t prompt = 8;
  std::int64_t new_tiny = 64;
  std::int64_t new_50m = 32;  // capped at max(8, 256 / batch): the reference is slow here
  std::string gemm = "auto";
  int threads = 2;
  std::string json;
  std::string dump;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void usage() {
  std::cerr << "usage: decode_bench [--presets tiny,50m] [--batches 1,8,64] [--prompt 8]\n"
               "                    [--new-tiny 64] [--new-50m 32] [--threads 2] [--gemm auto|aten]\n"
               "                    [--json FILE] [--dump DIR]\n";
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--presets") o.presets = split(value());
    else if (a == "--batches") {
      o.batches.clear();
      for (const auto& b : split(value())) o.batches.push_back(std::stoll(b));
    } else if (a == "--prompt") o.prompt = std::stoll(value());
    else if (a == "--new-tiny") o.new_tiny = std::stoll(value());
    else if (a == "--new-50m") o.new_50m = std::stoll(value());
    else if (a == "--threads") o.threads = std::stoi(value());
    else if (a == "--gemm") o.gemm = value();
    else if (a == "--json") o.json = value();
    else if (a == "--dump") o.dump = value();
    else if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else {
      usage();
      throw std::invalid_argument("unknown argument " + a);
    }
  }
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

struct run_result {
  double decode_s = 0.0;
  double prefill_s = 0.0;
  std::int64_t decode_tokens = 0;
};

// B single-sample requests with distinct prompts, sampled at temperature 1 without stop tokens
// so that every sample runs exactly `new_tokens`. The first step (prefill + first token) is
// timed apart: the table reports steady decoding.
run_result run(const policy_model& m, std::int64_t batch, std::int64_t prompt, std::int64_t new_tokens) {
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
  using clock = std::chrono::steady_clock;
  run_result r;
  const auto t0 = clock::now();
  g.step();
  const auto t1 = clock::now();
  std::int64_t steps = 0;
  while (!g.idle()) {
    g.step();
    ++steps;
  }
  const auto t2 = clock::now();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.decode_s = std::chrono::duration<double>(t2 - t1).count();
  r.decode_tokens = steps * batch;
  return r;
}

void write_raw(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

// Weights, ids and logits of the tiny preset for the reference's parity check. Also measures
// how far the cached path is from the full forward on the same tokens.
void dump(const std::string& dir) {
  const model_dims d = preset("tiny");
  const policy_model m(d, 7, 0.02);
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
  // The same tokens through the cache: a ragged prefill (lengths 5, 9, 13), then the rest
  // in chunks of 1..3 tokens per sequence.
  kv_cache cache(d);
  std::vector<seq_id> seqs = {cache.create(), cache.create(), cache.create()};
  std::vector<std::int64_t> done = {0, 0, 0};
  std::vector<at::Tensor> rows(3);
  const std::vector<std::int64_t> first = {5, 9, 13};
  std::int64_t round = 0;
  while (done[0] < T || done[1] < T || done[2] < T) {
    std::vector<seq_id> s;
    std::vector<std::vector<std::int32_t>> toks;
    std::vector<std::int64_t> which;
    for (std::int64_t b = 0; b < B; ++b) {
      if (done[b] == T) continue;
      const std::int64_t n = std::min(T - done[b], done[b] == 0 ? first[b] : 1 + (round + b) % 3);
      std::vector<std::int32_t> chunk;
      for (std::int64_t t = done[b]; t < done[b] + n; ++t) chunk.push_back(static_cast<std::int32_t>(ids[b][t].item<std::int64_t>()));
      s.push_back(seqs[b]);
      toks.push_back(chunk);
      which.push_back(b);
      done[b] += n;
    }
    const at::Tensor out = m.forward_cached(cache, s, toks, logits_for::all);
    std::int64_t row = 0;
    for (std::size_t i = 0; i < which.size(); ++i) {
      const auto n = static_cast<std::int64_t>(toks[i].size());
      const at::Tensor part = out.narrow(0, row, n);
      rows[which[i]] = rows[which[i]].defined() ? at::cat({rows[which[i]], part}) : part;
      row += n;
    }
    ++round;
  }
  const at::Tensor cached = at::stack({rows[0], rows[1], rows[2]});
  write_raw(dir + "/ids.bin", ids);
  write_raw(dir + "/logits.bin", full);
  std::ofstream meta(dir + "/meta.txt");
  meta << B << ' ' << T << ' ' << d.vocab << ' ' << d.d_model << ' ' << d.n_layers << ' ' << d.n_heads
       << ' ' << d.n_kv_heads << ' ' << d.d_ff << ' ' << d.rope_theta << ' ' << d.norm_eps << ' '
       << (full - cached).abs().max().item<double>() << ' ' << full.abs().max().item<double>() << '\n';
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  if (o.gemm != "auto" && o.gemm != "aten") throw std::invalid_argument("--gemm must be auto or aten, got " + o.gemm);
  at::set_num_threads(o.threads);
  std::FILE* json = o.json.empty() ? stdout : std::fopen(o.json.c_str(), "w");
  if (json == nullptr) throw std::runtime_error("cannot open " + o.json);
  if (!o.dump.empty()) dump(o.dump);
  for (const auto& name : o.presets) {
    const model_dims d = preset(name);
    policy_model m(d, 0, 0.02);
    m.set_decode_gemm(o.gemm == "aten" ? decode_gemm::aten : decode_gemm::automatic);
    run(m, 1, o.prompt, 4);  // warm up allocator and thread pool
    for (const std::int64_t b : o.batches) {
      const std::int64_t new_tokens =
          name == "tiny" ? o.new_tiny : std::min(o.new_50m, std::max<std::int64_t>(8, 256 / b));
      const run_result r = run(m, b, o.prompt, new_tokens);
      std::fprintf(json,
                   "{\"impl\":\"sorl\",\"preset\":\"%s\",\"vocab\":%lld,\"d_model\":%lld,\"n_layers\":%lld,"
                   "\"n_heads\":%lld,\"n_kv_heads\":%lld,\"d_ff\":%lld,\"rope_theta\":%g,\"norm_eps\":%g,"
                   "\"params\":%lld,\"batch\":%lld,\"prompt\":%lld,\"new_tokens\":%lld,\"threads\":%d,\"gemm\":\"%s\","
                   "\"prefill_s\":%.6f,\"decode_s\":%.6f,\"decode_tokens\":%lld,\"tokens_per_s\":%.3f}\n",
                   name.c_str(), static_cast<long long>(d.vocab), static_cast<long long>(d.d_model),
                   static_cast<long long>(d.n_layers), static_cast<long long>(d.n_heads),
                   static_cast<long long>(d.n_kv_heads), static_cast<long long>(d.d_ff), d.rope_theta,
                   d.norm_eps, static_cast<long long>(d.parameter_count()), static_cast<long long>(b),
                   static_cast<long long>(o.prompt), static_cast<long long>(new_tokens), o.threads, o.gemm.c_str(),
                   r.prefill_s, r.decode_s, static_cast<long long>(r.decode_tokens),
                   static_cast<double>(r.decode_tokens) / r.decode_s);
      std::fflush(json);
    }
  }
  if (json != stdout) std::fclose(json);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "decode_bench: " << e.what() << '\n';
  return 1;
}
