// The sparse bf16 weight-delta codec: bit-exact round trips, the dense fallback, the exact
// bytes of a small case, rejection of every kind of corrupt bucket without touching the target,
// fuzzing, determinism and the bucket size bound.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/sync/delta_codec.hpp"
#include "tests/runtime/sync/same_stats.hpp"

using namespace sorl::sync;

namespace {

/// One tensor's base and next bits.
struct tensor_pair {
  uint32_t id = 0;
  std::vector<uint16_t> base, next;
};

/// `n` random bf16-like patterns; each element changes with probability `fraction`: a share
/// `random` of the changes to a uniformly random other pattern, the rest by +1 or −1 ULP.
tensor_pair make_pair(uint32_t id, uint64_t n, double fraction, uint64_t seed,
                      double random = 0.04) {
  std::mt19937_64 rng{seed};
  tensor_pair t;
  t.id = id;
  t.base.resize(n);
  for (auto& b : t.base)
    b = static_cast<uint16_t>(0x3C00u + rng() % 0x0800u);
  t.next = t.base;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (uint64_t i = 0; i < n; ++i) {
    if (fraction < 1.0 && u(rng) >= fraction)
      continue;
    const double kind = u(rng);
    uint16_t s;
    if (kind < random)
      s = static_cast<uint16_t>(1 + rng() % 0xFFFFu); // any nonzero step
    else if (kind < random + (1.0 - random) / 2)
      s = 1;
    else
      s = 0xFFFF;
    t.next[i] = static_cast<uint16_t>(t.base[i] + s);
  }
  return t;
}

std::vector<delta_source> sources_of(const std::vector<tensor_pair>& ts) {
  std::vector<delta_source> out;
  for (const auto& t : ts)
    out.push_back({t.id, t.base.data(), t.next.data(), t.base.size()});
  return out;
}

/// Copies of the bases, as a worker holds them.
struct worker_copy {
  std::vector<std::vector<uint16_t>> bits;
  std::vector<delta_target> targets;

  explicit worker_copy(const std::vector<tensor_pair>& ts) {
    for (const auto& t : ts)
      bits.push_back(t.base);
    for (size_t i = 0; i < ts.size(); ++i)
      targets.push_back({ts[i].id, bits[i].data(), bits[i].size()});
  }
};

uint64_t changed_count(const tensor_pair& t) {
  uint64_t c = 0;
  for (size_t i = 0; i < t.base.size(); ++i)
    c += t.base[i] != t.next[i];
  return c;
}

/// Encodes, applies every bucket to a copy of the bases (with apply_delta_bucket, and to another
/// copy with check_delta_bucket then apply_checked_delta_bucket) and checks the results bit for
/// bit.
delta_stats round_trip(const std::vector<tensor_pair>& ts, uint64_t bucket_bytes = 64ull << 20) {
  delta_stats st;
  const auto buckets = encode_delta(4, 5, sources_of(ts), {bucket_bytes}, &st);
  REQUIRE(st.buckets == buckets.size());
  worker_copy w(ts), checked(ts);
  uint64_t encoded = 0;
  for (const auto& b : buckets) {
    REQUIRE(b.size() <= bucket_bytes);
    encoded += b.size();
    const auto err = apply_delta_bucket(b.data(), b.size(), 4, 5, w.targets);
    INFO(err.value_or(""));
    REQUIRE_FALSE(err);
    REQUIRE_FALSE(check_delta_bucket(b.data(), b.size(), 4, 5, checked.targets));
    REQUIRE_FALSE(apply_checked_delta_bucket(b.data(), b.size(), 4, 5, checked.targets));
  }
  REQUIRE(encoded == st.encoded_bytes);
  uint64_t elements = 0, changed = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    REQUIRE(w.bits[i] == ts[i].next);
    REQUIRE(checked.bits[i] == ts[i].next);
    elements += ts[i].base.size();
    changed += changed_count(ts[i]);
  }
  REQUIRE(st.elements == elements);
  REQUIRE(st.changed == changed);
  REQUIRE(st.dense_bytes == 2 * elements);
  return st;
}

/// Recomputes the trailing checksum after an edit, so that deeper checks are reached.
void reseal(std::vector<uint8_t>& b) {
  const uint64_t h = XXH3_64bits(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &h, 8);
}

template <class T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

/// One entry record of a bucket, as the format lays it out.
struct entry_record {
  uint32_t tensor = 0;
  uint8_t kind = 0;
  uint64_t offset = 0, count = 0, changed = 0, payload_bytes = 0;
};

template <class T>
T peek(const std::vector<uint8_t>& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}

/// The entry records of a bucket, in order.
std::vector<entry_record> entries_of(const std::vector<uint8_t>& b) {
  std::vector<entry_record> out(peek<uint32_t>(b, 32));
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t at = delta_header_bytes + i * delta_entry_bytes;
    out[i].tensor = peek<uint32_t>(b, at);
    out[i].kind = b[at + 4];
    out[i].offset = peek<uint64_t>(b, at + 8);
    out[i].count = peek<uint64_t>(b, at + 16);
    out[i].changed = peek<uint64_t>(b, at + 24);
    out[i].payload_bytes = peek<uint64_t>(b, at + 32);
  }
  return out;
}

/// The small hand-computed case: 10 elements of tensor 7, changes at 2 (+1), 5 (−1), 9 (+3).
tensor_pair small_case() {
  tensor_pair t;
  t.id = 7;
  t.base.assign(10, 0x3F80);
  t.next = t.base;
  t.next[2] = 0x3F81;
  t.next[5] = 0x3F7F;
  t.next[9] = 0x3F83;
  return t;
}

/// Applies `bucket` and requires an error that contains `what`, with the target unchanged.
void require_rejected(const std::vector<uint8_t>& bucket, const std::vector<tensor_pair>& ts,
                      const std::string& what, uint64_t base_version = 4, uint64_t version = 5) {
  worker_copy w(ts);
  const auto err = apply_delta_bucket(bucket.data(), bucket.size(), base_version, version,
                                      w.targets);
  REQUIRE(err);
  INFO(*err);
  CHECK(err->find(what) != std::string::npos);
  for (size_t i = 0; i < ts.size(); ++i)
    REQUIRE(w.bits[i] == ts[i].base);
  REQUIRE(check_delta_bucket(bucket.data(), bucket.size(), base_version, version, w.targets));
}

} // namespace

TEST_CASE("find_changed returns exactly the differing positions, at every alignment and tail",
          "[delta_codec]") {
  std::mt19937 rng{11};
  for (uint64_t n : {0u, 1u, 7u, 31u, 32u, 33u, 63u, 64u, 65u, 127u, 1000u, 4099u}) {
    for (int density : {0, 3, 50, 100}) {
      std::vector<uint16_t> a(n + 1), b(n + 1);
      for (uint64_t i = 0; i <= n; ++i) {
        a[i] = static_cast<uint16_t>(rng());
        b[i] = static_cast<int>(rng() % 100) < density ? static_cast<uint16_t>(a[i] ^ (1u << (rng() % 16))) : a[i];
      }
      std::vector<uint32_t> expected;
      for (uint64_t i = 1; i <= n; ++i)
        if (a[i] != b[i])
          expected.push_back(static_cast<uint32_t>(i - 1));
      std::vector<uint32_t> got(n);
      // Offset by one element: unaligned loads.
      got.resize(find_changed(a.data() + 1, b.data() + 1, n, got.data()));
      REQUIRE(got == expected);
    }
  }
}

TEST_CASE("round trips are bit-exact over change fractions and tensor sizes", "[delta_codec]") {
  const std::vector<uint64_t> sizes = {0, 1, 2, 333, 4097, (uint64_t{1} << 20) + 12345};
  for (double fraction : {0.0, 1e-4, 1e-2, 0.5, 1.0}) {
    std::vector<tensor_pair> ts;
    uint32_t id = 100;
    for (uint64_t n : sizes) {
      // Every other tensor with random steps only, so that dense entries occur too.
      ts.push_back(make_pair(id, n, fraction, id * 31 + static_cast<uint64_t>(fraction * 1e6),
                             id % 2 == 0 ? 0.04 : 1.0));
      id -= 7; // ids out of order
    }
    INFO("fraction " << fraction);
    const auto st = round_trip(ts);
    if (fraction == 0.0) {
      CHECK(st.changed == 0);
      CHECK(st.buckets == 1);
      CHECK(st.encoded_bytes == delta_header_bytes + delta_checksum_bytes);
    }
  }
}

TEST_CASE("Adam-like small steps round-trip at every change fraction and bucket size",
          "[delta_codec]") {
  // Mostly ±1..±8 ULP steps, some up to ±1000 and a few arbitrary patterns: escaped steps of
  // every Exp-Golomb length, so that the escape-cost histogram and the in-window step decoder
  // meet every code length.
  for (double fraction : {0.003, 0.05, 0.52, 1.0}) {
    std::mt19937_64 rng{static_cast<uint64_t>(fraction * 1e4)};
    std::vector<tensor_pair> ts;
    for (uint32_t id : {3u, 1u, 8u}) {
      tensor_pair t = make_pair(id, id == 8 ? (uint64_t{1} << 20) + 77 : 40000 + id, 0.0, id);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      for (size_t i = 0; i < t.base.size(); ++i) {
        if (u(rng) >= fraction)
          continue;
        const double x = u(rng);
        const int m = x < 0.45   ? 1
                      : x < 0.8  ? 2 + static_cast<int>(rng() % 3)
                      : x < 0.95 ? 5 + static_cast<int>(rng() % 4)
                      : x < 0.99 ? 9 + static_cast<int>(rng() % 992)
                                 : 1 + static_cast<int>(rng() % 0xFFFF);
        t.next[i] = static_cast<uint16_t>(t.base[i] + (rng() % 2 ? m : -m));
      }
      ts.push_back(std::move(t));
    }
    for (uint64_t bucket : {uint64_t{300}, uint64_t{20000}, uint64_t{64} << 20}) {
      INFO("fraction " << fraction << ", bucket_bytes " << bucket);
      round_trip(ts, bucket);
    }
  }
}

TEST_CASE("at 1 % changed a change costs under 10.6 bits, 150x smaller than dense",
          "[delta_codec]") {
  std::vector<tensor_pair> ts{make_pair(3, 4u << 20, 0.01, 99)};
  const auto st = round_trip(ts);
  const double bits_per_change = 8.0 * static_cast<double>(st.encoded_bytes) /
                                 static_cast<double>(st.changed);
  INFO("bits per change " << bits_per_change << ", ratio "
                          << static_cast<double>(st.dense_bytes) / st.encoded_bytes);
  // Positions 8.08 bits (H(p)/p) + steps 1.2 bits + escapes; prefix codes cost ~10.3.
  CHECK(bits_per_change < 10.6);
  CHECK(static_cast<double>(st.dense_bytes) / static_cast<double>(st.encoded_bytes) > 150.0);
  CHECK(st.dense_segments == 0);
}

TEST_CASE("the hand-computed small case has the exact bytes of the format", "[delta_codec]") {
  const tensor_pair t = small_case();
  delta_stats st;
  const auto buckets = encode_delta(4, 5, sources_of({t}), {}, &st);
  REQUIRE(buckets.size() == 1);
  const auto& b = buckets[0];
  // Gaps 2, 2, 3 (mean 2 → k window 0..2; costs 10, 9, 9 → k = 1); +1 and −1 once each
  // (→ +1 first); the escape +3 has zigzag 6, x = 3, cheapest at Exp-Golomb order 2 (3 bits).
  // Stream: [0 1 0][0] [0 1 0][1 0] [0 1 1][1 1][1 1 1] = 17 bits, LSB first:
  //   byte 0 = bits 0..7  = 0,1,0,0,0,1,0,1 → 0xA2
  //   byte 1 = bits 8..15 = 0,0,1,1,1,1,1,1 → 0xFC
  //   byte 2 = bit 16     = 1               → 0x01
  std::vector<uint8_t> expected(56 + 40 + 3 + 8, 0);
  auto put = [&](size_t at, auto v) { std::memcpy(expected.data() + at, &v, sizeof v); };
  put(0, uint32_t{0x44535253});
  put(4, uint16_t{1});
  put(8, uint64_t{4});
  put(16, uint64_t{5});
  put(24, uint32_t{0});
  put(28, uint32_t{1});
  put(32, uint32_t{1});
  put(40, uint64_t{3});
  put(48, uint64_t{107});
  put(56, uint32_t{7});
  expected[60] = 0; // sparse
  expected[61] = 1; // rice_k
  expected[62] = 2; // escape_k
  expected[63] = 0; // +1 first
  put(64, uint64_t{0});
  put(72, uint64_t{10});
  put(80, uint64_t{3});
  put(88, uint64_t{3});
  expected[96] = 0xA2;
  expected[97] = 0xFC;
  expected[98] = 0x01;
  put(99, XXH3_64bits(expected.data(), 99));
  CHECK(b == expected);
  CHECK(st.encoded_bytes == 107);
  CHECK(st.changed == 3);
  CHECK(st.buckets == 1);
  CHECK(st.entries == 1);
  CHECK(st.dense_segments == 0);

  // The exported building blocks agree.
  const uint32_t pos[3] = {2, 5, 9};
  const uint16_t steps[3] = {1, 0xFFFF, 3};
  const auto p = choose_delta_params(pos, steps, 3);
  CHECK(p.rice_k == 1);
  CHECK(p.escape_k == 2);
  CHECK_FALSE(p.minus_first);
  CHECK(delta_sparse_bits(pos, steps, 3, p) == 17);
  CHECK(delta_gap_bits(3, 1) == 3);
  CHECK(delta_step_bits(1, p) == 1);
  CHECK(delta_step_bits(0xFFFF, p) == 2);
  CHECK(delta_step_bits(3, p) == 5);
  uint8_t out[3];
  write_delta_sparse_payload(pos, steps, 3, p, out);
  CHECK(out[0] == 0xA2);
  CHECK(out[1] == 0xFC);
  CHECK(out[2] == 0x01);

  const auto info = read_delta_bucket_info(b.data(), b.size());
  REQUIRE(std::holds_alternative<delta_bucket_info>(info));
  const auto& i = std::get<delta_bucket_info>(info);
  CHECK(i.base_version == 4);
  CHECK(i.version == 5);
  CHECK(i.index == 0);
  CHECK(i.count == 1);
  CHECK(i.changed == 3);
  round_trip({t});
}

TEST_CASE("the more frequent of -1 and +1 gets the 1-bit code", "[delta_codec]") {
  tensor_pair t = small_case();
  t.next[9] = 0x3F7F; // now −1 twice, +1 once
  const auto buckets = encode_delta(4, 5, sources_of({t}), {});
  REQUIRE(buckets.size() == 1);
  CHECK(buckets[0][63] == 1);
  round_trip({t});
}

TEST_CASE("a segment falls back to dense exactly when that is smaller", "[delta_codec]") {
  for (double fraction : {0.9, 1.0}) {
    const tensor_pair t = make_pair(2, 5000, fraction, 17, 1.0);
    delta_stats st;
    const auto buckets = encode_delta(4, 5, sources_of({t}), {}, &st);
    REQUIRE(buckets.size() == 1);
    const auto& b = buckets[0];
    CHECK(b[60] == static_cast<uint8_t>(delta_entry_kind::dense));
    CHECK(b.size() == 56 + 40 + 2 * 5000 + 8);
    CHECK(st.dense_segments == 1);
    CHECK(st.encoded_bytes == 56 + 40 + 2 * 5000 + 8);
    // The new bits, verbatim.
    CHECK(std::memcmp(b.data() + 96, t.next.data(), 2 * 5000) == 0);
    round_trip({t});
  }
  // Around the break-even point the choice follows the exact sizes.
  // (With random steps a change costs ~21 bits sparse, so dense wins above ~75 % changed;
  // with ±1 steps sparse wins even at 100 %.)
  bool saw_dense = false, saw_sparse = false;
  for (double fraction : {0.6, 0.7, 0.75, 0.8, 0.9}) {
    const tensor_pair t = make_pair(2, 20000, fraction, 23, 1.0);
    const auto buckets = encode_delta(4, 5, sources_of({t}), {});
    REQUIRE(buckets.size() == 1);
    std::vector<uint32_t> pos(t.base.size());
    pos.resize(find_changed(t.base.data(), t.next.data(), t.base.size(), pos.data()));
    std::vector<uint16_t> steps;
    for (auto p : pos)
      steps.push_back(delta_step(t.base[p], t.next[p]));
    const auto params = choose_delta_params(pos.data(), steps.data(), pos.size());
    const uint64_t sparse_bytes = (delta_sparse_bits(pos.data(), steps.data(), pos.size(), params) + 7) / 8;
    const bool dense = 2 * t.base.size() < sparse_bytes;
    INFO("fraction " << fraction << " sparse bytes " << sparse_bytes);
    CHECK(buckets[0][60] == (dense ? 1 : 0));
    (dense ? saw_dense : saw_sparse) = true;
    CHECK(buckets[0].size() == 56 + 40 + 8 + (dense ? 2 * t.base.size() : sparse_bytes));
    round_trip({t});
  }
  CHECK(saw_dense);
  CHECK(saw_sparse);
  // ±1 steps stay sparse even when everything changed.
  const tensor_pair all = make_pair(2, 5000, 1.0, 29, 0.0);
  const auto b = encode_delta(4, 5, sources_of({all}), {});
  CHECK(b[0][60] == static_cast<uint8_t>(delta_entry_kind::sparse));
  CHECK(b[0].size() < 5000 * 2 / 4);
  round_trip({all});
}

TEST_CASE("an entry cut at bucket boundaries is dense or sparse, whichever is smaller",
          "[delta_codec]") {
  // Buckets smaller than the segment's entry force the cutting path, which makes its own
  // dense-or-sparse choice for every piece. Per bucket: 56 header + 40 entry + 8 checksum.
  const uint64_t overhead = delta_header_bytes + delta_entry_bytes + delta_checksum_bytes;
  struct dense_case {
    uint64_t elements, bucket_bytes;
  };
  // Every element changed by a random step: a sparse change costs ~21 bits, so every piece
  // is dense and fills its bucket with (bucket_bytes - 104) / 2 elements. The second case
  // is the shipped bucket size (1 MiB) against one whole segment (2 MiB dense).
  for (const dense_case c : {dense_case{20000, 4096},
                             dense_case{delta_segment_elements, uint64_t{1} << 20}}) {
    INFO("elements " << c.elements << ", bucket_bytes " << c.bucket_bytes);
    const tensor_pair t = make_pair(6, c.elements, 1.0, 71, 1.0);
    delta_stats st;
    const auto buckets = encode_delta(4, 5, sources_of({t}), {c.bucket_bytes}, &st);
    const uint64_t per_bucket = (c.bucket_bytes - overhead) / 2;
    const uint64_t expected_buckets = (c.elements + per_bucket - 1) / per_bucket;
    REQUIRE(buckets.size() == expected_buckets);
    uint64_t next_offset = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const auto es = entries_of(buckets[i]);
      REQUIRE(es.size() == 1);
      INFO("bucket " << i);
      CHECK(es[0].kind == static_cast<uint8_t>(delta_entry_kind::dense));
      CHECK(es[0].offset == next_offset);
      CHECK(es[0].count == std::min(per_bucket, c.elements - next_offset));
      CHECK(es[0].payload_bytes == 2 * es[0].count);
      CHECK(es[0].changed == es[0].count);
      CHECK(std::memcmp(buckets[i].data() + overhead - delta_checksum_bytes,
                        t.next.data() + next_offset, 2 * es[0].count) == 0);
      next_offset += es[0].count;
    }
    CHECK(next_offset == c.elements);
    CHECK(st.dense_segments == expected_buckets);
    CHECK(st.encoded_bytes == 2 * c.elements + expected_buckets * overhead);
    round_trip({t}, c.bucket_bytes);
  }
  // Every element changed by +-1 ULP: sparse (~1.5 bits per element) beats dense in every
  // piece too.
  const tensor_pair ulp = make_pair(6, 20000, 1.0, 72, 0.0);
  delta_stats st;
  const auto buckets = encode_delta(4, 5, sources_of({ulp}), {1024}, &st);
  REQUIRE(buckets.size() > 2);
  for (const auto& b : buckets)
    for (const auto& e : entries_of(b)) {
      CHECK(e.kind == static_cast<uint8_t>(delta_entry_kind::sparse));
      CHECK(e.payload_bytes < e.count / 2);
    }
  CHECK(st.dense_segments == 0);
  round_trip({ulp}, 1024);
}

TEST_CASE("encoding is deterministic and independent of the source order", "[delta_codec]") {
  std::vector<tensor_pair> ts{make_pair(1, 70000, 0.01, 1), make_pair(9, 3000, 0.3, 2),
                              make_pair(4, 100000, 0.002, 3)};
  const auto a = encode_delta(4, 5, sources_of(ts), {4096});
  const auto b = encode_delta(4, 5, sources_of(ts), {4096});
  std::reverse(ts.begin(), ts.end());
  const auto c = encode_delta(4, 5, sources_of(ts), {4096});
  CHECK(a == b);
  CHECK(a == c);
}

TEST_CASE("encoding on several threads gives the single-threaded bytes and stats",
          "[delta_codec]") {
  for (double fraction : {0.0, 1e-4, 1e-2, 0.5, 1.0}) {
    // Multi-segment tensors (one ending in a short segment), an empty one, and many small
    // tensors: tiny ones, which encode_delta groups, and ones of 2^16 elements and more, which
    // it prepares one by one, so that the prepared ones wrap around its ring of 2 x threads.
    // (Cutting costs time per change: fewer segments at the high fractions.)
    const uint64_t big = (fraction >= 0.5 ? 1 : 2) * delta_segment_elements + 12345;
    std::vector<tensor_pair> ts{
      make_pair(3, big, fraction, 11), make_pair(0, 70000, fraction, 12),
      make_pair(7, 0, fraction, 13),
      make_pair(1, 300000, fraction, 14, 1.0)}; // random steps: dense entries
    for (uint32_t id = 10; id < 40; ++id)
      ts.push_back(make_pair(id, id % 2 ? 1 + id * 97 : (1 << 16) + id, fraction, id));
    std::vector<uint64_t> bucket_sizes{4096, uint64_t{1} << 20, 64ull << 20};
    if (fraction <= 1e-2) {
      bucket_sizes.push_back(delta_min_bucket_bytes);
      bucket_sizes.push_back(30000);
    }
    for (uint64_t bucket_bytes : bucket_sizes) {
      INFO("fraction " << fraction << ", bucket_bytes " << bucket_bytes);
      delta_options one{bucket_bytes};
      one.threads = 1;
      delta_stats st1;
      const auto b1 = encode_delta(4, 5, sources_of(ts), one, &st1);
      if (fraction >= 1e-2 && bucket_bytes == 4096)
        CHECK(st1.buckets > 3); // entries were cut at bucket boundaries
      for (uint32_t threads : {2u, 3u, 8u, 0u}) { // 0: hardware_concurrency
        INFO("threads " << threads);
        delta_options o{bucket_bytes};
        o.threads = threads;
        delta_stats st;
        const auto b = encode_delta(4, 5, sources_of(ts), o, &st);
        CHECK(b == b1);
        sorl::sync::test::check_same_stats(st, st1);
      }
    }
  }
}

TEST_CASE("the order-0 bound counts the positions and the steps of a delta", "[delta_codec]") {
  // By hand: which 2 of 4 elements changed is one of C(4, 2) = 6; two distinct steps can come
  // in 2 orders: log2 12. All steps alike add nothing; nothing changed needs no bits.
  CHECK(delta_bound_bits(4, 2, {1, 1}) == Approx(std::log2(12.0)).epsilon(1e-12));
  CHECK(delta_bound_bits(4, 2, {0, 2}) == Approx(std::log2(6.0)).epsilon(1e-12));
  CHECK(delta_bound_bits(4, 4, {4}) == Approx(0.0).margin(1e-9));
  CHECK(delta_bound_bits(4, 0, {}) == Approx(0.0).margin(1e-9));
  CHECK_THROWS_AS(delta_bound_bits(4, 2, {1}), std::invalid_argument);
  CHECK_THROWS_AS(delta_bound_bits(4, 5, {5}), std::invalid_argument);
  // Large N: N·H(p) + n·H(steps) to within O(log N) bits. 10^6 elements, 1 % changed, steps
  // +1 (3/4) and -1 (1/4): H(0.01) = 0.080793 bits per element, H(3/4) = 0.811278 per change.
  const double h = 1e6 * 0.0807931 + 1e4 * 0.8112781;
  CHECK(delta_bound_bits(1000000, 10000, {7500, 2500}) == Approx(h).epsilon(1e-3));

  // From encode_delta: 8 elements, elements 1, 3, 4 up one ULP and 6 down one (step 0xffff):
  // log2 C(8, 4) + log2(4! / (3! 1!)) = log2 70 + 2 bits, however the delta is cut and
  // whatever the thread count; 0 unless asked for.
  const std::vector<uint16_t> a(8, 0x3f80);
  std::vector<uint16_t> b = a;
  b[1] = b[3] = b[4] = 0x3f81;
  b[6] = 0x3f7f;
  for (uint32_t threads : {1u, 2u}) {
    delta_options o{delta_min_bucket_bytes};
    o.threads = threads;
    delta_stats st;
    encode_delta(0, 1, {{0, a.data(), b.data(), 3}, {1, a.data() + 3, b.data() + 3, 5}}, o, &st);
    CHECK(st.bound_bits == 0.0);
    o.measure_bound = true;
    encode_delta(0, 1, {{0, a.data(), b.data(), 3}, {1, a.data() + 3, b.data() + 3, 5}}, o, &st);
    CHECK(st.changed == 4);
    CHECK(st.bound_bits == Approx(std::log2(70.0) + 2.0).epsilon(1e-12));
  }
}

TEST_CASE("a change history counts the changed elements that changed in an earlier version",
          "[delta_codec]") {
  // Tensor 0 (1000 elements, over a segment boundary when segments are small) and tensor 5
  // (300). Version 1 moves every 10th element, version 2 every 15th: in tensor 0, 100 then 67
  // changes, of which the 34 multiples of 30 recur; in tensor 5, 30 then 20, 10 recurring.
  auto moved = [](const std::vector<uint16_t>& v, size_t every) {
    auto out = v;
    for (size_t j = 0; j < out.size(); j += every)
      out[j] = static_cast<uint16_t>(out[j] + 1);
    return out;
  };
  const std::vector<uint16_t> a0(1000, 0x3f80), b0(300, 0x4000);
  const auto a1 = moved(a0, 10), b1 = moved(b0, 10);
  const auto a2 = moved(a1, 15), b2 = moved(b1, 15);
  for (uint64_t bucket_bytes : {uint64_t{delta_min_bucket_bytes}, uint64_t{1} << 20}) {
    for (uint32_t threads : {1u, 2u}) {
      INFO("bucket_bytes " << bucket_bytes << ", threads " << threads);
      change_history h;
      delta_options o{bucket_bytes};
      o.threads = threads;
      o.history = &h;
      delta_stats st;
      encode_delta(0, 1, {{0, a0.data(), a1.data(), 1000}, {5, b0.data(), b1.data(), 300}}, o, &st);
      CHECK(st.changed == 130);
      CHECK(st.recurring == 0);
      CHECK(h.marked() == 130);
      encode_delta(1, 2, {{0, a1.data(), a2.data(), 1000}, {5, b1.data(), b2.data(), 300}}, o, &st);
      CHECK(st.changed == 87);
      CHECK(st.recurring == 44);
      CHECK(h.marked() == 130 + 87 - 44);
      // Without a history nothing is counted.
      delta_options plain{bucket_bytes};
      encode_delta(1, 2, {{0, a1.data(), a2.data(), 1000}, {5, b1.data(), b2.data(), 300}}, plain, &st);
      CHECK(st.recurring == 0);
    }
  }
  // record() on its own: positions are relative to the offset, and tensors are kept apart.
  change_history h;
  const uint32_t p1[] = {0, 3, 64, 65};
  CHECK(h.record(2, 100, p1, 4) == 0); // elements 100, 103, 164, 165 of tensor 2
  const uint32_t p2[] = {3, 4, 65};
  CHECK(h.record(2, 100, p2, 3) == 2); // 103 and 165 again, 104 new
  CHECK(h.record(1, 100, p2, 3) == 0); // another tensor
  CHECK(h.record(2, 0, p2, 0) == 0);
  CHECK(h.marked() == 4 + 1 + 3);
  h.clear();
  CHECK(h.marked() == 0);
  CHECK(h.record(2, 100, p2, 3) == 0);
}

TEST_CASE("buckets respect the byte bound and split tensors across buckets", "[delta_codec]") {
  std::vector<tensor_pair> ts{make_pair(0, 300000, 0.01, 5), make_pair(1, 5, 1.0, 6, 1.0),
                              make_pair(2, 200000, 0.9, 7, 1.0), make_pair(3, 0, 0.0, 8),
                              make_pair(5, 123457, 0.05, 9)};
  for (uint64_t bucket_bytes : {uint64_t{256}, uint64_t{4096}, uint64_t{100000}}) {
    delta_stats st;
    auto buckets = encode_delta(4, 5, sources_of(ts), {bucket_bytes}, &st);
    INFO("bucket_bytes " << bucket_bytes);
    CHECK(buckets.size() > 3);
    // Every bucket is self-describing; apply them in a shuffled order.
    std::mt19937 rng{3};
    std::vector<size_t> order(buckets.size());
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    worker_copy w(ts);
    for (size_t i : order) {
      const auto& b = buckets[i];
      REQUIRE(b.size() <= bucket_bytes);
      const auto info = read_delta_bucket_info(b.data(), b.size());
      REQUIRE(std::holds_alternative<delta_bucket_info>(info));
      CHECK(std::get<delta_bucket_info>(info).index == i);
      CHECK(std::get<delta_bucket_info>(info).count == buckets.size());
      const auto err = apply_delta_bucket(b.data(), b.size(), 4, 5, w.targets);
      INFO(err.value_or(""));
      REQUIRE_FALSE(err);
    }
    for (size_t i = 0; i < ts.size(); ++i)
      REQUIRE(w.bits[i] == ts[i].next);
    round_trip(ts, bucket_bytes);
  }
}

TEST_CASE("encode_delta rejects bad arguments", "[delta_codec]") {
  const tensor_pair t = small_case();
  CHECK_THROWS_AS(encode_delta(4, 5, sources_of({t, t}), {}), std::invalid_argument);
  CHECK_THROWS_AS(encode_delta(4, 5, sources_of({t}), {delta_min_bucket_bytes - 1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(encode_delta(4, 5, {{1, nullptr, nullptr, 3}}, {}), std::invalid_argument);
  CHECK_NOTHROW(encode_delta(4, 5, {{1, nullptr, nullptr, 0}}, {delta_min_bucket_bytes}));
}

TEST_CASE("every kind of corrupt bucket is rejected and leaves the target untouched",
          "[delta_codec]") {
  const std::vector<tensor_pair> ts{small_case()};
  const auto good = encode_delta(4, 5, sources_of(ts), {})[0];
  {
    worker_copy w(ts);
    REQUIRE_FALSE(check_delta_bucket(good.data(), good.size(), 4, 5, w.targets));
    REQUIRE(w.bits[0] == ts[0].base); // check never writes
  }
  SECTION("truncated") {
    for (size_t n : {size_t{0}, size_t{10}, size_t{63}, good.size() - 1}) {
      std::vector<uint8_t> b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
      require_rejected(b, ts, n < 64 ? "shorter" : "size field");
    }
    // Truncated with a consistent size field and checksum: the payload is short.
    std::vector<uint8_t> b(good.begin(), good.end() - 9);
    b.insert(b.end(), 8, 0);
    poke<uint64_t>(b, 48, b.size());
    reseal(b);
    require_rejected(b, ts, "payload");
  }
  SECTION("wrong checksum") {
    auto b = good;
    b[97] ^= 0x10;
    require_rejected(b, ts, "checksum");
    b = good;
    b.back() ^= 1;
    require_rejected(b, ts, "checksum");
  }
  SECTION("bad magic, format or reserved fields") {
    auto b = good;
    b[0] = 'X';
    require_rejected(b, ts, "magic");
    b = good;
    poke<uint16_t>(b, 4, 2);
    require_rejected(b, ts, "format");
    b = good;
    poke<uint32_t>(b, 36, 1);
    reseal(b);
    require_rejected(b, ts, "reserved");
  }
  SECTION("wrong version or base version") {
    require_rejected(good, ts, "versions", 3, 5);
    require_rejected(good, ts, "versions", 4, 6);
  }
  SECTION("unknown tensor id") {
    std::vector<tensor_pair> other = ts;
    other[0].id = 8;
    require_rejected(good, other, "unknown tensor");
    auto b = good;
    poke<uint32_t>(b, 56, 6);
    reseal(b);
    require_rejected(b, ts, "unknown tensor");
  }
  SECTION("range outside the tensor") {
    std::vector<tensor_pair> shorter = ts;
    shorter[0].base.resize(9);
    shorter[0].next.resize(9);
    require_rejected(good, shorter, "outside tensor");
    auto b = good;
    poke<uint64_t>(b, 64, 1); // offset 1: [1, 11) of 10
    reseal(b);
    require_rejected(b, ts, "outside tensor");
  }
  SECTION("out-of-range position") {
    auto b = good;
    poke<uint64_t>(b, 72, 9); // the range ends before the last change at 9
    reseal(b);
    require_rejected(b, ts, "outside [0, 9)");
  }
  SECTION("positions going backwards: an entry overlapping the previous one") {
    // Gaps are coded as p_j − p_{j−1} − 1 ≥ 0, so positions inside an entry cannot decrease;
    // across entries, a range that starts before the previous one ends is rejected.
    std::vector<tensor_pair> two{small_case(), small_case()};
    two[1].id = 8;
    auto b = encode_delta(4, 5, sources_of(two), {})[0];
    REQUIRE(b[32] == 2);
    poke<uint32_t>(b, 56 + 40, 7); // second entry names tensor 7 again, offset 0
    reseal(b);
    require_rejected(b, two, "overlaps");
    poke<uint32_t>(b, 56 + 40, 6); // tensor ids out of order
    two[1].id = 6;
    reseal(b);
    require_rejected(b, two, "out of order");
  }
  SECTION("trailing bytes") {
    auto b = good;
    b.insert(b.end() - 8, 1, 0);
    poke<uint64_t>(b, 48, b.size());
    reseal(b);
    require_rejected(b, ts, "trailing");
    // A payload longer than its codes.
    poke<uint64_t>(b, 88, 4);
    reseal(b);
    require_rejected(b, ts, "uses 17 bits of 4 payload bytes");
  }
  SECTION("nonzero padding bits") {
    auto b = good;
    b[98] |= 0x80;
    reseal(b);
    require_rejected(b, ts, "padding");
  }
  SECTION("wrong changed counts") {
    auto b = good;
    poke<uint64_t>(b, 80, 4); // entry claims 4 codes; the header still says 3
    reseal(b);
    require_rejected(b, ts, "entries sum");
    poke<uint64_t>(b, 40, 4);
    reseal(b);
    require_rejected(b, ts, "entry 0");
  }
  SECTION("invalid kind or parameters") {
    auto b = good;
    b[60] = 2;
    reseal(b);
    require_rejected(b, ts, "unknown kind");
    b = good;
    b[61] = 33;
    reseal(b);
    require_rejected(b, ts, "invalid parameters");
    b = good;
    b[60] = 1; // dense with 3 payload bytes for 10 elements
    b[61] = b[62] = 0;
    reseal(b);
    require_rejected(b, ts, "payload bytes");
  }
  SECTION("an undecodable step code") {
    // Element 2's escape: 1 1 then Exp-Golomb; make it 17 zero bits long (past order 2's limit).
    std::vector<uint8_t> b(good.begin(), good.end() - 8);
    const std::vector<uint8_t> payload = {0xA2, 0xFC & 0x3F, 0x00, 0x00, 0x00};
    b.resize(96);
    b.insert(b.end(), payload.begin(), payload.end());
    b.insert(b.end(), 8, 0);
    poke<uint64_t>(b, 88, payload.size());
    poke<uint64_t>(b, 48, b.size());
    reseal(b);
    require_rejected(b, ts, "step code");
  }
  SECTION("index not below count") {
    auto b = good;
    poke<uint32_t>(b, 24, 1);
    reseal(b);
    require_rejected(b, ts, "index");
  }
  SECTION("duplicate target ids") {
    std::vector<tensor_pair> dup{ts[0], ts[0]};
    require_rejected(good, dup, "twice");
  }
}

TEST_CASE("random bytes and random bit flips never crash and never half-apply",
          "[delta_codec]") {
  std::vector<tensor_pair> ts{make_pair(0, 3000, 0.02, 41), make_pair(1, 700, 0.9, 42, 1.0),
                              make_pair(2, 1, 1.0, 43)};
  const auto buckets = encode_delta(4, 5, sources_of(ts), {1024});
  REQUIRE(buckets.size() > 1);
  std::mt19937_64 rng{20240601};
  worker_copy w(ts);
  auto reset = [&] {
    for (size_t i = 0; i < ts.size(); ++i)
      w.bits[i] = ts[i].base;
  };
  size_t accepted = 0, unsealed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> b;
    const int mode = iter % 4;
    bool corrupt_unsealed = false; // changed bytes under the original checksum
    if (mode == 0) {
      // Random bytes behind a valid-looking header.
      b.resize(64 + rng() % 200);
      for (auto& x : b)
        x = static_cast<uint8_t>(rng());
      poke<uint32_t>(b, 0, delta_magic);
      poke<uint16_t>(b, 4, 1);
      poke<uint16_t>(b, 6, 0);
      poke<uint32_t>(b, 32, static_cast<uint32_t>(rng() % 4));
      poke<uint32_t>(b, 36, 0);
      poke<uint64_t>(b, 48, b.size());
    } else {
      // A real bucket with 1..4 flipped bits, resealed or not.
      const auto& original = buckets[rng() % buckets.size()];
      b = original;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f)
        b[rng() % (b.size() - 8)] ^= static_cast<uint8_t>(1u << (rng() % 8));
      // Flips that cancel out leave the original bucket, which is no corruption.
      corrupt_unsealed = mode == 3 && b != original;
    }
    if (mode != 3)
      reseal(b);
    reset();
    const auto err = apply_delta_bucket(b.data(), b.size(), 4, 5, w.targets);
    if (err) {
      for (size_t i = 0; i < ts.size(); ++i)
        REQUIRE(w.bits[i] == ts[i].base);
    } else {
      ++accepted; // a flip that made another valid bucket (e.g. a different step)
      unsealed += corrupt_unsealed;
    }
    // Unchecked bytes given to apply_checked_delta_bucket: the same verdict, and the same
    // result when valid (on bad bytes it may write part of the bucket, but only in range).
    const auto applied = w.bits;
    reset();
    const auto err_checked = apply_checked_delta_bucket(b.data(), b.size(), 4, 5, w.targets);
    REQUIRE(err_checked.has_value() == err.has_value());
    if (!err)
      REQUIRE(w.bits == applied);
    // Pure noise, any length.
    std::vector<uint8_t> noise(rng() % 300);
    for (auto& x : noise)
      x = static_cast<uint8_t>(rng());
    REQUIRE(apply_delta_bucket(noise.data(), noise.size(), 4, 5, w.targets));
    REQUIRE(std::holds_alternative<std::string>(read_delta_bucket_info(noise.data(), noise.size())));
  }
  // Without resealing the checksum catches every flip: no corrupt bucket whose checksum was
  // not recomputed is accepted. Resealed flips are sometimes valid buckets of other contents
  // (e.g. a flipped step bit); that they happen shows the resealed modes reach the decoder.
  CHECK(unsealed == 0);
  CHECK(accepted > 0);
}
