// SparseRL-Sync codec bench (ARCHITECTURE.md §6): size and speed of the sparse bf16 delta codec
// (actors/sync/delta_codec.hpp) against dense bf16, a naive sparse format (int32 index + bf16
// value), zstd -3 and lz4 on the XOR of old and new bits, and memcpy bandwidth measured in the
// same run on the same size. Rows: consecutive weight versions of sorl's own learner (AdamW on
// a synthetic GRPO batch) and a synthetic bf16 tensor. Every row's round trip is checked bit
// for bit; a mismatch exits 1. Run through bench/sync/sync_codec.sh.

#include "actors/learner/learner_core.hpp"
#include "actors/sync/delta_codec.hpp"
#include "runtime/ml/model.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace sorl;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Best of `reps` timings of f (seconds).
double best_of(int reps, const std::function<void()>& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "sync_codec_bench: FAILED: %s\n", what.c_str());
  std::exit(1);
}

/// One version pair: tensors of base and next bits.
struct version_pair {
  std::vector<std::vector<uint16_t>> base, next;
};

/// What one row reports.
struct row {
  std::string name;
  uint64_t elements = 0, changed = 0;
  uint64_t dense = 0, naive = 0, ours = 0, zstd = 0, lz4 = 0;
  uint64_t plus_minus_one = 0; ///< changes by exactly ±1 ULP
  uint64_t dense_entries = 0, buckets = 0;
  double encode_s = 0;    ///< encode_delta with threads = 1
  double encode_mt_s = 0; ///< encode_delta with threads = 0 (all hardware threads)
  double apply_s = 0, memcpy_s = 0;
};

/// zstd -3 and lz4 of the XOR of old and new bits, in 64 MiB chunks (zstd as one stream, lz4
/// as independent blocks as its frame format does), so no 2-byte-per-element XOR copy is held.
void xor_baselines(const version_pair& v, row& r) {
  constexpr size_t chunk_elems = size_t{32} << 20;
  std::vector<uint16_t> x(chunk_elems);
  std::vector<char> lz(static_cast<size_t>(LZ4_compressBound(static_cast<int>(chunk_elems * 2))));
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
  std::vector<char> zout(ZSTD_CStreamOutSize());
  uint64_t zbytes = 0, lbytes = 0;
  for (size_t t = 0; t < v.base.size(); ++t) {
    const auto& a = v.base[t];
    const auto& b = v.next[t];
    for (size_t off = 0; off < a.size(); off += chunk_elems) {
      const size_t n = std::min(chunk_elems, a.size() - off);
      for (size_t i = 0; i < n; ++i)
        x[i] = static_cast<uint16_t>(a[off + i] ^ b[off + i]);
      const int l = LZ4_compress_default(reinterpret_cast<const char*>(x.data()), lz.data(),
                                         static_cast<int>(n * 2), static_cast<int>(lz.size()));
      if (l <= 0)
        fail("LZ4_compress_default");
      lbytes += static_cast<uint64_t>(l);
      const bool last = t + 1 == v.base.size() && off + n == a.size();
      ZSTD_inBuffer in{x.data(), n * 2, 0};
      for (;;) {
        ZSTD_outBuffer out{zout.data(), zout.size(), 0};
        const size_t left = ZSTD_compressStream2(cctx, &out, &in, last ? ZSTD_e_end : ZSTD_e_continue);
        if (ZSTD_isError(left))
          fail(ZSTD_getErrorName(left));
        zbytes += out.pos;
        if (last ? left == 0 : in.pos == in.size)
          break;
      }
    }
  }
  if (v.base.empty()) {
    ZSTD_inBuffer in{nullptr, 0, 0};
    ZSTD_outBuffer out{zout.data(), zout.size(), 0};
    ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end);
    zbytes += out.pos;
  }
  ZSTD_freeCCtx(cctx);
  r.zstd = zbytes;
  r.lz4 = lbytes;
}

/// Encodes, applies (verified bit for bit) and measures one version pair; adds into `r`.
void measure(const version_pair& v, int reps, row& r) {
  std::vector<sync::delta_source> sources;
  uint64_t elements = 0;
  for (size_t t = 0; t < v.base.size(); ++t) {
    sources.push_back({static_cast<uint32_t>(t), v.base[t].data(), v.next[t].data(),
                       v.base[t].size()});
    elements += v.base[t].size();
  }
  sync::delta_stats st;
  std::vector<std::vector<uint8_t>> buckets;
  sync::delta_options one;
  one.threads = 1;
  const double enc = best_of(reps, [&] { buckets = sync::encode_delta(1, 2, sources, one, &st); });
  sync::delta_options all;
  all.threads = 0;
  std::vector<std::vector<uint8_t>> buckets_mt;
  const double enc_mt =
    best_of(reps, [&] { buckets_mt = sync::encode_delta(1, 2, sources, all, nullptr); });
  if (buckets_mt != buckets)
    fail(r.name + ": encoding on all threads differs from one thread");
  buckets_mt.clear();
  buckets_mt.shrink_to_fit();
  // Apply onto copies of the base (copy untimed), then compare bit for bit.
  std::vector<std::vector<uint16_t>> work;
  std::vector<sync::delta_target> targets;
  double app = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    work = v.base;
    targets.clear();
    for (size_t t = 0; t < work.size(); ++t)
      targets.push_back({static_cast<uint32_t>(t), work[t].data(), work[t].size()});
    const auto t0 = clock_type::now();
    for (const auto& b : buckets)
      if (auto err = sync::apply_delta_bucket(b.data(), b.size(), 1, 2, targets))
        fail(r.name + ": apply: " + *err);
    app = std::min(app, seconds_since(t0));
    for (size_t t = 0; t < work.size(); ++t)
      if (work[t] != v.next[t])
        fail(r.name + ": round trip is not bit-exact in tensor " + std::to_string(t));
  }
  // memcpy of the same number of dense bytes, in the same tensor sizes.
  const double mc = best_of(reps, [&] {
    for (size_t t = 0; t < work.size(); ++t)
      std::memcpy(work[t].data(), v.next[t].data(), v.next[t].size() * 2);
  });
  if (work != v.next)
    fail("memcpy");
  uint64_t pm1 = 0;
  for (size_t t = 0; t < v.base.size(); ++t)
    for (size_t i = 0; i < v.base[t].size(); ++i) {
      const auto s = sync::delta_step(v.base[t][i], v.next[t][i]);
      pm1 += s == 1 || s == 0xFFFF;
    }
  row x;
  xor_baselines(v, x);
  r.elements += elements;
  r.changed += st.changed;
  r.plus_minus_one += pm1;
  r.dense += st.dense_bytes;
  r.naive += 6 * st.changed;
  r.ours += st.encoded_bytes;
  r.zstd += x.zstd;
  r.lz4 += x.lz4;
  r.dense_entries += st.dense_segments;
  r.buckets += st.buckets;
  r.encode_s += enc;
  r.encode_mt_s += enc_mt;
  r.apply_s += app;
  r.memcpy_s += mc;
}

// ---- rows from sorl's learner ----

std::vector<std::int32_t> tokens(size_t n, std::int64_t vocab, std::uint32_t salt) {
  std::vector<std::int32_t> out;
  std::uint32_t x = salt * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab)));
  }
  return out;
}

/// A GRPO batch of `groups` × `group_size` samples with alternating rewards; new tokens per step.
std::vector<learner::rollout_sample> batch_for(int step, std::int64_t vocab, int groups,
                                               int group_size, size_t len) {
  std::vector<learner::rollout_sample> batch;
  for (int g = 0; g < groups; ++g) {
    const auto prompt = tokens(len, vocab, static_cast<std::uint32_t>(1000 + 97 * step + g));
    for (int k = 0; k < group_size; ++k) {
      learner::rollout_sample s;
      s.group_id = static_cast<std::uint64_t>(g);
      s.prompt = prompt;
      s.response = tokens(len + static_cast<size_t>(k % 3), vocab,
                          static_cast<std::uint32_t>(step * 7919 + g * 100 + k));
      s.loss_mask.assign(s.response.size(), 1);
      s.sampling_logprobs.assign(s.response.size(), 0.0f);
      s.reward = k % 2 == 0 ? 1.0f : 0.0f;
      batch.push_back(std::move(s));
    }
  }
  return batch;
}

/// The bf16 rollout weights as learner_actor's WeightSnapshot makes them: the fp32 master
/// weights cast to bf16 (round to nearest even), one vector of bit patterns per parameter.
std::vector<std::vector<uint16_t>> bf16_bits(const ml::policy_model& model) {
  std::vector<std::vector<uint16_t>> out;
  for (const auto& [name, t] : model.parameters()) {
    const at::Tensor b = t.detach().to(at::kBFloat16).contiguous();
    const auto* p = static_cast<const uint16_t*>(b.data_ptr());
    out.emplace_back(p, p + b.numel());
  }
  return out;
}

row learner_row(const std::string& preset, double lr, int warmup, int steps, int reps) {
  ml::policy_model model(ml::preset(preset), /*seed=*/1);
  learner::learner_options o;
  o.lr = lr;
  learner::learner_core core(model, o, /*seed=*/1);
  const auto vocab = model.dims().vocab;
  int step = 0;
  for (; step < warmup; ++step)
    core.train_step(batch_for(step, vocab, 2, 4, 8));
  row r;
  char name[96];
  std::snprintf(name, sizeof name, "%s lr %.0e steps %d-%d", preset.c_str(), lr, warmup + 1,
                warmup + steps);
  r.name = name;
  auto prev = bf16_bits(model);
  for (int i = 0; i < steps; ++i, ++step) {
    core.train_step(batch_for(step, vocab, 2, 4, 8));
    version_pair v;
    v.base = std::move(prev);
    v.next = bf16_bits(model);
    measure(v, reps, r);
    prev = std::move(v.next);
  }
  return r;
}

// ---- synthetic rows ----

/// splitmix64: a fast, seedable generator for billions of draws.
struct splitmix {
  uint64_t s;
  uint64_t operator()() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { // (0, 1]
    return (static_cast<double>((*this)() >> 11) + 1.0) * 0x1.0p-53;
  }
};

/// Base: random sign, exponent 117..124 (|w| ~ 2^-10 .. 2^-3), random mantissa. Changes at
/// uniformly random positions (geometric gaps with p = fraction); 96 % of them by +1 or −1 ULP
/// (equally likely), 4 % to a uniformly random other bit pattern.
version_pair synthetic(uint64_t n, double fraction, uint64_t seed) {
  version_pair v;
  v.base.emplace_back(n);
  auto& base = v.base[0];
  splitmix rng{seed};
  for (uint64_t i = 0; i < n; i += 4) {
    uint64_t r = rng();
    for (uint64_t j = i; j < std::min(n, i + 4); ++j, r >>= 16) {
      const auto x = static_cast<uint16_t>(r);
      base[j] = static_cast<uint16_t>((x & 0x8000u) | ((117u + ((x >> 7) & 7u)) << 7) | (x & 0x7Fu));
    }
  }
  v.next = v.base;
  auto& next = v.next[0];
  const double log1mp = std::log1p(-fraction);
  uint64_t pos = static_cast<uint64_t>(std::floor(std::log(rng.uniform()) / log1mp));
  while (pos < n) {
    const uint64_t r = rng();
    const double kind = static_cast<double>(r >> 11) * 0x1.0p-53;
    uint16_t nv;
    if (kind < 0.48) {
      nv = static_cast<uint16_t>(base[pos] + 1);
    } else if (kind < 0.96) {
      nv = static_cast<uint16_t>(base[pos] - 1);
    } else {
      do
        nv = static_cast<uint16_t>(rng());
      while (nv == base[pos] || nv == static_cast<uint16_t>(base[pos] + 1) ||
             nv == static_cast<uint16_t>(base[pos] - 1));
    }
    next[pos] = nv;
    pos += 1 + static_cast<uint64_t>(std::floor(std::log(rng.uniform()) / log1mp));
  }
  return v;
}

std::string human(uint64_t bytes) {
  char b[32];
  if (bytes >= (uint64_t{1} << 30))
    std::snprintf(b, sizeof b, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  else if (bytes >= (uint64_t{1} << 20))
    std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  else if (bytes >= 1024)
    std::snprintf(b, sizeof b, "%.1f KiB", static_cast<double>(bytes) / 1024);
  else
    std::snprintf(b, sizeof b, "%llu B", static_cast<unsigned long long>(bytes));
  return b;
}

void print_row(const row& r) {
  const double dense = static_cast<double>(r.dense);
  auto gbs = [&](double s) { return s > 0 ? dense / s / 1e9 : 0.0; };
  std::printf("| %-26s | %7.4f%% | %5.1f%% | %10s | %10s | %10s | %10s | %10s | %7.1fx | %5.2f "
              "| %6.2f | %6.2f | %6.2f | %6.2f |\n",
              r.name.c_str(), 100.0 * static_cast<double>(r.changed) / static_cast<double>(r.elements),
              r.changed ? 100.0 * static_cast<double>(r.plus_minus_one) / static_cast<double>(r.changed) : 0.0,
              human(r.dense).c_str(), human(r.naive).c_str(), human(r.ours).c_str(),
              human(r.zstd).c_str(), human(r.lz4).c_str(), dense / static_cast<double>(r.ours),
              r.changed ? 8.0 * static_cast<double>(r.ours) / static_cast<double>(r.changed) : 0.0,
              gbs(r.encode_s), gbs(r.encode_mt_s), gbs(r.apply_s), gbs(r.memcpy_s));
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  bool quick = false;
  uint64_t synthetic_elements = uint64_t{1} << 30;
  bool synthetic_set = false, presets_set = false;
  int warmup = 2, steps = 3;
  std::vector<std::string> presets = {"tiny", "50m"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        fail("missing value after " + a);
      return argv[++i];
    };
    if (a == "--quick") {
      quick = true;
    } else if (a == "--synthetic-elements") {
      synthetic_elements = std::stoull(value());
      synthetic_set = true;
    } else if (a == "--warmup") {
      warmup = std::stoi(value());
    } else if (a == "--steps") {
      steps = std::stoi(value());
    } else if (a == "--presets") {
      presets_set = true;
      presets.clear();
      std::string s = value();
      for (size_t p = 0; p <= s.size();) {
        const size_t q = std::min(s.find(',', p), s.size());
        if (q > p && s.substr(p, q - p) != "none")
          presets.push_back(s.substr(p, q - p));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: sync_codec_bench [--quick] [--synthetic-elements N] [--warmup W] "
                   "[--steps S] [--presets tiny,50m | none]\n");
      return 2;
    }
  }
  if (quick) {
    if (!synthetic_set)
      synthetic_elements = uint64_t{16} << 20;
    if (!presets_set)
      presets = {"tiny"};
    steps = 1;
  }
  at::set_num_threads(2);
  const int reps = quick ? 2 : 3;

  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::printf("SparseRL-Sync codec (actors/sync/delta_codec.hpp): bytes per version and speed "
              "(GB/s = dense bf16 bytes / time; best of %d).\n",
              reps);
  std::printf("enc 1t = encode_delta with threads = 1; enc %ut = threads = 0 (all %u hardware "
              "threads, bytes checked equal to 1t); apply and memcpy: single thread.\n",
              hw, hw);
  std::printf("learner rows: sorl learner_core, AdamW (wd 0.01), GRPO batch of 2 groups x 4 "
              "synthetic samples per step, bf16 cast of the fp32 master weights before and after "
              "each step, %d warm-up steps, sums over %d measured steps.\n",
              warmup, steps);
  std::printf("synthetic rows: %llu bf16 elements, random sign, exponent 117..124, random "
              "mantissa; changes at uniformly random positions (geometric gaps), 96%% by +/-1 ULP "
              "(equally likely), 4%% to a uniformly random other pattern; splitmix64 seed 1.\n",
              static_cast<unsigned long long>(synthetic_elements));
  std::printf("naive = int32 index + bf16 value (6 B per change); zstd -3 and lz4 compress the "
              "XOR of old and new bits; bits/chg = ours x 8 / changed.\n\n");
  const std::string enc_mt = "enc " + std::to_string(hw) + "t";
  std::printf("| %-26s | %8s | %6s | %10s | %10s | %10s | %10s | %10s | %8s | %5s | %6s | %6s "
              "| %6s | %6s |\n",
              "version pair", "changed", "+-1", "dense", "naive", "ours", "zstd-3 xor",
              "lz4 xor", "dense/us", "b/chg", "enc 1t", enc_mt.c_str(), "apply", "memcpy");
  std::printf("|%s|\n", std::string(190, '-').c_str());

  for (const auto& preset : presets)
    for (double lr : {1e-6, 1e-5})
      print_row(learner_row(preset, lr, warmup, steps, reps));
  for (double fraction : {0.001, 0.01, 0.05}) {
    row r;
    char name[64];
    std::snprintf(name, sizeof name, "synthetic %.1f%%", 100 * fraction);
    r.name = name;
    measure(synthetic(synthetic_elements, fraction, 1), reps, r);
    print_row(r);
  }
  std::printf("\ntargets: dense/ours >= 150x at ~1%% changed; encode (enc %ut) >= 50%% of "
              "single-thread memcpy GB/s. Every row's round trip was verified bit for bit.\n",
              hw);
  return 0;
}
