// The rollout worker's side of a sparse version: every bucket checked on arrival, applied only
// when all are in, and the result proven against the published hashes.

#include <catch2/catch.hpp>

#include <random>

#include "actors/sync/delta_receiver.hpp"
#include "tests/actors/sync/toy_model.hpp"

using namespace sorl::sync;

namespace {

using model_bits = sorl::sync::test::toy_model;

model_bits random_model(uint64_t seed) {
  std::mt19937_64 rng{seed};
  model_bits m;
  for (size_t n : {1000u, 37u, 5000u}) {
    std::vector<uint16_t> t(n);
    for (auto& x : t)
      x = static_cast<uint16_t>(rng());
    m.tensors.push_back(std::move(t));
  }
  return m;
}

/// `base` with ~10 % of elements moved by ±1 ULP.
model_bits step(const model_bits& base, uint64_t seed) {
  std::mt19937_64 rng{seed};
  model_bits next = base;
  for (auto& t : next.tensors)
    for (auto& x : t)
      if (rng() % 10 == 0)
        x = static_cast<uint16_t>(x + (rng() % 2 ? 1 : -1));
  return next;
}

std::vector<std::vector<uint8_t>> encode(const model_bits& base, const model_bits& next,
                                         uint64_t from, uint64_t to, uint64_t bucket_bytes) {
  std::vector<delta_source> sources;
  for (size_t i = 0; i < base.tensors.size(); ++i)
    sources.push_back({static_cast<uint32_t>(i), base.tensors[i].data(), next.tensors[i].data(),
                       base.tensors[i].size()});
  delta_options o;
  o.bucket_bytes = bucket_bytes;
  return encode_delta(from, to, sources, o);
}

} // namespace

TEST_CASE("a sparse version applies bit for bit once every bucket is in") {
  auto publisher = random_model(1);
  auto worker = publisher; // holds version 4
  auto next = step(publisher, 2);
  auto buckets = encode(publisher, next, 4, 5, 256);
  REQUIRE(buckets.size() > 1);
  delta_receiver r;
  auto targets = worker.targets();
  REQUIRE_FALSE(r.begin(5, 4, 4, next.metas(), next.hash(),
                        static_cast<uint32_t>(buckets.size()), worker.metas()));
  // Out of order on purpose; nothing touches the weights before the last bucket.
  for (size_t k = buckets.size(); k-- > 0;) {
    CHECK_FALSE(r.complete());
    REQUIRE_FALSE(r.add_bucket(5, static_cast<uint32_t>(k), buckets[k].data(),
                               buckets[k].size(), targets));
    CHECK(worker.tensors == publisher.tensors);
  }
  REQUIRE(r.complete());
  uint64_t hash = 0;
  CHECK_FALSE(r.apply(targets, &hash));
  CHECK(hash == next.hash());
  CHECK(worker.tensors == next.tensors);
}

TEST_CASE("a delta is refused unless the worker holds its base") {
  auto m = random_model(3);
  delta_receiver r;
  auto e = r.begin(5, 4, std::nullopt, m.metas(), m.hash(), 1, m.metas());
  REQUIRE(e);
  CHECK(*e == "delta 4 → 5 arrived, but this worker holds no known version");
  e = r.begin(5, 4, 3, m.metas(), m.hash(), 1, m.metas());
  REQUIRE(e);
  CHECK(*e == "delta 4 → 5 arrived, but this worker holds version 3");
  auto other = m.metas();
  other[1].shape = {38};
  CHECK(r.begin(5, 4, 4, other, m.hash(), 1, m.metas()));
  CHECK(r.begin(5, 4, 4, m.metas(), m.hash(), 0, m.metas()));
  CHECK_FALSE(r.active());
}

TEST_CASE("bad buckets are refused on arrival and leave the receiver as it was") {
  auto base = random_model(4);
  auto worker = base;
  auto next = step(base, 5);
  auto buckets = encode(base, next, 1, 2, 1 << 20);
  REQUIRE(buckets.size() == 1);
  auto targets = worker.targets();
  delta_receiver r;
  REQUIRE_FALSE(r.begin(2, 1, 1, next.metas(), next.hash(), 1, worker.metas()));
  auto corrupt = buckets[0];
  corrupt[corrupt.size() / 2] ^= 0x10;
  CHECK(r.add_bucket(2, 0, corrupt.data(), corrupt.size(), targets));
  CHECK(r.add_bucket(3, 0, buckets[0].data(), buckets[0].size(), targets)); // wrong version
  CHECK(r.add_bucket(2, 1, buckets[0].data(), buckets[0].size(), targets)); // index ≥ count
  auto wrong_base = encode(base, next, 0, 2, 1 << 20);
  CHECK(r.add_bucket(2, 0, wrong_base[0].data(), wrong_base[0].size(), targets));
  CHECK_FALSE(r.complete());
  CHECK(worker.tensors == base.tensors);
  REQUIRE_FALSE(r.add_bucket(2, 0, buckets[0].data(), buckets[0].size(), targets));
  auto e = r.add_bucket(2, 0, buckets[0].data(), buckets[0].size(), targets);
  REQUIRE(e);
  CHECK(*e == "delta bucket 0 received twice");
  uint64_t hash = 0;
  CHECK_FALSE(r.apply(targets, &hash));
  CHECK(worker.tensors == next.tensors);
}

TEST_CASE("a worker whose weights drifted from the base is caught by the hash") {
  auto base = random_model(6);
  auto worker = base;
  worker.tensors[2][17] ^= 1; // one bit off: what a missed or doubled version leaves behind
  auto next = step(base, 7);
  auto buckets = encode(base, next, 1, 2, 1 << 20);
  auto targets = worker.targets();
  delta_receiver r;
  REQUIRE_FALSE(r.begin(2, 1, 1, next.metas(), next.hash(), 1, worker.metas()));
  REQUIRE_FALSE(r.add_bucket(2, 0, buckets[0].data(), buckets[0].size(), targets));
  uint64_t hash = 0;
  auto e = r.apply(targets, &hash);
  REQUIRE(e);
  CHECK(e->rfind("tensor \"t2\": hash ", 0) == 0);
  CHECK(hash != next.hash());
  delta_receiver idle;
  CHECK_THROWS_AS(idle.apply(targets, &hash), std::logic_error);
}

TEST_CASE("a sparse version announcing more buckets than elements is refused before any "
          "allocation") {
  auto m = random_model(5); // 1000 + 37 + 5000 = 6037 elements
  delta_receiver r;
  auto e = r.begin(5, 4, 4, m.metas(), m.hash(), 6038, m.metas());
  REQUIRE(e);
  CHECK(*e == "sparse version 5 announces 6038 buckets for 6037 elements");
  e = r.begin(5, 4, 4, m.metas(), m.hash(), 0xFFFFFFFFu, m.metas());
  REQUIRE(e);
  CHECK(*e == "sparse version 5 announces 4294967295 buckets for 6037 elements");
  CHECK_FALSE(r.active());
  CHECK_FALSE(r.begin(5, 4, 4, m.metas(), m.hash(), 6037, m.metas()));
  CHECK(r.active());
  // A bucket index beyond the announced count is refused too.
  std::vector<uint8_t> junk(64, 0);
  auto targets = m.targets();
  e = r.add_bucket(5, 6037, junk.data(), junk.size(), targets);
  REQUIRE(e);
  CHECK(*e == "delta bucket index 6037 out of range [0, 6037)");
}
