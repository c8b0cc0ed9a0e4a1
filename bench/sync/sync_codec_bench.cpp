// SparseRL-Sync codec bench (ARCHITECTURE.md §6): size and speed of the sparse bf16 delta codec
// (runtime/sync/delta_codec.hpp) against dense bf16, a naive sparse format (int32 index + bf16
// value), zstd -3 and lz4 of the step stream the codec codes, of the XOR of old and new bits
// and of the new bits alone, and memcpy measured in the same run on the same bytes with as
// many threads as the encode it is compared with. Rows: consecutive weight versions of sorl's
// own learner (AdamW on a synthetic GRPO batch) and a synthetic bf16 tensor. Every row's round
// trip is checked bit for bit (a mismatch exits 1); a missed target exits 3 unless
// --report-only. Run through bench/sync/sync_codec.sh. The run's record (bench/record.hpp:
// tables "bytes", "speed", "targets") goes to --record PATH, else $SORL_BENCH_RECORD, else
// runs/bench/.

#include "actors/learner/learner_core.hpp"
#include "bench/record_ml.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/sync/delta_codec.hpp"

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
#include <exception>
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

/// Runs f and lowers `best` to its time in seconds if that is shorter.
void time_into(double& best, const std::function<void()>& f) {
  const auto t0 = clock_type::now();
  f();
  best = std::min(best, seconds_since(t0));
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "sync_codec_bench: FAILED: %s\n", what.c_str());
  std::exit(1);
}

/// One version pair: tensors of base and next bits.
struct version_pair {
  std::vector<std::vector<uint16_t>> base, next;
};

/// What one row reports. Sizes in bytes; times in seconds, each the best of `reps` runs and
/// summed over the row's version pairs.
struct row {
  std::string name;
  uint64_t versions = 0; ///< version pairs measured
  uint64_t elements = 0, changed = 0;
  uint64_t dense = 0, naive = 0, ours = 0;
  uint64_t zstd_step = 0, zstd_xor = 0, zstd_new = 0, lz4_step = 0, lz4_xor = 0;
  uint64_t plus_minus_one = 0; ///< changes by exactly ±1 ULP
  uint64_t dense_entries = 0, buckets = 0;
  double scan_s = 0;          ///< find_changed over every segment, one thread
  double encode_s = 0;        ///< encode_delta with threads = 1
  double encode_mt_s = 0;     ///< encode_delta with threads = the bench's thread count
  double memcpy_s = 0;        ///< memcpy of the new bits, one thread
  double memcpy_mt_s = 0;     ///< the same memcpy split over the bench's thread count
  double check_s = 0;         ///< check_delta_bucket of every bucket
  double apply_checked_s = 0; ///< apply_checked_delta_bucket of every (checked) bucket
  double apply_s = 0;         ///< apply_delta_bucket (check and write) of every bucket
};

/// One zstd stream at level 3 that counts the compressed bytes it produces.
class zstd_counter {
public:
  zstd_counter() : cctx_(ZSTD_createCCtx()), out_(ZSTD_CStreamOutSize()) {
    if (cctx_ == nullptr)
      fail("ZSTD_createCCtx");
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, 3);
  }
  ~zstd_counter() {
    ZSTD_freeCCtx(cctx_);
  }
  zstd_counter(const zstd_counter&) = delete;
  zstd_counter& operator=(const zstd_counter&) = delete;

  void feed(const void* data, size_t bytes) {
    run(data, bytes, ZSTD_e_continue);
  }
  /// Ends the frame; returns the bytes of the whole stream.
  uint64_t finish() {
    run(nullptr, 0, ZSTD_e_end);
    return bytes_;
  }

private:
  void run(const void* data, size_t size, ZSTD_EndDirective mode) {
    ZSTD_inBuffer in{data, size, 0};
    for (;;) {
      ZSTD_outBuffer out{out_.data(), out_.size(), 0};
      const size_t left = ZSTD_compressStream2(cctx_, &out, &in, mode);
      if (ZSTD_isError(left))
        fail(ZSTD_getErrorName(left));
      bytes_ += out.pos;
      if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size)
        return;
    }
  }
  ZSTD_CCtx* cctx_;
  std::vector<char> out_;
  uint64_t bytes_ = 0;
};

/// lz4 of `n` elements as one independent block (as lz4's frame format cuts its input).
uint64_t lz4_bytes(const uint16_t* data, size_t n, std::vector<char>& scratch) {
  const int l = LZ4_compress_default(reinterpret_cast<const char*>(data), scratch.data(),
                                     static_cast<int>(n * 2), static_cast<int>(scratch.size()));
  if (l <= 0)
    fail("LZ4_compress_default");
  return static_cast<uint64_t>(l);
}

/// The general-purpose baselines, each over all tensors of the version pair in order:
///   step: the dense u16 stream of delta_step(old, new) at every element (0 where unchanged):
///         exactly the information the codec codes, in the form it codes it;
///   xor:  old ^ new bits;
///   new:  the new bf16 bits alone (a compressed full version, no base needed).
/// zstd -3 runs as one stream per baseline; lz4 compresses independent blocks of at most 64 MiB.
/// Works in chunks so that no 2-byte-per-element copy of a whole tensor is held.
void compression_baselines(const version_pair& v, row& r) {
  size_t largest = 0;
  for (const auto& t : v.base)
    largest = std::max(largest, t.size());
  const size_t chunk_elems = std::max<size_t>(1, std::min(size_t{32} << 20, largest));
  std::vector<uint16_t> step(chunk_elems), x(chunk_elems);
  std::vector<char> lz(static_cast<size_t>(LZ4_compressBound(static_cast<int>(chunk_elems * 2))));
  zstd_counter z_step, z_xor, z_new;
  uint64_t l_step = 0, l_xor = 0;
  for (size_t t = 0; t < v.base.size(); ++t) {
    const auto& a = v.base[t];
    const auto& b = v.next[t];
    for (size_t off = 0; off < a.size(); off += chunk_elems) {
      const size_t n = std::min(chunk_elems, a.size() - off);
      for (size_t i = 0; i < n; ++i) {
        step[i] = sync::delta_step(a[off + i], b[off + i]);
        x[i] = static_cast<uint16_t>(a[off + i] ^ b[off + i]);
      }
      l_step += lz4_bytes(step.data(), n, lz);
      l_xor += lz4_bytes(x.data(), n, lz);
      z_step.feed(step.data(), n * 2);
      z_xor.feed(x.data(), n * 2);
      z_new.feed(b.data() + off, n * 2);
    }
  }
  r.zstd_step += z_step.finish();
  r.zstd_xor += z_xor.finish();
  r.zstd_new += z_new.finish();
  r.lz4_step += l_step;
  r.lz4_xor += l_xor;
}

/// Copies every tensor of `src` into `dst` on `threads` threads (the calling thread one of
/// them, the others started and joined within the call, as encode_delta does): the elements of
/// all tensors, taken in order, are split into `threads` contiguous, equal ranges.
void parallel_copy(std::vector<std::vector<uint16_t>>& dst,
                   const std::vector<std::vector<uint16_t>>& src, unsigned threads) {
  uint64_t total = 0;
  for (const auto& t : src)
    total += t.size();
  auto copy_range = [&](uint64_t lo, uint64_t hi) {
    uint64_t base = 0;
    for (size_t t = 0; t < src.size() && base < hi; base += src[t].size(), ++t) {
      const uint64_t a = std::max(lo, base), b = std::min(hi, base + src[t].size());
      if (a < b)
        std::memcpy(dst[t].data() + (a - base), src[t].data() + (a - base), (b - a) * 2);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < threads; ++k)
    pool.emplace_back(copy_range, total * k / threads, total * (k + 1) / threads);
  copy_range(0, total / threads);
  for (auto& th : pool)
    th.join();
}

/// Encodes, checks, applies (verified bit for bit) and measures one version pair; adds into
/// `r`. `threads` is the thread count of the multi-threaded encode and memcpy. Each of the `reps`
/// rounds times every operation once, back to back, and each operation keeps its best round:
/// on a shared machine an encode and the memcpy it is compared with then see the same load.
void measure(const version_pair& v, int reps, unsigned threads, row& r) {
  std::vector<sync::delta_source> sources;
  uint64_t elements = 0;
  for (size_t t = 0; t < v.base.size(); ++t) {
    sources.push_back(
      {static_cast<uint32_t>(t), v.base[t].data(), v.next[t].data(), v.base[t].size()});
    elements += v.base[t].size();
  }
  std::vector<uint32_t> positions(sync::delta_segment_elements);
  sync::delta_stats st;
  sync::delta_options one, many;
  one.threads = 1;
  many.threads = threads;
  std::vector<std::vector<uint8_t>> buckets, buckets_mt;
  std::vector<std::vector<uint16_t>> work;
  std::vector<sync::delta_target> targets;
  auto reset_work = [&] {
    work = v.base;
    targets.clear();
    for (size_t t = 0; t < work.size(); ++t)
      targets.push_back({static_cast<uint32_t>(t), work[t].data(), work[t].size()});
  };
  auto verify_work = [&](const char* what) {
    for (size_t t = 0; t < work.size(); ++t)
      if (work[t] != v.next[t])
        fail(r.name + ": " + what + ": not bit-exact in tensor " + std::to_string(t));
  };
  // Applies every bucket onto a fresh copy of the base (copy untimed), then compares bit for bit.
  auto apply_all = [&](double& best, const char* what, auto&& apply_one) {
    reset_work();
    time_into(best, [&] {
      for (const auto& b : buckets)
        if (auto err = apply_one(b.data(), b.size(), uint64_t{1}, uint64_t{2}, targets))
          fail(r.name + ": " + what + ": " + *err);
    });
    verify_work(what);
  };
  double scan = 1e30, enc = 1e30, mc = 1e30, enc_mt = 1e30, mc_mt = 1e30, chk = 1e30,
         app_checked = 1e30, app = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    // The encoder's own first pass alone: find_changed over each segment.
    uint64_t scanned = 0;
    time_into(scan, [&] {
      for (const auto& s : sources)
        for (uint64_t off = 0; off < s.elements; off += sync::delta_segment_elements)
          scanned += sync::find_changed(s.base + off, s.next + off,
                                        std::min(sync::delta_segment_elements, s.elements - off),
                                        positions.data());
    });
    time_into(enc, [&] { buckets = sync::encode_delta(1, 2, sources, one, &st); });
    if (scanned != st.changed)
      fail(r.name + ": find_changed counts differ from encode_delta's");
    // memcpy of the same dense bytes in the same tensor sizes, on one thread and on `threads`.
    reset_work();
    time_into(mc, [&] {
      for (size_t t = 0; t < work.size(); ++t)
        std::memcpy(work[t].data(), v.next[t].data(), v.next[t].size() * 2);
    });
    verify_work("memcpy");
    time_into(enc_mt, [&] { buckets_mt = sync::encode_delta(1, 2, sources, many, nullptr); });
    if (buckets_mt != buckets)
      fail(r.name + ": encoding on " + std::to_string(threads) +
           " threads differs from one thread");
    reset_work();
    time_into(mc_mt, [&] { parallel_copy(work, v.next, threads); });
    verify_work("parallel memcpy");
    time_into(chk, [&] {
      for (const auto& b : buckets)
        if (auto err = sync::check_delta_bucket(b.data(), b.size(), 1, 2, targets))
          fail(r.name + ": check: " + *err);
    });
    apply_all(app_checked, "apply_checked_delta_bucket", sync::apply_checked_delta_bucket);
    apply_all(app, "apply_delta_bucket", sync::apply_delta_bucket);
  }

  uint64_t pm1 = 0;
  for (size_t t = 0; t < v.base.size(); ++t)
    for (size_t i = 0; i < v.base[t].size(); ++i) {
      const auto s = sync::delta_step(v.base[t][i], v.next[t][i]);
      pm1 += s == 1 || s == 0xFFFF;
    }
  compression_baselines(v, r);
  r.versions += 1;
  r.elements += elements;
  r.changed += st.changed;
  r.plus_minus_one += pm1;
  r.dense += st.dense_bytes;
  r.naive += 6 * st.changed;
  r.ours += st.encoded_bytes;
  r.dense_entries += st.dense_segments;
  r.buckets += st.buckets;
  r.scan_s += scan;
  r.encode_s += enc;
  r.encode_mt_s += enc_mt;
  r.memcpy_s += mc;
  r.memcpy_mt_s += mc_mt;
  r.check_s += chk;
  r.apply_checked_s += app_checked;
  r.apply_s += app;
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

row learner_row(const std::string& preset, double lr, int warmup, int steps, int reps,
                unsigned threads) {
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
    measure(v, reps, threads, r);
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
      base[j] =
        static_cast<uint16_t>((x & 0x8000u) | ((117u + ((x >> 7) & 7u)) << 7) | (x & 0x7Fu));
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

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

/// GB/s of a row's dense bytes moved in `s` seconds.
double gbs(const row& r, double s) {
  return ratio(static_cast<double>(r.dense), s) / 1e9;
}

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

/// Prints a row of the bytes table and adds it to the record's.
void print_size_row(const row& r, bench::record_table& t) {
  const auto ours = static_cast<double>(r.ours);
  t.add_row({r.name, 100 * ratio(static_cast<double>(r.changed), static_cast<double>(r.elements)),
             100 * ratio(static_cast<double>(r.plus_minus_one), static_cast<double>(r.changed)),
             mib(r.dense), mib(r.naive), mib(r.ours), mib(r.zstd_step), mib(r.zstd_xor), mib(r.zstd_new),
             mib(r.lz4_step), mib(r.lz4_xor), ratio(static_cast<double>(r.dense), ours),
             ratio(static_cast<double>(r.zstd_step), ours), 8 * ratio(ours, static_cast<double>(r.changed))});
  std::printf(
    "| %-26s | %8.4f%% | %5.1f%% | %10s | %10s | %10s | %10s | %10s | %10s | %10s | "
    "%10s | %8.1fx | %7.2fx | %5.2f |\n",
    r.name.c_str(), 100 * ratio(static_cast<double>(r.changed), static_cast<double>(r.elements)),
    100 * ratio(static_cast<double>(r.plus_minus_one), static_cast<double>(r.changed)),
    human(r.dense).c_str(), human(r.naive).c_str(), human(r.ours).c_str(),
    human(r.zstd_step).c_str(), human(r.zstd_xor).c_str(), human(r.zstd_new).c_str(),
    human(r.lz4_step).c_str(), human(r.lz4_xor).c_str(), ratio(static_cast<double>(r.dense), ours),
    ratio(static_cast<double>(r.zstd_step), ours), 8 * ratio(ours, static_cast<double>(r.changed)));
}

/// Prints a row of the speed table and adds it to the record's.
void print_speed_row(const row& r, bench::record_table& t) {
  t.add_row({r.name, gbs(r, r.scan_s), gbs(r, r.encode_s), gbs(r, r.memcpy_s), 100 * ratio(r.memcpy_s, r.encode_s),
             gbs(r, r.encode_mt_s), gbs(r, r.memcpy_mt_s), 100 * ratio(r.memcpy_mt_s, r.encode_mt_s),
             gbs(r, r.check_s), gbs(r, r.apply_checked_s), gbs(r, r.apply_s),
             1e3 * ratio(r.encode_s, static_cast<double>(r.versions)),
             1e3 * ratio(r.apply_s, static_cast<double>(r.versions))});
  std::printf("| %-26s | %7.2f | %7.2f | %7.2f | %6.0f%% | %7.2f | %7.2f | %6.0f%% | %7.2f | "
              "%7.2f | %7.2f | %9.3f | %9.3f |\n",
              r.name.c_str(), gbs(r, r.scan_s), gbs(r, r.encode_s), gbs(r, r.memcpy_s),
              100 * ratio(r.memcpy_s, r.encode_s), gbs(r, r.encode_mt_s), gbs(r, r.memcpy_mt_s),
              100 * ratio(r.memcpy_mt_s, r.encode_mt_s), gbs(r, r.check_s),
              gbs(r, r.apply_checked_s), gbs(r, r.apply_s),
              1e3 * ratio(r.encode_s, static_cast<double>(r.versions)),
              1e3 * ratio(r.apply_s, static_cast<double>(r.versions)));
}

/// The 1-minute load average from /proc/loadavg, or a negative value where there is none.
double load_average() {
  double load = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1)
      load = -1;
    std::fclose(f);
  }
  return load;
}

/// One target, checked on one row.
struct target {
  std::string what;
  double value, threshold;
  std::string shown;
};

} // namespace

int main(int argc, char** argv) {
  bool quick = false, report_only = false;
  uint64_t synthetic_elements = uint64_t{1} << 30;
  bool synthetic_set = false, presets_set = false;
  int warmup = 2, steps = 3;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> presets = {"tiny", "50m"};
  std::string record_flag;
  const char* usage =
    "usage: sync_codec_bench [--quick] [--report-only] [--threads T] [--synthetic-elements N] "
    "[--warmup W] [--steps S] [--presets tiny,50m | none] [--record PATH]\n";
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "sync_codec_bench: missing value after %s\n%s", a.c_str(), usage);
          std::exit(2);
        }
        return argv[++i];
      };
      if (a == "--quick") {
        quick = true;
      } else if (a == "--report-only") {
        report_only = true;
      } else if (a == "--threads") {
        const int t = std::stoi(value());
        if (t < 1) {
          std::fprintf(stderr, "sync_codec_bench: --threads must be >= 1\n%s", usage);
          return 2;
        }
        threads = static_cast<unsigned>(t);
      } else if (a == "--synthetic-elements") {
        synthetic_elements = std::stoull(value());
        synthetic_set = true;
      } else if (a == "--warmup") {
        warmup = std::stoi(value());
      } else if (a == "--steps") {
        steps = std::stoi(value());
      } else if (a == "--record") {
        record_flag = value();
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
        std::fprintf(stderr, "%s", usage);
        return 2;
      }
    }
  } catch (const std::exception& e) { // std::stoi / std::stoull on a bad number
    std::fprintf(stderr, "sync_codec_bench: bad number (%s)\n%s", e.what(), usage);
    return 2;
  }
  if (quick) {
    if (!synthetic_set)
      synthetic_elements = uint64_t{16} << 20;
    if (!presets_set)
      presets = {"tiny"};
    steps = 1;
  }
  at::set_num_threads(2);
  const int reps = quick ? 5 : 3;
  const std::string nt = std::to_string(threads) + "t";
  bench::bench_record rec("sync-codec", argc, argv);
  rec.set_threads(static_cast<int>(threads));
  rec.set_runtime(bench::ml_record_runtime());
  rec.set_parameter("warmup_steps", warmup);
  rec.set_parameter("steps", steps);
  rec.set_parameter("synthetic_elements", synthetic_elements);
  rec.set_parameter("rounds", reps);

  std::printf("SparseRL-Sync codec (runtime/sync/delta_codec.hpp): bytes per version and speed.\n");
  std::printf("learner rows: sorl learner_core, AdamW (wd 0.01), GRPO batch of 2 groups x 4 "
              "synthetic samples per step, bf16 cast of the fp32 master weights before and after "
              "each step, %d warm-up steps, sums over %d measured steps; lr 2e-04 is the lr of "
              "the shipped configs.\n",
              warmup, steps);
  std::printf("synthetic rows: %llu bf16 elements, random sign, exponent 117..124, random "
              "mantissa; changes at uniformly random positions (geometric gaps), 96%% by +/-1 ULP "
              "(equally likely), 4%% to a uniformly random other pattern; splitmix64 seed 1.\n\n",
              static_cast<unsigned long long>(synthetic_elements));

  // The tables print once every row is measured; progress goes to stderr meanwhile.
  const auto started = clock_type::now();
  std::vector<row> rows;
  auto measured = [&](row r) {
    std::fprintf(stderr, "sync_codec_bench: %s measured (%.0f s)\n", r.name.c_str(),
                 seconds_since(started));
    rows.push_back(std::move(r));
  };
  for (const auto& preset : presets)
    for (double lr : {1e-6, 1e-5, 2e-4})
      measured(learner_row(preset, lr, warmup, steps, reps, threads));
  for (double fraction : {0.001, 0.01, 0.05}) {
    row r;
    char name[64];
    std::snprintf(name, sizeof name, "synthetic %.1f%%", 100 * fraction);
    r.name = name;
    measure(synthetic(synthetic_elements, fraction, 1), reps, threads, r);
    measured(std::move(r));
  }

  std::printf("Bytes per version. naive = int32 index + bf16 value (6 B per change). zstd -3 "
              "and lz4 of: step = the u16 step (new - old) mod 2^16 at every element, the input "
              "the codec codes; xor = old ^ new bits; new = the new bf16 bits alone (a "
              "compressed full version). zstd/us = zstd step / ours; b/chg = ours x 8 / "
              "changed.\n");
  std::printf("| %-26s | %9s | %6s | %10s | %10s | %10s | %10s | %10s | %10s | %10s | %10s | "
              "%9s | %8s | %5s |\n",
              "version pair", "changed", "+-1", "dense", "naive", "ours", "zstd step", "zstd xor",
              "zstd new", "lz4 step", "lz4 xor", "dense/us", "zstd/us", "b/chg");
  std::printf("|%s|\n", std::string(190, '-').c_str());
  bench::record_table& bytes = rec.add_table(
    "bytes", "bytes per version: the codec against dense, naive, zstd -3 and lz4 on the same versions",
    {{"pair", "version pair"},
     {"changed", "changed", "%", 4},
     {"plus_minus_one", "±1 ULP", "% of changes", 1},
     {"dense_mib", "dense", "MiB", -1, true, 3},
     {"naive_mib", "naive", "MiB", -1, true, 3},
     {"ours_mib", "ours", "MiB", -1, false, 3},
     {"zstd_step_mib", "zstd step", "MiB", -1, true, 3},
     {"zstd_xor_mib", "zstd xor", "MiB", -1, true, 3},
     {"zstd_new_mib", "zstd new", "MiB", -1, true, 3},
     {"lz4_step_mib", "lz4 step", "MiB", -1, true, 3},
     {"lz4_xor_mib", "lz4 xor", "MiB", -1, true, 3},
     {"dense_over_ours", "dense / ours", "x", 1},
     {"zstd_over_ours", "zstd step / ours", "x", 2},
     {"bits_per_change", "ours per change", "bits", 2}});
  for (const auto& r : rows)
    print_size_row(r, bytes);

  std::printf("\nSpeed in GB/s = dense bf16 bytes / time, best of %d rounds that "
              "each time every operation once, back to back (learner rows: summed over their "
              "steps). 1t = one thread; %s = %u threads (encode_delta with "
              "delta_options::threads = %u, bytes checked equal to 1t; memcpy split into %u "
              "equal ranges, threads started per call as encode_delta does). scan = "
              "find_changed alone (the encoder's first pass); enc/mc = encode speed as a share "
              "of memcpy's on as many threads; check = check_delta_bucket, apply chk = "
              "apply_checked_delta_bucket, apply = apply_delta_bucket (both), one thread; "
              "ms = per version. Every round trip is verified bit for bit.\n",
              reps, nt.c_str(), threads, threads, threads);
  const std::string enc_nt = "enc " + nt, mc_nt = "mc " + nt;
  std::printf("| %-26s | %7s | %7s | %7s | %7s | %7s | %7s | %7s | %7s | %7s | %7s | %9s | "
              "%9s |\n",
              "version pair", "scan 1t", "enc 1t", "mc 1t", "enc/mc", enc_nt.c_str(), mc_nt.c_str(),
              "enc/mc", "check", "apply c", "apply", "enc 1t ms", "apply ms");
  std::printf("|%s|\n", std::string(144, '-').c_str());
  bench::record_table& speed = rec.add_table(
    "speed", "GB/s of dense bf16 bytes, best of the rounds; memcpy on as many threads is the baseline",
    {{"pair", "version pair"},
     {"scan_1t", "scan 1t", "GB/s", 2},
     {"encode_1t", "encode 1t", "GB/s", 2},
     {"memcpy_1t", "memcpy 1t", "GB/s", 2, true},
     {"encode_of_memcpy_1t", "encode / memcpy 1t", "%", 0},
     {"encode_nt", "encode " + nt, "GB/s", 2},
     {"memcpy_nt", "memcpy " + nt, "GB/s", 2, true},
     {"encode_of_memcpy_nt", "encode / memcpy " + nt, "%", 0},
     {"check", "check", "GB/s", 2},
     {"apply_checked", "apply checked", "GB/s", 2},
     {"apply", "apply", "GB/s", 2},
     {"encode_1t_ms", "encode 1t per version", "ms", 3},
     {"apply_ms", "apply per version", "ms", 3}});
  for (const auto& r : rows)
    print_speed_row(r, speed);

  // Targets, on the synthetic 1 % row (the change fraction they are set for).
  const row& one = rows[rows.size() - 2];
  char buf[160];
  std::vector<target> targets;
  std::snprintf(buf, sizeof buf, "%.1fx",
                ratio(static_cast<double>(one.dense), static_cast<double>(one.ours)));
  targets.push_back({"dense/ours >= 150x",
                     ratio(static_cast<double>(one.dense), static_cast<double>(one.ours)), 150,
                     buf});
  std::snprintf(buf, sizeof buf, "%.0f%% (%.2f / %.2f GB/s)",
                100 * ratio(one.memcpy_s, one.encode_s), gbs(one, one.encode_s),
                gbs(one, one.memcpy_s));
  targets.push_back({"enc 1t >= 50% of memcpy 1t", ratio(one.memcpy_s, one.encode_s), 0.5, buf});
  if (threads > 1) {
    std::snprintf(buf, sizeof buf, "%.0f%% (%.2f / %.2f GB/s)",
                  100 * ratio(one.memcpy_mt_s, one.encode_mt_s), gbs(one, one.encode_mt_s),
                  gbs(one, one.memcpy_mt_s));
    targets.push_back(
      {"enc " + nt + " >= 50% of memcpy " + nt, ratio(one.memcpy_mt_s, one.encode_mt_s), 0.5, buf});
  }
  int missed = 0;
  std::printf("\ntargets (on the %s row):\n", one.name.c_str());
  // Other work on the machine slows memcpy and encode by different, varying amounts.
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const double load = load_average();
  if (load > hw)
    std::printf("  note: load average %.1f on %u hardware threads at the end of the run: the "
                "speed targets' verdicts are unreliable; rerun on an idle machine.\n",
                load, hw);
  bench::record_table& verdicts = rec.add_table(
    "targets", "targets on the " + one.name + " row",
    {{"target", "target"}, {"measured", "measured"}, {"verdict", "verdict"}});
  for (const auto& t : targets) {
    const bool pass = t.value >= t.threshold;
    missed += !pass;
    std::printf("  %-4s %-30s %s\n", pass ? "PASS" : "FAIL", t.what.c_str(), t.shown.c_str());
    verdicts.add_row({t.what, t.shown, pass ? "PASS" : "FAIL"});
  }
  std::fflush(stdout);
  try {
    const std::string path = bench::record_path("sync-codec", record_flag);
    if (rec.write(path))
      std::fprintf(stderr, "record: %s\n", path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sync_codec_bench: %s\n", e.what());
    return 1;
  }
  if (missed > 0) {
    std::fprintf(stderr, "sync_codec_bench: %d of %zu targets missed%s\n", missed, targets.size(),
                 report_only ? " (--report-only: exit 0)" : "");
    if (!report_only)
      return 3;
  }
  return 0;
}
