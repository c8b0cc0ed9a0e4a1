// The rollout worker's side of weight synchronisation as events in, acknowledgements out:
// full versions and sparse deltas, deferred applies, and every refusal with its exact text.

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "actors/sync/weight_receiver.hpp"
#include "tests/actors/sync/toy_model.hpp"

using namespace sorl::sync;
using namespace sorl::sync::test;

namespace {

/// One version as the publisher sends it; buckets borrow `source` (full) or own their bytes.
struct sent_version {
  version_header header;
  std::vector<std::vector<chunk_view>> chunks;
  std::vector<uint64_t> checksums;
  std::vector<std::vector<uint8_t>> deltas;

  size_t buckets() const {
    return header.full ? chunks.size() : deltas.size();
  }
  bucket_view bucket(size_t k) const {
    bucket_view b;
    b.version = header.version;
    b.index = static_cast<uint32_t>(k);
    if (header.full) {
      b.chunks = chunks[k];
      b.checksum = checksums[k];
    } else {
      b.delta = deltas[k].data();
      b.delta_size = deltas[k].size();
    }
    return b;
  }
};

sent_version full_version(const toy_model& source, uint64_t version, uint64_t bucket_bytes) {
  sent_version v;
  v.header.version = version;
  v.header.tensors = source.metas();
  v.header.model_hash = source.hash();
  v.header.full = true;
  for (const auto& bucket : plan_buckets(v.header.tensors, bucket_bytes)) {
    std::vector<chunk_view> chunks;
    std::vector<uint8_t> all;
    for (const auto& ref : bucket) {
      auto* p = reinterpret_cast<const uint8_t*>(source.tensors[ref.tensor].data() + ref.offset);
      chunks.push_back({ref.tensor, ref.offset, p, ref.count * 2});
      all.insert(all.end(), p, p + ref.count * 2);
    }
    v.chunks.push_back(chunks);
    v.checksums.push_back(hash_bytes(all.data(), all.size()));
  }
  v.header.bucket_count = static_cast<uint32_t>(v.chunks.size());
  return v;
}

sent_version delta_version(const toy_model& base, const toy_model& next, uint64_t from,
                           uint64_t to) {
  std::vector<delta_source> sources;
  for (size_t i = 0; i < base.tensors.size(); ++i)
    sources.push_back({static_cast<uint32_t>(i), base.tensors[i].data(), next.tensors[i].data(),
                       base.tensors[i].size()});
  delta_options o;
  o.bucket_bytes = delta_min_bucket_bytes;
  sent_version v;
  v.deltas = encode_delta(from, to, sources, o);
  v.header.version = to;
  v.header.tensors = next.metas();
  v.header.model_hash = next.hash();
  v.header.full = false;
  v.header.base_version = from;
  v.header.bucket_count = static_cast<uint32_t>(v.deltas.size());
  return v;
}

/// Feeds every bucket of `v` idle; returns the result of the last one.
weight_receiver::result feed(worker& w, const sent_version& v) {
  weight_receiver::result last;
  for (size_t k = 0; k < v.buckets(); ++k)
    last = w.receiver.on_bucket(v.bucket(k), true);
  return last;
}

void check_failed(const weight_receiver::result& r, uint64_t version, const std::string& reason,
                  bool full) {
  REQUIRE(r.ack);
  CHECK(r.ack->version == version);
  CHECK_FALSE(r.ack->ok);
  CHECK(r.ack->reason == reason);
  CHECK(r.ack->full == full);
  REQUIRE(r.logs.size() == 1);
  CHECK(r.logs[0].lvl == log_line::level::error);
  CHECK(r.logs[0].text == "w: version " + std::to_string(version) + " not applied: " + reason);
}

} // namespace

TEST_CASE("a full version then a delta are applied bit for bit and acknowledged with their "
          "hashes") {
  auto v1 = make_model({5, 3, 8}, 100);
  auto v2 = nudged(v1, 4);
  worker w{make_model({5, 3, 8}, 7)};
  REQUIRE(w.receiver.version() == weight_receiver::no_version);

  auto full = full_version(v1, 1, 6); // 3 elements a bucket: 2 + 1 + 3 buckets
  REQUIRE(full.buckets() == 6);
  w.now = 1000;
  auto r = w.receiver.on_header(full.header);
  CHECK_FALSE(r.ack);
  for (size_t k = 0; k + 1 < full.buckets(); ++k) {
    w.now += 10;
    r = w.receiver.on_bucket(full.bucket(k), true);
    CHECK_FALSE(r.ack);
    CHECK_FALSE(r.weights_changed);
  }
  CHECK(w.model.tensors != v1.tensors); // nothing written before the last bucket
  w.now = 1234;
  r = w.receiver.on_bucket(full.bucket(full.buckets() - 1), true);
  REQUIRE(r.ack);
  CHECK(r.weights_changed);
  CHECK(r.logs.empty());
  CHECK(r.ack->version == 1);
  CHECK(r.ack->ok);
  CHECK(r.ack->model_hash == v1.hash());
  CHECK(r.ack->reason.empty());
  CHECK(r.ack->apply_ns == 234);
  CHECK(r.ack->full);
  CHECK(w.model.tensors == v1.tensors);
  CHECK(w.receiver.version() == 1);

  auto delta = delta_version(v1, v2, 1, 2);
  REQUIRE(delta.buckets() == 1);
  w.now = 5000;
  CHECK_FALSE(w.receiver.on_header(delta.header).ack);
  w.now = 5007;
  r = feed(w, delta);
  REQUIRE(r.ack);
  CHECK(r.weights_changed);
  CHECK(r.ack->version == 2);
  CHECK(r.ack->ok);
  CHECK(r.ack->model_hash == v2.hash());
  CHECK(r.ack->apply_ns == 7);
  CHECK_FALSE(r.ack->full);
  CHECK(w.model.tensors == v2.tensors);
  CHECK(w.receiver.version() == 2);
}

TEST_CASE("a delta that misses the published hash leaves no known version until a full "
          "sync") {
  auto v1 = make_model({5, 3, 8}, 100);
  auto v2 = v1; // only tensor 0 changes, so no delta entry touches tensor 2
  v2.tensors[0][1] += 1;
  v2.tensors[0][4] -= 1;
  worker w{make_model({5, 3, 8}, 7)};
  auto full1 = full_version(v1, 1, 1 << 10);
  w.receiver.on_header(full1.header);
  REQUIRE(feed(w, full1).ack->ok);
  w.model.tensors[2][5] ^= 1; // one bit off the base: what a missed or doubled version leaves

  auto delta = delta_version(v1, v2, 1, 2);
  w.receiver.on_header(delta.header);
  auto r = feed(w, delta);
  auto after = v2;
  after.tensors[2][5] ^= 1;
  REQUIRE(r.ack);
  CHECK(r.weights_changed);
  CHECK(r.ack->model_hash == after.hash());
  check_failed(r, 2,
               fmt::format("tensor \"t2\": hash {:016x} after the delta, published {:016x}",
                           after.metas()[2].hash, v2.metas()[2].hash),
               false);
  CHECK(w.receiver.version() == weight_receiver::no_version);

  // The next delta is refused at its header; the same version in full repairs the worker.
  auto v3 = nudged(v2, 5);
  r = w.receiver.on_header(delta_version(v2, v3, 2, 3).header);
  check_failed(r, 3, "delta 2 → 3 arrived, but this worker holds no known version", false);
  CHECK(r.ack->model_hash == 0);
  auto full2 = full_version(v2, 2, 8);
  CHECK_FALSE(w.receiver.on_header(full2.header).ack);
  r = feed(w, full2);
  REQUIRE(r.ack);
  CHECK(r.ack->ok);
  CHECK(r.ack->full);
  CHECK(w.model.tensors == v2.tensors);
  CHECK(w.receiver.version() == 2);
}

TEST_CASE("a version completed while rollouts are in flight is applied when the worker is "
          "idle") {
  auto v1 = make_model({5, 3, 8}, 100);
  auto v2 = nudged(v1, 2);
  auto before = make_model({5, 3, 8}, 9);
  worker w{before};
  auto full = full_version(v1, 1, 1 << 10);
  w.now = 10;
  w.receiver.on_header(full.header);
  auto r = w.receiver.on_bucket(full.bucket(0), false);
  CHECK_FALSE(r.ack);
  CHECK_FALSE(r.weights_changed);
  CHECK(w.receiver.pending());
  CHECK(w.model.tensors == before.tensors);
  CHECK(w.receiver.version() == weight_receiver::no_version);
  w.now = 95;
  r = w.receiver.on_idle();
  REQUIRE(r.ack);
  CHECK(r.ack->ok);
  CHECK(r.ack->apply_ns == 85); // counted up to the apply, waiting included
  CHECK(w.model.tensors == v1.tensors);
  CHECK_FALSE(w.receiver.pending());
  r = w.receiver.on_idle();
  CHECK_FALSE(r.ack);
  CHECK_FALSE(r.weights_changed);

  // The same for a delta.
  auto delta = delta_version(v1, v2, 1, 2);
  w.receiver.on_header(delta.header);
  for (size_t k = 0; k < delta.buckets(); ++k)
    CHECK_FALSE(w.receiver.on_bucket(delta.bucket(k), false).ack);
  CHECK(w.receiver.pending());
  CHECK(w.model.tensors == v1.tensors);
  r = w.receiver.on_idle();
  REQUIRE(r.ack);
  CHECK(r.ack->ok);
  CHECK_FALSE(r.ack->full);
  CHECK(w.model.tensors == v2.tensors);
  CHECK(w.receiver.version() == 2);
}

TEST_CASE("a new header drops the version waiting for idle without acknowledging it") {
  auto v1 = make_model({5, 3, 8}, 100);
  auto v2 = make_model({5, 3, 8}, 200);
  auto before = make_model({5, 3, 8}, 9);
  worker w{before};
  auto full1 = full_version(v1, 1, 1 << 10);
  w.receiver.on_header(full1.header);
  CHECK_FALSE(w.receiver.on_bucket(full1.bucket(0), false).ack);
  REQUIRE(w.receiver.pending());
  auto full2 = full_version(v2, 2, 1 << 10);
  CHECK_FALSE(w.receiver.on_header(full2.header).ack);
  CHECK_FALSE(w.receiver.pending());
  auto r = w.receiver.on_idle();
  CHECK_FALSE(r.ack); // version 1 is never acknowledged
  CHECK(w.model.tensors == before.tensors);
  r = feed(w, full2);
  REQUIRE(r.ack);
  CHECK(r.ack->version == 2);
  CHECK(w.model.tensors == v2.tensors);
}

TEST_CASE("full buckets may come in any order, a duplicate or stale one fails the version") {
  auto v1 = make_model({5, 3, 8}, 100);
  auto v2 = make_model({5, 3, 8}, 300);
  auto before = make_model({5, 3, 8}, 9);
  worker w{before};
  auto full1 = full_version(v1, 1, 6);
  w.receiver.on_header(full1.header);
  for (size_t k : {5, 2, 0, 4, 1})
    CHECK_FALSE(w.receiver.on_bucket(full1.bucket(k), true).ack);
  auto r = w.receiver.on_bucket(full1.bucket(3), true);
  REQUIRE(r.ack);
  CHECK(r.ack->ok);
  CHECK(w.model.tensors == v1.tensors);

  auto full2 = full_version(v2, 2, 6);
  w.receiver.on_header(full2.header);
  CHECK_FALSE(w.receiver.on_bucket(full2.bucket(0), true).ack);
  r = w.receiver.on_bucket(full2.bucket(0), true);
  check_failed(r, 2, "bucket 0 received twice", true);
  CHECK(r.ack->model_hash == 0);
  // The assembly is dropped: the rest of the version is refused bucket by bucket.
  r = w.receiver.on_bucket(full2.bucket(1), true);
  check_failed(r, 2, "bucket 1 of version 2 without a version header", true);

  // A bucket of an older version drops the version being assembled, and the failure is
  // acknowledged under the older version's number.
  w.receiver.on_header(full2.header);
  r = w.receiver.on_bucket(full1.bucket(0), true);
  check_failed(r, 1, "bucket of version 1 while assembling version 2", true);
  r = w.receiver.on_bucket(full2.bucket(0), true);
  check_failed(r, 2, "bucket 0 of version 2 without a version header", true);
  CHECK(w.model.tensors == v1.tensors);
  CHECK(w.receiver.version() == 1);
}

TEST_CASE("a full version that misses the header's hashes is refused and nothing is "
          "written") {
  auto v1 = make_model({5, 3, 8}, 100);
  auto other = v1;
  other.tensors[0][0] ^= 0x40;
  auto before = make_model({5, 3, 8}, 9);
  worker w{before};
  auto sent = full_version(other, 1, 1 << 10); // the bytes of `other`
  sent.header.tensors = v1.metas();            // the hashes of v1
  sent.header.model_hash = v1.hash();
  w.receiver.on_header(sent.header);
  auto r = feed(w, sent);
  // A tensor mismatch stops verify() before the model hash: the ack carries 0.
  check_failed(r, 1,
               fmt::format("tensor \"t0\": hash {:016x}, header says {:016x}",
                           other.metas()[0].hash, v1.metas()[0].hash),
               true);
  CHECK(r.ack->model_hash == 0);
  CHECK_FALSE(r.weights_changed);
  CHECK(w.model.tensors == before.tensors);

  // Every tensor right but the model hash wrong: the ack carries the computed hash.
  auto good = full_version(v1, 2, 1 << 10);
  good.header.model_hash = 42;
  w.receiver.on_header(good.header);
  r = feed(w, good);
  check_failed(r, 2, fmt::format("model hash {:016x}, header says {:016x}", v1.hash(), 42), true);
  CHECK(r.ack->model_hash == v1.hash());
  CHECK(w.model.tensors == before.tensors);
  CHECK(w.receiver.version() == weight_receiver::no_version);
}

TEST_CASE("delta buckets: a duplicate fails the version, a stale or late one is only logged") {
  auto v1 = make_model({300, 3, 200}, 100);
  auto v2 = make_model({300, 3, 200}, 7000); // every element far off: dense, several buckets
  auto v3 = nudged(v2, 1);
  worker w{v1};
  auto full1 = full_version(v1, 1, 1 << 12);
  w.receiver.on_header(full1.header);
  REQUIRE(feed(w, full1).ack->ok);

  auto d2 = delta_version(v1, v2, 1, 2);
  REQUIRE(d2.buckets() >= 3);
  w.receiver.on_header(d2.header);
  CHECK_FALSE(w.receiver.on_bucket(d2.bucket(1), true).ack);
  auto r = w.receiver.on_bucket(d2.bucket(1), true);
  check_failed(r, 2, "delta bucket 1 received twice", false);
  CHECK_FALSE(r.weights_changed);
  // Refused already: the rest is logged, not acknowledged again.
  r = w.receiver.on_bucket(d2.bucket(0), true);
  CHECK_FALSE(r.ack);
  REQUIRE(r.logs.size() == 1);
  CHECK(r.logs[0].lvl == log_line::level::warn);
  CHECK(r.logs[0].text == "w: delta bucket 0 of version 2 without a version header");
  CHECK(w.model.tensors == v1.tensors);
  CHECK(w.receiver.version() == 1);

  // Out of order, with a bucket of an older delta in between.
  w.receiver.on_header(d2.header);
  std::vector<size_t> order;
  for (size_t k = d2.buckets(); k-- > 0;)
    order.push_back(k);
  for (size_t i = 0; i + 1 < order.size(); ++i)
    CHECK_FALSE(w.receiver.on_bucket(d2.bucket(order[i]), true).ack);
  auto d_old = delta_version(v1, v2, 0, 1);
  r = w.receiver.on_bucket(d_old.bucket(0), true);
  CHECK_FALSE(r.ack);
  REQUIRE(r.logs.size() == 1);
  CHECK(r.logs[0].text == "w: delta bucket of version 1 while receiving version 2");
  r = w.receiver.on_bucket(d2.bucket(order.back()), true);
  REQUIRE(r.ack);
  CHECK(r.ack->ok);
  CHECK(w.model.tensors == v2.tensors);

  // A corrupt bucket of the version being received fails it with the codec's reason.
  auto d3 = delta_version(v2, v3, 2, 3);
  w.receiver.on_header(d3.header);
  auto bad = d3.deltas[0];
  bad[bad.size() / 2] ^= 0x10;
  bucket_view b = d3.bucket(0);
  b.delta = bad.data();
  r = w.receiver.on_bucket(b, true);
  REQUIRE(r.ack);
  CHECK_FALSE(r.ack->ok);
  CHECK(r.ack->reason.rfind("delta bucket 0: ", 0) == 0);
  CHECK(w.model.tensors == v2.tensors);
}

TEST_CASE("a header that does not fit the model is refused at once") {
  auto v1 = make_model({5, 3, 8}, 100);
  worker w{v1};
  auto sent = full_version(v1, 1, 1 << 10);
  sent.header.tensors[1].shape = {4};
  auto r = w.receiver.on_header(sent.header);
  check_failed(r, 1, "version 1 tensor 1 is \"t1\" 4, the model expects \"t1\" 3", true);
  CHECK(r.ack->model_hash == 0);
  // A delta header before any version.
  auto d = delta_version(v1, nudged(v1, 2), 0, 1);
  r = w.receiver.on_header(d.header);
  check_failed(r, 1, "delta 0 → 1 arrived, but this worker holds no known version", false);
}

TEST_CASE("targets that do not cover the model's tensors are refused") {
  auto m = make_model({5, 3}, 1);
  auto targets = m.targets();
  auto clock = [] { return int64_t{0}; };
  CHECK_THROWS_AS(weight_receiver("w", m.metas(), {targets[0]}, clock), std::invalid_argument);
  targets[1].elements = 2;
  CHECK_THROWS_AS(weight_receiver("w", m.metas(), targets, clock), std::invalid_argument);
}
