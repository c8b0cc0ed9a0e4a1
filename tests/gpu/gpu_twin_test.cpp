// The CPU twin of the GPU delta codec (gpu/delta_twin.hpp) runs the kernels' own per-thread
// functions; these tests pin it to the CPU codec (runtime/sync/delta_codec.hpp) byte for byte.

#include "gpu/delta_twin.hpp"
#include "gpu/sparse_sync_kernels.cuh"
#include "runtime/sync/delta_codec.hpp"
#include "tests/gpu/delta_test_data.hpp"
#include "tests/runtime/sync/same_stats.hpp"

#include <catch2/catch.hpp>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sorl;
using sorl::gpu::test::make_delta;
using sorl::gpu::test::step_mix;
using sorl::gpu::test::tensor_pair;

namespace {

std::vector<sync::delta_source> sources_of(const std::vector<tensor_pair>& ts,
                                           const std::vector<uint32_t>& ids) {
  std::vector<sync::delta_source> s;
  for (size_t i = 0; i < ts.size(); ++i)
    s.push_back(sync::delta_source{ids[i], ts[i].base.data(), ts[i].next.data(),
                                   ts[i].base.size()});
  return s;
}

/// Encodes with both codecs, requires identical buckets and stats, then applies them with both
/// decoders to copies of the bases and requires both to end at `next`.
void check_same(const std::vector<tensor_pair>& ts, const std::vector<uint32_t>& ids,
                uint64_t bucket_bytes, sync::delta_stats* stats_out = nullptr) {
  const auto sources = sources_of(ts, ids);
  sync::delta_options opt;
  opt.bucket_bytes = bucket_bytes;
  sync::delta_stats cpu_stats, twin_stats;
  const auto cpu = sync::encode_delta(7, 8, sources, opt, &cpu_stats);
  const auto twin = gpu::encode_delta_twin(7, 8, sources, opt, &twin_stats);
  REQUIRE(twin.size() == cpu.size());
  for (size_t b = 0; b < cpu.size(); ++b) {
    INFO("bucket " << b << " of " << cpu.size());
    REQUIRE(twin[b] == cpu[b]);
  }
  sync::test::check_same_stats(twin_stats, cpu_stats);

  std::vector<std::vector<uint16_t>> by_cpu, by_twin;
  std::vector<sync::delta_target> cpu_targets, twin_targets;
  by_cpu.reserve(ts.size());
  by_twin.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    by_cpu.push_back(ts[i].base);
    by_twin.push_back(ts[i].base);
    cpu_targets.push_back(sync::delta_target{ids[i], by_cpu.back().data(), ts[i].base.size()});
    twin_targets.push_back(sync::delta_target{ids[i], by_twin.back().data(), ts[i].base.size()});
  }
  for (const auto& b : cpu) {
    REQUIRE_FALSE(sync::apply_delta_bucket(b.data(), b.size(), 7, 8, cpu_targets));
    const auto err = gpu::apply_delta_bucket_twin(b.data(), b.size(), 7, 8, twin_targets);
    INFO((err ? *err : std::string{}));
    REQUIRE_FALSE(err);
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    REQUIRE(by_cpu[i] == ts[i].next);
    REQUIRE(by_twin[i] == ts[i].next);
  }
  if (stats_out != nullptr)
    *stats_out = cpu_stats;
}

} // namespace

TEST_CASE("the twin encodes one tensor byte-identically across sizes and change fractions",
          "[gpu][twin]") {
  const uint64_t seg = sync::delta_segment_elements;
  const uint64_t sizes[] = {0, 1, 7, 12345, 2 * seg + 777};
  const double fractions[] = {0.0, 1e-4, 1e-2, 0.5, 1.0};
  uint64_t seed = 1;
  for (uint64_t n : sizes) {
    for (double f : fractions) {
      INFO("elements " << n << ", fraction " << f);
      const auto t = make_delta(n, f, step_mix::ulp, seed++);
      check_same({t}, {3}, sync::delta_options{}.bucket_bytes);
    }
  }
}

TEST_CASE("the twin reproduces minus-first entries and dense fallbacks", "[gpu][twin]") {
  const uint64_t n = sync::delta_segment_elements + 4099;
  sync::delta_stats st;
  check_same({make_delta(n, 0.02, step_mix::minus, 11)}, {0}, 64ull << 20, &st);
  check_same({make_delta(n, 1.0, step_mix::random, 12)}, {0}, 64ull << 20, &st);
  CHECK(st.dense_segments == 2);
  check_same({make_delta(n, 0.3, step_mix::random, 13)}, {0}, 64ull << 20, &st);
  CHECK(st.dense_segments == 0); // ~22 bits per change at 30 % is still below 16 per element
}

TEST_CASE("the twin cuts entries at small bucket sizes exactly as the CPU encoder",
          "[gpu][twin]") {
  std::vector<tensor_pair> ts;
  ts.push_back(make_delta(5000, 0.01, step_mix::ulp, 21));
  ts.push_back(make_delta(1, 1.0, step_mix::ulp, 22));
  ts.push_back(make_delta(sync::delta_segment_elements + 3, 0.002, step_mix::ulp, 23));
  ts.push_back(make_delta(40000, 0.5, step_mix::random, 24));
  ts.push_back(make_delta(0, 0.0, step_mix::ulp, 25));
  ts.push_back(make_delta(70001, 0.05, step_mix::minus, 26));
  const std::vector<uint32_t> ids = {9, 2, 5, 40, 1, 17}; // not in id order
  for (uint64_t bucket : {uint64_t{256}, uint64_t{1000}, uint64_t{4096}, uint64_t{65536},
                          uint64_t{1} << 20}) {
    INFO("bucket_bytes " << bucket);
    sync::delta_stats st;
    check_same(ts, ids, bucket, &st);
    if (bucket <= 4096)
      CHECK(st.buckets > 10);
  }
}

TEST_CASE("parameters from reduced sums equal choose_delta_params", "[gpu][twin]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t m = 1 + rng() % 300;
    const uint32_t spread = trial % 4 == 0 ? 1u : trial % 4 == 1 ? 50u : trial % 4 == 2 ? 5000u
                                                                                        : 1u << 20;
    std::vector<uint32_t> pos(m);
    std::vector<uint16_t> steps(m);
    uint64_t p = rng() % spread;
    for (size_t i = 0; i < m; ++i) {
      pos[i] = static_cast<uint32_t>(p);
      p += 1 + rng() % spread;
      const uint64_t r = rng() % 10;
      steps[i] = r < 4 ? 1 : r < 8 ? 0xFFFF : static_cast<uint16_t>(1 + rng() % 65535);
    }
    const auto want = sync::choose_delta_params(pos.data(), steps.data(), m);
    const uint64_t last = pos[m - 1];
    const uint32_t k_lo = gpu::rice_window_low(m, last);
    gpu::segment_sums sums;
    gpu::sums_clear(sums);
    for (size_t i = 0; i < m; ++i)
      gpu::sums_add_element(sums, gpu::change_gap(pos.data(), i), steps[i], k_lo);
    const gpu::code_params got = gpu::params_from_sums(sums, m, last);
    REQUIRE(got.rice_k == want.rice_k);
    REQUIRE(got.escape_k == want.escape_k);
    REQUIRE((got.minus_first != 0) == want.minus_first);
    REQUIRE(gpu::sparse_bits_from_sums(sums, m, last, got) ==
            sync::delta_sparse_bits(pos.data(), steps.data(), m, want));
    uint64_t per_element = 0;
    for (size_t i = 0; i < m; ++i)
      per_element += gpu::element_code_bits(gpu::change_gap(pos.data(), i), steps[i], got);
    REQUIRE(per_element == sync::delta_sparse_bits(pos.data(), steps.data(), m, want));
  }
}

TEST_CASE("the twin apply rejects a bucket for another version and writes nothing",
          "[gpu][twin]") {
  const auto t = make_delta(3000, 0.1, step_mix::ulp, 31);
  const auto buckets =
    sync::encode_delta(1, 2, sources_of({t}, {0}), sync::delta_options{}, nullptr);
  std::vector<uint16_t> bits = t.base;
  const std::vector<sync::delta_target> targets = {{0, bits.data(), bits.size()}};
  CHECK(gpu::apply_delta_bucket_twin(buckets[0].data(), buckets[0].size(), 1, 3, targets));
  auto broken = buckets[0];
  broken[broken.size() / 2] ^= 1u;
  CHECK(gpu::apply_delta_bucket_twin(broken.data(), broken.size(), 1, 2, targets));
  CHECK(bits == t.base);
}

TEST_CASE("the twin encoder rejects what encode_delta rejects", "[gpu][twin]") {
  const auto t = make_delta(10, 0.5, step_mix::ulp, 41);
  sync::delta_options small;
  small.bucket_bytes = sync::delta_min_bucket_bytes - 1;
  CHECK_THROWS_AS(gpu::encode_delta_twin(0, 1, sources_of({t}, {0}), small), std::invalid_argument);
  CHECK_THROWS_AS(gpu::encode_delta_twin(0, 1, sources_of({t, t}, {4, 4}), {}),
                  std::invalid_argument);
  std::vector<sync::delta_source> null_src = {{0, nullptr, nullptr, 5}};
  CHECK_THROWS_AS(gpu::encode_delta_twin(0, 1, null_src, {}), std::invalid_argument);
}
