// The sync publisher as events in, payloads and VersionReady out: payloads checked byte for
// byte against the bucket plan and the delta codec, every VersionReady field hand-counted,
// and the versions carried end to end into weight receivers.

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <tuple>
#include <memory>

#include <fmt/format.h>

#include "actors/sync/publisher_core.hpp"
#include "runtime/config.hpp"
#include "tests/actors/sync/toy_model.hpp"

using namespace sorl::sync;
using namespace sorl::sync::test;
using names = std::vector<std::string>;

namespace {

/// 100 + 30 + 80 bf16 elements = 420 bytes.
toy_model model_v0() {
  return make_model({100, 30, 80}, 500);
}

/// A snapshot owning a copy of `m`'s bits (as the shell's envelope would).
snapshot_view snapshot(const toy_model& m, uint64_t version) {
  auto owned = std::make_shared<toy_model>(m);
  snapshot_view s;
  s.version = version;
  s.dtype = weight_dtype::bf16;
  for (size_t i = 0; i < owned->tensors.size(); ++i) {
    s.names.push_back("t" + std::to_string(i));
    s.shapes.push_back({static_cast<int64_t>(owned->tensors[i].size())});
    s.data.push_back({reinterpret_cast<const uint8_t*>(owned->tensors[i].data()),
                      owned->tensors[i].size() * 2});
  }
  s.keep_alive = owned;
  return s;
}

/// A publisher whose clock advances 10 ns at every reading.
struct publisher {
  int64_t t = 0;
  publisher_core core;

  explicit publisher(names workers, sync_protocol_options o = {})
      : core("p", publisher_options{o, 256}, [this] { return t += 10; }) {
    for (const auto& w : workers)
      core.add_worker(w);
  }
};

std::vector<std::pair<std::string, payload_kind>> sends(const publisher_core::result& r) {
  std::vector<std::pair<std::string, payload_kind>> out;
  for (const auto& s : r.sends)
    out.emplace_back(s.worker, s.kind);
  return out;
}

bucket_view view(const weight_bucket& b) {
  bucket_view v;
  v.version = b.version;
  v.index = b.index;
  v.chunks = b.chunks;
  v.checksum = b.checksum;
  v.delta = b.delta.data();
  v.delta_size = b.delta.size();
  return v;
}

/// Delivers every send of `r` to its worker; returns each worker's acknowledgement.
std::map<std::string, weight_ack> deliver(const publisher& p, const publisher_core::result& r,
                                          std::map<std::string, worker*> workers) {
  std::map<std::string, weight_ack> acks;
  for (const auto& s : r.sends) {
    const auto& pl = p.core.payload_of(s.kind);
    auto& w = *workers.at(s.worker);
    auto got = w.receiver.on_header(pl.header);
    for (const auto& b : pl.buckets)
      if (!got.ack)
        got = w.receiver.on_bucket(view(b), true);
    REQUIRE(got.ack);
    acks[s.worker] = *got.ack;
  }
  return acks;
}

const std::vector<std::pair<std::string, payload_kind>> both_full = {
  {"a", payload_kind::full}, {"b", payload_kind::full}};
const std::vector<std::pair<std::string, payload_kind>> both_sparse = {
  {"a", payload_kind::sparse}, {"b", payload_kind::sparse}};

/// A worker's acknowledgement that it applied `version` with the published hash.
weight_ack applied(const publisher& p, uint64_t version) {
  weight_ack a;
  a.version = version;
  a.ok = true;
  a.model_hash = p.core.model_hash();
  return a;
}

/// Version 0 published to a and b, delivered and acknowledged.
void publish_v0(publisher& p, worker& a, worker& b) {
  auto r = p.core.on_snapshot(snapshot(model_v0(), 0));
  REQUIRE(sends(r) == both_full);
  auto acks = deliver(p, r, {{"a", &a}, {"b", &b}});
  REQUIRE(p.core.on_ack("a", acks["a"]).sends.empty());
  REQUIRE(p.core.on_ack("b", acks["b"]).ready);
}

} // namespace

TEST_CASE("the first version goes out in full and the next as a delta against it, with "
          "hand-checked payloads and statistics") {
  publisher p{{"a", "b"}};
  worker a{make_model({100, 30, 80}, 1), "a"}, b{make_model({100, 30, 80}, 2), "b"};
  auto v0 = model_v0();
  auto r = p.core.on_snapshot(snapshot(v0, 0));
  CHECK(sends(r) == both_full);
  CHECK_FALSE(r.fail);
  CHECK_FALSE(r.ready);
  REQUIRE(r.logs.size() == 1);
  CHECK(r.logs[0].lvl == log_line::level::debug);
  CHECK(r.logs[0].text == "p: version 0: full sync to 2 worker(s): first version");

  // 256-byte buckets hold 128 elements: t0 and 28 elements of t1, then the rest.
  const auto& full = p.core.payload_of(payload_kind::full);
  CHECK(full.header.version == 0);
  CHECK(full.header.full);
  CHECK(full.header.base_version == 0);
  CHECK(full.header.changed_elements == 0);
  CHECK(full.header.model_hash == v0.hash());
  CHECK(full.header.bucket_count == 2);
  CHECK(full.header.total_bytes == 420);
  CHECK(full.header.encode_ns == 10); // clock readings 20 and 30
  REQUIRE(full.header.tensors.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(full.header.tensors[i].name == v0.metas()[i].name);
    CHECK(full.header.tensors[i].shape == v0.metas()[i].shape);
    CHECK(full.header.tensors[i].hash == v0.metas()[i].hash);
  }
  CHECK(full.bytes == 420);
  REQUIRE(full.buckets.size() == 2);
  struct expected_chunk {
    uint32_t tensor;
    uint64_t offset, bytes;
  };
  std::vector<std::vector<expected_chunk>> plan = {{{0, 0, 200}, {1, 0, 56}},
                                                  {{1, 28, 4}, {2, 0, 160}}};
  for (size_t k = 0; k < 2; ++k) {
    const auto& bucket = full.buckets[k];
    CHECK(bucket.version == 0);
    CHECK(bucket.index == k);
    CHECK(bucket.delta.empty());
    REQUIRE(bucket.chunks.size() == plan[k].size());
    std::vector<uint8_t> all;
    for (size_t c = 0; c < plan[k].size(); ++c) {
      const auto& got = bucket.chunks[c];
      CHECK(got.tensor == plan[k][c].tensor);
      CHECK(got.offset == plan[k][c].offset);
      REQUIRE(got.bytes == plan[k][c].bytes);
      auto* want = reinterpret_cast<const uint8_t*>(v0.tensors[got.tensor].data() + got.offset);
      CHECK(std::equal(got.data, got.data + got.bytes, want));
      all.insert(all.end(), want, want + got.bytes);
    }
    CHECK(bucket.checksum == hash_bytes(all.data(), all.size()));
  }

  auto acks = deliver(p, r, {{"a", &a}, {"b", &b}});
  CHECK(a.model.tensors == v0.tensors);
  CHECK(b.model.tensors == v0.tensors);
  acks["a"].apply_ns = 700;
  acks["b"].apply_ns = 300;
  r = p.core.on_ack("a", acks["a"]);
  CHECK_FALSE(r.ready);
  CHECK(r.logs.empty());
  r = p.core.on_ack("b", acks["b"]);
  REQUIRE(r.ready);
  CHECK(r.ready->version == 0);
  CHECK(r.ready->model_hash == v0.hash());
  CHECK(r.ready->workers == 2);
  CHECK(r.ready->bytes_sent == 420);
  CHECK(r.ready->dense_bytes == 420);
  CHECK(r.ready->publish_ns == 30); // readings 10 (snapshot) and 40 (last ack)
  CHECK(r.ready->changed_elements == 0);
  CHECK(r.ready->elements == 210);
  CHECK(r.ready->encode_ns == 10);
  CHECK(r.ready->apply_ns_max == 700);
  CHECK(r.ready->full_workers == 2);
  CHECK(r.ready->sparse_workers == 0);
  CHECK(r.ready->resyncs == 0);
  CHECK(r.ready->sparse_bytes == 0);
  CHECK(r.ready->verified_workers == 2);
  REQUIRE(r.logs.size() == 1);
  CHECK(r.logs[0].text == "p: version 0 acknowledged by 2 workers");
  CHECK_THROWS_AS(p.core.payload_of(payload_kind::full), std::logic_error);

  // Every 4th element moves: 25 + 8 + 20 = 53 changed elements.
  auto v1 = nudged(v0, 4);
  r = p.core.on_snapshot(snapshot(v1, 1));
  CHECK(sends(r) == both_sparse);
  CHECK(r.logs.empty());
  CHECK_THROWS_AS(p.core.payload_of(payload_kind::full), std::logic_error);
  const auto& sparse = p.core.payload_of(payload_kind::sparse);
  std::vector<delta_source> sources;
  for (uint32_t i = 0; i < 3; ++i)
    sources.push_back({i, v0.tensors[i].data(), v1.tensors[i].data(), v0.tensors[i].size()});
  delta_options o;
  o.bucket_bytes = 256;
  auto want = encode_delta(0, 1, sources, o);
  REQUIRE(sparse.buckets.size() == want.size());
  uint64_t bytes = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    CHECK(sparse.buckets[k].delta == want[k]);
    CHECK(sparse.buckets[k].chunks.empty());
    CHECK(sparse.buckets[k].checksum == 0);
    CHECK(sparse.buckets[k].index == k);
    bytes += want[k].size();
  }
  CHECK(sparse.bytes == bytes);
  CHECK_FALSE(sparse.header.full);
  CHECK(sparse.header.base_version == 0);
  CHECK(sparse.header.changed_elements == 53);
  CHECK(sparse.header.total_bytes == bytes);
  CHECK(sparse.header.bucket_count == want.size());
  CHECK(sparse.header.model_hash == v1.hash());

  acks = deliver(p, r, {{"a", &a}, {"b", &b}});
  CHECK(a.model.tensors == v1.tensors);
  CHECK(b.model.tensors == v1.tensors);
  CHECK_FALSE(p.core.on_ack("b", acks["b"]).ready);
  r = p.core.on_ack("a", acks["a"]);
  REQUIRE(r.ready);
  CHECK(r.ready->version == 1);
  CHECK(r.ready->bytes_sent == bytes);
  CHECK(r.ready->changed_elements == 53);
  CHECK(r.ready->sparse_bytes == bytes);
  CHECK(r.ready->sparse_workers == 2);
  CHECK(r.ready->full_workers == 0);
  CHECK(r.ready->encode_ns == 10);
  CHECK(r.ready->publish_ns == 30);
  CHECK(r.ready->verified_workers == 2);
  CHECK(p.core.protocol().base_version() == 1u);
}

TEST_CASE("each delta's changed elements that an earlier delta changed are counted as "
          "recurring") {
  publisher p{{"a", "b"}};
  worker a{make_model({100, 30, 80}, 1), "a"}, b{make_model({100, 30, 80}, 2), "b"};
  publish_v0(p, a, b); // in full: no delta, nothing recorded
  // Version 1 moves every 4th element (25 + 8 + 20 = 53), version 2 every 2nd (50 + 15 + 40 =
  // 105), of which the 53 that version 1 moved recur.
  const auto v1 = nudged(model_v0(), 4), v2 = nudged(v1, 2);
  uint64_t version = 1;
  for (const auto& [model, changed, recurring] :
       {std::tuple{v1, 53, 0}, std::tuple{v2, 105, 53}}) {
    INFO("version " << version);
    auto r = p.core.on_snapshot(snapshot(model, version));
    REQUIRE(sends(r) == both_sparse);
    auto acks = deliver(p, r, {{"a", &a}, {"b", &b}});
    p.core.on_ack("a", acks["a"]);
    r = p.core.on_ack("b", acks["b"]);
    REQUIRE(r.ready);
    CHECK(r.ready->changed_elements == static_cast<uint64_t>(changed));
    CHECK(r.ready->recurring_elements == static_cast<uint64_t>(recurring));
    // Every change is one step of +1 (nudged): the bound is which `changed` of the 210
    // elements moved, log2 C(210, changed).
    const double bound = (std::lgamma(211.0) - std::lgamma(changed + 1.0) - std::lgamma(211.0 - changed)) / std::log(2.0);
    CHECK(r.ready->bound_bits == Approx(bound).epsilon(1e-12));
    ++version;
  }
}

TEST_CASE("a delta that misses the published hash is re-sent in full and counted as a "
          "resync") {
  publisher p{{"a", "b"}};
  auto v0 = model_v0();
  worker a{v0, "a"}, b{v0, "b"};
  publish_v0(p, a, b);
  a.model.tensors[2][3] ^= 1; // a drifted: its delta will miss the hash
  auto v1 = nudged(v0, 7);
  auto r = p.core.on_snapshot(snapshot(v1, 1)); // readings 50, 60, 70
  REQUIRE(sends(r) == both_sparse);
  auto sparse_bytes = p.core.payload_of(payload_kind::sparse).bytes;
  auto acks = deliver(p, r, {{"a", &a}, {"b", &b}});
  REQUIRE_FALSE(acks["a"].ok);
  REQUIRE(acks["b"].ok);
  CHECK_FALSE(p.core.on_ack("b", acks["b"]).ready);

  // The worker said ok but computed another hash: the publisher's own comparison catches it.
  auto lying = acks["a"];
  lying.ok = true;
  r = p.core.on_ack("a", lying); // readings 80, 90: the full payload
  CHECK(sends(r) == std::vector<std::pair<std::string, payload_kind>>{{"a", payload_kind::full}});
  REQUIRE(r.logs.size() == 1);
  CHECK(r.logs[0].lvl == log_line::level::warn);
  CHECK(r.logs[0].text == fmt::format("p: a failed the delta to version 1 (it computed hash "
                                      "{:016x}, published {:016x}); sending it in full",
                                      lying.model_hash, v1.hash()));
  const auto& full = p.core.payload_of(payload_kind::full);
  CHECK(full.header.encode_ns == 20); // the sparse payload's 10 and its own 10
  CHECK(full.header.version == 1);
  acks = deliver(p, r, {{"a", &a}});
  CHECK(a.model.tensors == v1.tensors);
  r = p.core.on_ack("a", acks["a"]);
  REQUIRE(r.ready);
  CHECK(r.ready->sparse_bytes == sparse_bytes);
  CHECK(r.ready->bytes_sent == (2 * sparse_bytes + 420) / 2);
  CHECK(r.ready->full_workers == 1);
  CHECK(r.ready->sparse_workers == 2);
  CHECK(r.ready->resyncs == 1);
  CHECK(r.ready->encode_ns == 20);
  CHECK(r.ready->publish_ns == 50); // readings 50 and 100
  CHECK(r.ready->verified_workers == 2);

  // A failed full sync cannot be repaired.
  auto v2 = nudged(v1, 3);
  b.model.tensors[0][0] ^= 1;
  r = p.core.on_snapshot(snapshot(v2, 2));
  acks = deliver(p, r, {{"a", &a}, {"b", &b}});
  REQUIRE_FALSE(acks["b"].ok);
  r = p.core.on_ack("b", acks["b"]);
  REQUIRE(r.sends.size() == 1);
  acks = deliver(p, r, {{"b", &b}});
  acks["b"].ok = false;
  acks["b"].reason = "no room";
  r = p.core.on_ack("b", acks["b"]);
  REQUIRE(r.fail);
  CHECK(*r.fail == "b failed a full sync of version 2: no room");
  CHECK_FALSE(r.ready);
}

TEST_CASE("acknowledgements of another version, of an unknown worker or repeated are "
          "ignored") {
  publisher p{{"a", "b"}};
  auto r = p.core.on_snapshot(snapshot(model_v0(), 3));
  weight_ack ok;
  ok.version = 3;
  ok.ok = true;
  ok.model_hash = p.core.model_hash();
  auto stale = ok;
  stale.version = 2;
  auto check_ignored = [&](const std::string& who, const weight_ack& ack) {
    auto got = p.core.on_ack(who, ack);
    CHECK(got.sends.empty());
    CHECK_FALSE(got.ready);
    CHECK_FALSE(got.fail);
    REQUIRE(got.logs.size() == 1);
    CHECK(got.logs[0].lvl == log_line::level::warn);
    CHECK(got.logs[0].text ==
          fmt::format("p: ignored ack from {} for version {}", who, ack.version));
  };
  check_ignored("a", stale);
  check_ignored("x", ok);
  CHECK(p.core.on_ack("a", ok).logs.empty());
  check_ignored("a", ok);
  r = p.core.on_ack("b", ok);
  REQUIRE(r.ready);
  CHECK(r.ready->verified_workers == 2);
}

TEST_CASE("a worker lost mid-version does not hold it back, and losing the last fails the "
          "job") {
  publisher p{{"a", "b", "c", "d"}};
  auto r = p.core.on_snapshot(snapshot(model_v0(), 0));
  REQUIRE(r.sends.size() == 4);
  weight_ack ok;
  ok.version = 0;
  ok.ok = true;
  ok.model_hash = p.core.model_hash();
  CHECK_FALSE(p.core.on_ack("a", ok).ready);
  CHECK_FALSE(p.core.on_ack("c", ok).ready);
  r = p.core.on_worker_down("c"); // acknowledged, then gone
  CHECK_FALSE(r.ready);
  CHECK_FALSE(r.fail);
  r = p.core.on_worker_down("d"); // still owed an acknowledgement
  CHECK_FALSE(r.ready);
  CHECK_FALSE(r.fail);
  r = p.core.on_ack("b", ok);
  REQUIRE(r.ready);
  CHECK(r.ready->workers == 2);
  CHECK(r.ready->full_workers == 4);
  CHECK(r.ready->bytes_sent == 4 * 420 / 2); // the lost workers' bytes count, over the live
  CHECK(r.ready->verified_workers == 2);     // c's acknowledgement no longer counts

  // The last owed acknowledgement leaves with its worker: that completes the version.
  r = p.core.on_snapshot(snapshot(nudged(model_v0(), 2), 1));
  CHECK(sends(r) == both_sparse);
  ok.version = 1;
  ok.model_hash = p.core.model_hash();
  CHECK_FALSE(p.core.on_ack("a", ok).ready);
  r = p.core.on_worker_down("b");
  REQUIRE(r.ready);
  CHECK(r.ready->version == 1);
  CHECK(r.ready->workers == 1);
  CHECK(r.ready->verified_workers == 1);
  CHECK(r.logs.back().text == "p: version 1 acknowledged by 1 workers");

  r = p.core.on_snapshot(snapshot(nudged(model_v0(), 3), 2));
  r = p.core.on_worker_down("a");
  CHECK_FALSE(r.ready);
  REQUIRE(r.fail);
  CHECK(*r.fail == "every rollout worker is gone");
}

TEST_CASE("a late joiner gets the full payload while the others get the delta") {
  publisher p{{"b"}};
  auto r = p.core.on_snapshot(snapshot(model_v0(), 0));
  weight_ack ok;
  ok.ok = true;
  ok.model_hash = p.core.model_hash();
  REQUIRE(p.core.on_ack("b", ok).ready);
  p.core.add_worker("a");
  r = p.core.on_snapshot(snapshot(nudged(model_v0(), 5), 1));
  CHECK(sends(r) == std::vector<std::pair<std::string, payload_kind>>{
                      {"b", payload_kind::sparse}, {"a", payload_kind::full}});
  REQUIRE(r.logs.size() == 1);
  CHECK(r.logs[0].text == "p: version 1: full sync to 1 worker(s): new or stale workers");
  ok.version = 1;
  ok.model_hash = p.core.model_hash();
  CHECK_FALSE(p.core.on_ack("a", ok).ready);
  r = p.core.on_ack("b", ok);
  REQUIRE(r.ready);
  CHECK(r.ready->full_workers == 1);
  CHECK(r.ready->sparse_workers == 1);
  CHECK(r.ready->bytes_sent == (420 + r.ready->sparse_bytes) / 2);
}

TEST_CASE("a snapshot during a version, a malformed snapshot or no worker fails the job") {
  publisher p{{"a"}};
  auto r = p.core.on_snapshot(snapshot(model_v0(), 4));
  REQUIRE_FALSE(r.fail);
  r = p.core.on_snapshot(snapshot(model_v0(), 5));
  REQUIRE(r.fail);
  CHECK(*r.fail == "snapshot 5 arrived while version 4 is still being acknowledged");
  CHECK(r.sends.empty());

  publisher q{{"a"}};
  auto bad = snapshot(model_v0(), 1);
  bad.names.pop_back();
  r = q.core.on_snapshot(bad);
  REQUIRE(r.fail);
  CHECK(*r.fail == "cannot publish version 1: snapshot lists differ in length");
  bad = snapshot(model_v0(), 1);
  bad.shapes[1] = {31};
  r = q.core.on_snapshot(bad);
  REQUIRE(r.fail);
  CHECK(*r.fail ==
        "cannot publish version 1: snapshot tensor \"t1\" has 60 bytes, its shape needs 62");

  // A delta needs every tensor's name and size unchanged.
  publisher s{{"a"}};
  r = s.core.on_snapshot(snapshot(model_v0(), 0));
  weight_ack ok;
  ok.ok = true;
  ok.model_hash = s.core.model_hash();
  REQUIRE(s.core.on_ack("a", ok).ready);
  auto renamed = snapshot(model_v0(), 1);
  renamed.names[0] = "u0";
  r = s.core.on_snapshot(renamed);
  REQUIRE(r.fail);
  CHECK(*r.fail == "cannot publish version 1: tensor \"u0\" changed its name, size or dtype "
                   "between versions 0 and 1");
  CHECK(r.sends.empty());

  publisher none{names{}};
  r = none.core.on_snapshot(snapshot(model_v0(), 0));
  REQUIRE(r.fail);
  CHECK(*r.fail == "no rollout worker to publish to");
  CHECK(r.sends.empty());
}

TEST_CASE("the shell's time to encode a payload into messages counts into its header and "
          "VersionReady") {
  publisher p{{"a", "b"}};
  worker a{make_model({100, 30, 80}, 1), "a"}, b{make_model({100, 30, 80}, 2), "b"};
  publish_v0(p, a, b);
  p.core.add_worker("c");
  // c is new: it gets version 1 in full while a and b get the delta. The core's own encode
  // time is 10 ns per payload (one clock step between its two readings).
  auto r = p.core.on_snapshot(snapshot(nudged(model_v0(), 3), 1));
  REQUIRE(sends(r) == (std::vector<std::pair<std::string, payload_kind>>{
                        {"a", payload_kind::sparse},
                        {"b", payload_kind::sparse},
                        {"c", payload_kind::full}}));
  CHECK(p.core.payload_of(payload_kind::sparse).header.encode_ns == 10);
  CHECK(p.core.payload_of(payload_kind::full).header.encode_ns == 20);
  p.core.add_encode_ns(payload_kind::sparse, 5);
  CHECK(p.core.payload_of(payload_kind::sparse).header.encode_ns == 25);
  CHECK(p.core.payload_of(payload_kind::full).header.encode_ns == 20); // not re-encoded
  p.core.add_encode_ns(payload_kind::full, 100);
  CHECK(p.core.payload_of(payload_kind::full).header.encode_ns == 125);
  for (const auto* w : {"a", "b"})
    CHECK_FALSE(p.core.on_ack(w, applied(p, 1)).ready);
  r = p.core.on_ack("c", applied(p, 1));
  REQUIRE(r.ready);
  CHECK(r.ready->encode_ns == 125);

  // With no version in flight there is no payload to encode.
  CHECK_THROWS_AS(p.core.add_encode_ns(payload_kind::full, 1), std::logic_error);
}

TEST_CASE("publisher options come from [sync], with the config's defaults") {
  sorl::experiment_config cfg;
  const publisher_options plain;
  const auto d = publisher_options_from(cfg);
  CHECK(d.bucket_bytes == plain.bucket_bytes);
  CHECK(d.protocol.sparse == plain.protocol.sparse);
  CHECK(d.protocol.full_every == plain.protocol.full_every);
  cfg.sync.mode = sorl::sync_kind::full;
  cfg.sync.full_every = 3;
  cfg.sync.bucket_bytes = 8192;
  const auto o = publisher_options_from(cfg);
  CHECK(o.bucket_bytes == 8192);
  CHECK_FALSE(o.protocol.sparse);
  CHECK(o.protocol.full_every == 3);
}
