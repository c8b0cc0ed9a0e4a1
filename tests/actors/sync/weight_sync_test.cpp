#include <catch2/catch.hpp>

#include <random>

#include "actors/sync/weight_sync.hpp"

using namespace sorl::sync;

namespace {

struct fixture {
  std::vector<tensor_meta> metas;
  std::vector<std::vector<uint8_t>> data;

  fixture() {
    std::mt19937 rng{7};
    auto add = [&](std::string name, std::vector<int64_t> shape, weight_dtype dt) {
      tensor_meta m{std::move(name), std::move(shape), dt, 0};
      std::vector<uint8_t> bytes(m.bytes());
      for (auto& b : bytes)
        b = static_cast<uint8_t>(rng());
      m.hash = hash_bytes(bytes.data(), bytes.size());
      metas.push_back(m);
      data.push_back(std::move(bytes));
    };
    add("a", {3}, weight_dtype::bf16);
    add("b", {2, 2}, weight_dtype::fp32);
    add("empty", {0}, weight_dtype::bf16);
    add("c", {5}, weight_dtype::bf16);
  }

  uint64_t model() const {
    std::vector<uint64_t> h;
    for (auto& m : metas)
      h.push_back(m.hash);
    return model_hash(h);
  }

  std::vector<chunk_view> views(const std::vector<chunk_ref>& bucket) const {
    std::vector<chunk_view> out;
    for (auto& c : bucket) {
      auto esz = element_size(metas[c.tensor].dtype);
      out.push_back({c.tensor, c.offset, data[c.tensor].data() + c.offset * esz, c.count * esz});
    }
    return out;
  }

  static uint64_t checksum(const std::vector<chunk_view>& v) {
    std::vector<uint8_t> all;
    for (auto& c : v)
      all.insert(all.end(), c.data, c.data + c.bytes);
    return hash_bytes(all.data(), all.size());
  }
};

} // namespace

TEST_CASE("buckets respect the byte bound and split tensors at element boundaries") {
  fixture f;
  auto buckets = plan_buckets(f.metas, 8);
  // a: 6 bytes | b[0:2] 8 bytes | b[2:4] | c[0:4] | c[4:5]; the empty tensor has no chunk.
  REQUIRE(buckets.size() == 5);
  CHECK(buckets[0].size() == 1);
  CHECK((buckets[0][0].tensor == 0 && buckets[0][0].offset == 0 && buckets[0][0].count == 3));
  CHECK((buckets[1][0].tensor == 1 && buckets[1][0].offset == 0 && buckets[1][0].count == 2));
  CHECK((buckets[2][0].tensor == 1 && buckets[2][0].offset == 2 && buckets[2][0].count == 2));
  CHECK((buckets[3][0].tensor == 3 && buckets[3][0].offset == 0 && buckets[3][0].count == 4));
  CHECK((buckets[4][0].tensor == 3 && buckets[4][0].offset == 4 && buckets[4][0].count == 1));
  auto one = plan_buckets(f.metas, 1 << 20);
  REQUIRE(one.size() == 1);
  CHECK(one[0].size() == 3);
  CHECK_THROWS_AS(plan_buckets(f.metas, 3), std::invalid_argument);
}

TEST_CASE("a full version reassembles bit for bit with the publisher's hashes") {
  fixture f;
  for (uint64_t bucket_bytes : {4u, 8u, 10u, 64u}) {
    auto buckets = plan_buckets(f.metas, bucket_bytes);
    weight_assembler w;
    REQUIRE_FALSE(w.begin(3, f.metas, f.model(), static_cast<uint32_t>(buckets.size()), f.metas));
    // Any arrival order works.
    for (size_t k = buckets.size(); k-- > 0;) {
      auto v = f.views(buckets[k]);
      REQUIRE_FALSE(w.add_bucket(3, static_cast<uint32_t>(k), v, fixture::checksum(v)));
    }
    REQUIRE(w.complete());
    uint64_t mh = 0;
    REQUIRE_FALSE(w.verify(&mh));
    CHECK(mh == f.model());
    for (size_t i = 0; i < f.metas.size(); ++i)
      CHECK(w.staged(i) == f.data[i]);
  }
}

TEST_CASE("bad buckets are rejected and leave the staging untouched") {
  fixture f;
  auto buckets = plan_buckets(f.metas, 8);
  weight_assembler w;
  REQUIRE_FALSE(w.begin(3, f.metas, f.model(), static_cast<uint32_t>(buckets.size()), f.metas));
  auto v = f.views(buckets[1]);
  auto sum = fixture::checksum(v);

  CHECK(*w.add_bucket(4, 1, v, sum) == "bucket of version 4 while assembling version 3");
  CHECK(*w.add_bucket(3, 9, v, sum) == "bucket index 9 out of range [0, 5)");
  CHECK(*w.add_bucket(3, 1, v, sum ^ 1) == "bucket 1: checksum mismatch");
  auto bad_id = v;
  bad_id[0].tensor = 7;
  CHECK(*w.add_bucket(3, 1, bad_id, sum) == "bucket 1: tensor id 7 out of range [0, 4)");
  auto bad_offset = v;
  bad_offset[0].offset = 3;
  CHECK(*w.add_bucket(3, 1, bad_offset, sum)
        == "bucket 1: elements [3, 5) outside tensor \"b\" of 4 elements");
  auto ragged = v;
  ragged[0].bytes = 6;
  CHECK_THAT(*w.add_bucket(3, 1, ragged, fixture::checksum(ragged)),
             Catch::Contains("not whole elements"));
  // Nothing was copied by the rejected buckets.
  CHECK(w.staged(1) == std::vector<uint8_t>(16, 0));
  REQUIRE_FALSE(w.add_bucket(3, 1, v, sum));
  CHECK(*w.add_bucket(3, 1, v, sum) == "bucket 1 received twice");
  CHECK_FALSE(w.complete());
  CHECK_THAT(*w.verify(nullptr), Catch::Contains("4 buckets still missing"));
}

TEST_CASE("a header that does not match the model or its own hashes is refused") {
  fixture f;
  weight_assembler w;
  auto other = f.metas;
  other[1].shape = {4};
  CHECK_THAT(*w.begin(1, other, f.model(), 5, f.metas),
             Catch::Contains("tensor 1 is \"b\" 4, the model expects \"b\" 2x2"));
  auto fewer = f.metas;
  fewer.pop_back();
  CHECK(*w.begin(1, fewer, f.model(), 5, f.metas) == "version 1 has 3 tensors, the model has 4");

  // A header hash that disagrees with the bytes is caught by verify().
  auto lying = f.metas;
  lying[3].hash ^= 1;
  auto buckets = plan_buckets(f.metas, 1 << 20);
  REQUIRE_FALSE(w.begin(2, lying, f.model(), 1, f.metas));
  auto v = f.views(buckets[0]);
  REQUIRE_FALSE(w.add_bucket(2, 0, v, fixture::checksum(v)));
  CHECK_THAT(*w.verify(nullptr), Catch::StartsWith("tensor \"c\": hash"));
  // And a model hash that disagrees.
  REQUIRE_FALSE(w.begin(2, f.metas, f.model() ^ 1, 1, f.metas));
  REQUIRE_FALSE(w.add_bucket(2, 0, v, fixture::checksum(v)));
  CHECK_THAT(*w.verify(nullptr), Catch::StartsWith("model hash"));
}

TEST_CASE("a version announcing more buckets than it has elements is refused") {
  fixture f; // 3 + 4 + 0 + 5 = 12 elements
  weight_assembler w;
  CHECK(*w.begin(1, f.metas, f.model(), 13, f.metas)
        == "version 1 announces 13 buckets for 12 elements");
  CHECK(*w.begin(1, f.metas, f.model(), 0xFFFFFFFFu, f.metas)
        == "version 1 announces 4294967295 buckets for 12 elements");
  CHECK_FALSE(w.active());
  // The smallest buckets a publisher can plan (one fp32 element, or two bf16 ones, each) are
  // accepted, and so is one bucket per element.
  const auto smallest = plan_buckets(f.metas, 4);
  REQUIRE(smallest.size() == 9); // a: 2 + b: 4 + c: 3
  CHECK_FALSE(w.begin(1, f.metas, f.model(), static_cast<uint32_t>(smallest.size()), f.metas));
  CHECK_FALSE(w.begin(1, f.metas, f.model(), 12, f.metas));
}
