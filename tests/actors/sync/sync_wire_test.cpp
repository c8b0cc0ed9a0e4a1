// The bytes on the wire: what publisher_core and the encoders of actors/sync/sync_wire.hpp
// send must be the bytes the sync shells built themselves before their logic moved into the
// cores. The reference encoders below are the shells' own code (actors/sync/publisher_actor.cpp
// and actors/rollout/worker_actor.cpp as they were when publisher_core was introduced), kept
// verbatim apart from their state arguments and the checks that only raise.

#include <catch2/catch.hpp>

#include "tests/support/same_bytes.hpp"

#include <cstring>
#include <tuple>

#include <fmt/format.h>

#include "actors/sync/sync_wire.hpp"
#include "runtime/sync/delta_codec.hpp"
#include "tests/actors/sync/toy_model.hpp"

using namespace sorl;
using namespace sorl::sync;
using namespace sorl::sync::test;

namespace {

namespace reference {

struct publisher_state {
  uint64_t bucket_bytes = 0;
  uint64_t version = 0;
  uint64_t model_hash = 0;
  std::vector<sync::tensor_meta> metas;
  uint64_t changed = 0;
  uint64_t elements = 0;
  uint64_t dense_bytes = 0;
  int64_t encode_ns = 0;
};

struct payload {
  envelope header;
  std::vector<envelope> buckets;
  uint64_t bytes = 0;
};

/// publish(): the metas and model hash of a snapshot.
void read_snapshot(publisher_state& st, const envelope& e) {
  with_envelope<msg::WeightSnapshot>(e, [&](msg::WeightSnapshot::Reader snap) {
    auto names = snap.getNames();
    auto shapes = snap.getShapes();
    auto data = snap.getData();
    auto dtype = snap.getDtype() == msg::WeightDtype::BF16 ? sync::weight_dtype::bf16
                                                           : sync::weight_dtype::fp32;
    std::vector<uint64_t> hashes;
    for (unsigned i = 0; i < names.size(); ++i) {
      sync::tensor_meta m;
      m.name = names[i];
      for (auto d : shapes[i])
        m.shape.push_back(d);
      m.dtype = dtype;
      m.hash = sync::hash_bytes(data[i].begin(), data[i].size());
      hashes.push_back(m.hash);
      st.elements += m.elements();
      st.dense_bytes += m.bytes();
      st.metas.push_back(std::move(m));
    }
    st.version = snap.getVersion();
    st.model_hash = sync::model_hash(hashes);
  });
}

envelope version_header(const publisher_state& st, bool full, uint64_t base_version,
                        uint32_t bucket_count, uint64_t total_bytes) {
  return build_envelope<msg::WeightVersion>([&](msg::WeightVersion::Builder b) {
    b.setVersion(st.version);
    auto list = b.initTensors(static_cast<unsigned>(st.metas.size()));
    for (size_t i = 0; i < st.metas.size(); ++i) {
      const auto& m = st.metas[i];
      auto t = list[static_cast<unsigned>(i)];
      t.setName(m.name);
      auto shape = t.initShape(static_cast<unsigned>(m.shape.size()));
      for (size_t k = 0; k < m.shape.size(); ++k)
        shape.set(static_cast<unsigned>(k), m.shape[k]);
      t.setDtype(m.dtype == sync::weight_dtype::bf16 ? msg::WeightDtype::BF16
                                                     : msg::WeightDtype::FP32);
      t.setHash(m.hash);
    }
    b.setModelHash(st.model_hash);
    b.setBucketCount(bucket_count);
    b.setTotalBytes(total_bytes);
    b.setFull(full);
    b.setBaseVersion(base_version);
    b.setChangedElements(full ? 0 : st.changed);
    b.setEncodeNs(st.encode_ns);
  });
}

payload full_payload(publisher_state& st, const envelope& next) {
  payload p;
  auto buckets = sync::plan_buckets(st.metas, st.bucket_bytes);
  auto err = with_envelope<msg::WeightSnapshot>(next, [&](msg::WeightSnapshot::Reader snap) {
    std::vector<kj::ArrayPtr<const kj::byte>> blobs;
    for (auto d : snap.getData())
      blobs.push_back(d);
    for (size_t k = 0; k < buckets.size(); ++k) {
      p.buckets.push_back(build_envelope<msg::WeightBucket>([&](msg::WeightBucket::Builder b) {
        b.setVersion(st.version);
        b.setIndex(static_cast<uint32_t>(k));
        auto chunks = b.initChunks(static_cast<unsigned>(buckets[k].size()));
        std::vector<uint8_t> all;
        for (size_t c = 0; c < buckets[k].size(); ++c) {
          const auto& ref = buckets[k][c];
          auto esz = sync::element_size(st.metas[ref.tensor].dtype);
          auto bytes = blobs[ref.tensor].slice(ref.offset * esz, (ref.offset + ref.count) * esz);
          auto out = chunks[static_cast<unsigned>(c)];
          out.setTensor(ref.tensor);
          out.setOffset(ref.offset);
          out.setData(bytes);
          all.insert(all.end(), bytes.begin(), bytes.end());
        }
        b.setChecksum(sync::hash_bytes(all.data(), all.size()));
      }));
    }
  });
  REQUIRE_FALSE(err);
  p.bytes = st.dense_bytes;
  p.header = version_header(st, true, 0, static_cast<uint32_t>(p.buckets.size()), p.bytes);
  return p;
}

payload sparse_payload(publisher_state& st, const envelope& base_env, const envelope& next_env,
                       uint64_t base_version) {
  payload p;
  caf::error inner;
  auto outer = with_envelope<msg::WeightSnapshot>(base_env, [&](msg::WeightSnapshot::Reader base) {
    inner = with_envelope<msg::WeightSnapshot>(next_env, [&](msg::WeightSnapshot::Reader next) {
      auto old_data = base.getData();
      auto new_data = next.getData();
      std::vector<sync::delta_source> sources;
      for (unsigned i = 0; i < st.metas.size(); ++i) {
        const auto& m = st.metas[i];
        sync::delta_source s;
        s.tensor = i;
        s.base = reinterpret_cast<const uint16_t*>(old_data[i].begin());
        s.next = reinterpret_cast<const uint16_t*>(new_data[i].begin());
        s.elements = m.elements();
        sources.push_back(s);
      }
      sync::delta_options o;
      o.bucket_bytes = st.bucket_bytes;
      o.threads = 0;
      sync::delta_stats stats;
      auto buckets = sync::encode_delta(base_version, st.version, sources, o, &stats);
      st.changed = stats.changed;
      for (size_t k = 0; k < buckets.size(); ++k) {
        p.bytes += buckets[k].size();
        p.buckets.push_back(build_envelope<msg::WeightBucket>([&](msg::WeightBucket::Builder b) {
          b.setVersion(st.version);
          b.setIndex(static_cast<uint32_t>(k));
          b.setDelta(kj::arrayPtr(buckets[k].data(), buckets[k].size()));
        }));
      }
    });
  });
  REQUIRE_FALSE(outer);
  REQUIRE_FALSE(inner);
  p.header = version_header(st, false, base_version, static_cast<uint32_t>(p.buckets.size()),
                            p.bytes);
  return p;
}

/// worker_actor.cpp send_ack(), with its clock reading passed in.
envelope ack(const std::string& me, uint64_t version, bool ok, uint64_t hash,
             const std::string& reason, bool full, int64_t apply_ns) {
  return build_envelope<msg::WeightAck>([&](msg::WeightAck::Builder b) {
    b.setVersion(version);
    b.setWorker(me);
    b.setOk(ok);
    b.setModelHash(hash);
    b.setReason(reason);
    b.setApplyNs(apply_ns);
    b.setFull(full);
  });
}

} // namespace reference

envelope snapshot_envelope(const toy_model& m, uint64_t version) {
  return build_envelope<msg::WeightSnapshot>([&](msg::WeightSnapshot::Builder b) {
    b.setVersion(version);
    auto names = b.initNames(static_cast<unsigned>(m.tensors.size()));
    auto shapes = b.initShapes(static_cast<unsigned>(m.tensors.size()));
    auto data = b.initData(static_cast<unsigned>(m.tensors.size()));
    for (unsigned i = 0; i < m.tensors.size(); ++i) {
      names.set(i, "t" + std::to_string(i));
      auto s = shapes.init(i, 1);
      s.set(0, static_cast<int64_t>(m.tensors[i].size()));
      data.set(i, kj::arrayPtr(reinterpret_cast<const kj::byte*>(m.tensors[i].data()),
                               m.tensors[i].size() * 2));
    }
    b.setDtype(msg::WeightDtype::BF16);
  });
}

snapshot_view decoded(const envelope& e) {
  snapshot_view v;
  REQUIRE_FALSE(with_envelope<msg::WeightSnapshot>(
    e, [&](msg::WeightSnapshot::Reader s) { v = decode_snapshot(s, e.words()); }));
  return v;
}

using sorl::test::same_bytes;

void check_same_payload(const payload& core, const reference::payload& ref) {
  CHECK(core.bytes == ref.bytes);
  CHECK(same_bytes(encode_version_header(core.header), ref.header));
  REQUIRE(core.buckets.size() == ref.buckets.size());
  for (size_t k = 0; k < ref.buckets.size(); ++k)
    CHECK(same_bytes(encode_bucket(core.buckets[k]), ref.buckets[k]));
}

} // namespace

TEST_CASE("full and sparse payloads are byte for byte what the publisher's shell sent") {
  // Odd sizes so that buckets cut tensors mid-way; 512-byte buckets.
  auto v0 = make_model({301, 7, 450, 64}, 900);
  auto v1 = nudged(v0, 6);                        // sparse entries
  v1.tensors[2] = make_model({450}, 4000).tensors[0]; // dense entries over several buckets
  auto e0 = snapshot_envelope(v0, 3);
  auto e1 = snapshot_envelope(v1, 4);

  publisher_options o;
  o.bucket_bytes = 512;
  int64_t t = 0;
  publisher_core core{"p", o, [&] { return t += 1000; }};
  core.add_worker("a");
  auto r = core.on_snapshot(decoded(e0));
  REQUIRE_FALSE(r.fail);
  const auto& full0 = core.payload_of(payload_kind::full);
  REQUIRE(full0.buckets.size() > 3);

  reference::publisher_state st;
  st.bucket_bytes = 512;
  reference::read_snapshot(st, e0);
  st.encode_ns = full0.header.encode_ns; // a clock reading, not a computed value
  check_same_payload(full0, reference::full_payload(st, e0));

  weight_ack ok;
  ok.version = 3;
  ok.ok = true;
  ok.model_hash = core.model_hash();
  REQUIRE(core.on_ack("a", ok).ready);

  // The sparse payload against the base the core kept (e0's bytes, owned through the view).
  r = core.on_snapshot(decoded(e1));
  REQUIRE(r.sends.size() == 1);
  REQUIRE(r.sends[0].kind == payload_kind::sparse);
  const auto& sparse = core.payload_of(payload_kind::sparse);
  REQUIRE(sparse.buckets.size() > 1);
  reference::publisher_state st1;
  st1.bucket_bytes = 512;
  reference::read_snapshot(st1, e1);
  st1.encode_ns = sparse.header.encode_ns;
  check_same_payload(sparse, reference::sparse_payload(st1, e0, e1, 3));

  // The full payload of the same version after a failed delta: its header counts both
  // encodings' time, the shell's did too.
  ok.version = 4;
  ok.model_hash ^= 1;
  r = core.on_ack("a", ok);
  REQUIRE(r.sends.size() == 1);
  const auto& full1 = core.payload_of(payload_kind::full);
  st1.encode_ns = full1.header.encode_ns;
  CHECK(full1.header.encode_ns == 2000);
  check_same_payload(full1, reference::full_payload(st1, e1));
}

TEST_CASE("acknowledgements and VersionReady carry the shells' bytes and decode back") {
  weight_ack a;
  a.version = 12;
  a.ok = false;
  a.model_hash = 0x1234567890abcdefull;
  a.reason = "delta 11 → 12 arrived, but this worker holds version 10";
  a.apply_ns = 4567;
  a.full = false;
  auto e = encode_ack(a, "rollout_worker.1");
  CHECK(same_bytes(e, reference::ack("rollout_worker.1", 12, false, 0x1234567890abcdefull,
                                     a.reason, false, 4567)));
  weight_ack back;
  std::string worker;
  REQUIRE_FALSE(with_envelope<msg::WeightAck>(e, [&](msg::WeightAck::Reader r) {
    back = decode_ack(r);
    worker = r.getWorker();
  }));
  CHECK(worker == "rollout_worker.1");
  CHECK(back.version == 12);
  CHECK_FALSE(back.ok);
  CHECK(back.model_hash == a.model_hash);
  CHECK(back.reason == a.reason);
  CHECK(back.apply_ns == 4567);
  CHECK_FALSE(back.full);

  version_ready v;
  v.version = 7;
  v.model_hash = 99;
  v.workers = 3;
  v.bytes_sent = 1000;
  v.dense_bytes = 4000;
  v.publish_ns = 55;
  v.changed_elements = 17;
  v.elements = 2000;
  v.encode_ns = 21;
  v.apply_ns_max = 34;
  v.full_workers = 1;
  v.sparse_workers = 2;
  v.resyncs = 1;
  v.sparse_bytes = 300;
  v.verified_workers = 3;
  v.recurring_elements = 9;
  v.bound_bits = 123.25;
  REQUIRE_FALSE(with_envelope<msg::VersionReady>(encode_version_ready(v), [&](msg::VersionReady::Reader r) {
    CHECK(r.getVersion() == 7);
    CHECK(r.getModelHash() == 99);
    CHECK(r.getWorkers() == 3);
    CHECK(r.getBytesSent() == 1000);
    CHECK(r.getDenseBytes() == 4000);
    CHECK(r.getPublishNs() == 55);
    CHECK(r.getChangedElements() == 17);
    CHECK(r.getElements() == 2000);
    CHECK(r.getEncodeNs() == 21);
    CHECK(r.getApplyNsMax() == 34);
    CHECK(r.getFullWorkers() == 1);
    CHECK(r.getSparseWorkers() == 2);
    CHECK(r.getResyncs() == 1);
    CHECK(r.getSparseBytes() == 300);
    CHECK(r.getVerifiedWorkers() == 3);
    CHECK(r.getRecurringElements() == 9);
    CHECK(r.getBoundBits() == 123.25);
    const auto back = decode_version_ready(r);
    auto fields = [](const version_ready& x) {
      return std::tie(x.version, x.model_hash, x.workers, x.bytes_sent, x.dense_bytes,
                      x.publish_ns, x.changed_elements, x.elements, x.encode_ns, x.apply_ns_max,
                      x.full_workers, x.sparse_workers, x.resyncs, x.sparse_bytes,
                      x.verified_workers, x.recurring_elements, x.bound_bits);
    };
    CHECK(fields(back) == fields(v));
  }));
}

TEST_CASE("a version header and its buckets decode to what the worker's shell read") {
  auto m = make_model({301, 7}, 5);
  auto e = snapshot_envelope(m, 1);
  publisher_options o;
  o.bucket_bytes = 256;
  publisher_core core{"p", o, [] { return int64_t{0}; }};
  core.add_worker("a");
  REQUIRE(core.on_snapshot(decoded(e)).sends.size() == 1);
  const auto& p = core.payload_of(payload_kind::full);
  version_header h;
  REQUIRE_FALSE(with_envelope<msg::WeightVersion>(
    encode_version_header(p.header),
    [&](msg::WeightVersion::Reader r) { h = decode_version_header(r); }));
  CHECK(h.version == 1);
  CHECK(h.model_hash == m.hash());
  CHECK(h.bucket_count == p.buckets.size());
  CHECK(h.total_bytes == 616);
  CHECK(h.full);
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[1].name == "t1");
  CHECK(h.tensors[1].shape == std::vector<int64_t>{7});
  CHECK(h.tensors[1].hash == m.metas()[1].hash);
  CHECK(h.tensors[1].dtype == weight_dtype::bf16);

  // Every bucket goes through a worker's receiver: the model ends bit for bit equal.
  worker w{make_model({301, 7}, 77)};
  w.receiver.on_header(h);
  weight_receiver::result last;
  for (const auto& b : p.buckets) {
    auto be = encode_bucket(b);
    REQUIRE_FALSE(with_envelope<msg::WeightBucket>(be, [&](msg::WeightBucket::Reader r) {
      auto v = decode_bucket(r);
      CHECK(v.delta_size == 0);
      CHECK(v.checksum == b.checksum);
      last = w.receiver.on_bucket(v, true);
    }));
  }
  REQUIRE(last.ack);
  CHECK(last.ack->ok);
  CHECK(w.model.tensors == m.tensors);
}

TEST_CASE("a snapshot encodes to the learner's bytes and decodes to the same fields") {
  auto m = make_model({301, 7, 64}, 900);
  auto reference = snapshot_envelope(m, 5);
  const auto view = decoded(reference);
  const auto again = encode_snapshot(view);
  CHECK(same_bytes(again, reference));
  const auto back = decoded(again);
  CHECK(back.version == 5);
  CHECK(back.names == std::vector<std::string>{"t0", "t1", "t2"});
  CHECK(back.shapes == std::vector<std::vector<int64_t>>{{301}, {7}, {64}});
  REQUIRE(back.data.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(back.data[i].size == m.tensors[i].size() * 2);
    CHECK(std::memcmp(back.data[i].data, m.tensors[i].data(), back.data[i].size) == 0);
  }
  auto broken = view;
  broken.shapes.pop_back();
  CHECK_THROWS_WITH(encode_snapshot(broken), "snapshot of version 5: 3 names, 2 shapes, 3 tensors");
}
