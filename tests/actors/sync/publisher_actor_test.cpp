// The sync_publisher actor with scripted rollout workers: a worker that fails a delta gets
// the version in full, the others keep getting deltas, a worker lost during a broadcast
// does not hold the version back, VersionReady counts the live workers whose
// acknowledgement carried the published hash, and with every worker gone the publisher ends
// the job instead of waiting for acknowledgements that cannot come.

#include <catch2/catch.hpp>

#include <chrono>
#include <tuple>

#include <caf/all.hpp>

#include "actors/sync/publisher_actor.hpp"
#include "actors/sync/weight_sync.hpp"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "runtime/topology.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using sorl::test::test_context;
using sorl::test::test_system_config;
using namespace std::chrono_literals;

namespace {

/// Two bf16 tensors; version v moves element v of each by one ULP.
std::vector<std::vector<uint16_t>> weights(uint64_t v) {
  std::vector<std::vector<uint16_t>> w{std::vector<uint16_t>(300, 0x3f80),
                                       std::vector<uint16_t>(77, 0xbf00)};
  for (uint64_t k = 1; k <= v; ++k)
    for (auto& t : w)
      t[k % t.size()] += 1;
  return w;
}

envelope snapshot(uint64_t v) {
  auto w = weights(v);
  return build_envelope<msg::WeightSnapshot>([&](msg::WeightSnapshot::Builder b) {
    b.setVersion(v);
    b.setDtype(msg::WeightDtype::BF16);
    auto names = b.initNames(2);
    auto shapes = b.initShapes(2);
    auto data = b.initData(2);
    for (unsigned i = 0; i < 2; ++i) {
      names.set(i, "t" + std::to_string(i));
      shapes.init(i, 1).set(0, static_cast<int64_t>(w[i].size()));
      data.set(i, kj::arrayPtr(reinterpret_cast<const kj::byte*>(w[i].data()), w[i].size() * 2));
    }
  });
}

uint64_t hash_of(uint64_t v) {
  auto w = weights(v);
  return sync::model_hash({sync::hash_bytes(w[0].data(), w[0].size() * 2),
                           sync::hash_bytes(w[1].data(), w[1].size() * 2)});
}

/// What a worker received for one version: the header, then its buckets.
struct received {
  uint64_t version = 0;
  bool full = false;
  uint64_t base = 0;
  uint32_t buckets = 0;
  std::vector<envelope> messages; ///< the header, then the buckets
};

received receive_version(caf::scoped_actor& worker) {
  received r;
  worker->receive(
    [&](const envelope& e) {
      r.messages.push_back(e);
      auto err = with_envelope<msg::WeightVersion>(e, [&](msg::WeightVersion::Reader h) {
        r.version = h.getVersion();
        r.full = h.getFull();
        r.base = h.getBaseVersion();
        r.buckets = h.getBucketCount();
      });
      REQUIRE_FALSE(err);
    },
    caf::after(10s) >> [] { FAIL("no version header"); });
  for (uint32_t k = 0; k < r.buckets; ++k)
    worker->receive(
      [&](const envelope& e) {
        CHECK(e.schema_id() == capnp::typeId<msg::WeightBucket>());
        r.messages.push_back(e);
      },
                    caf::after(10s) >> [] { FAIL("missing bucket"); });
  return r;
}

envelope ack(uint64_t v, const std::string& worker, bool ok, uint64_t hash,
             int64_t apply_ns = 0) {
  return build_envelope<msg::WeightAck>([&](msg::WeightAck::Builder b) {
    b.setVersion(v);
    b.setWorker(worker);
    b.setOk(ok);
    b.setModelHash(hash);
    b.setReason(ok ? "" : "apply failed on purpose");
    b.setApplyNs(apply_ns);
  });
}

template <class Read>
void receive_ready(caf::scoped_actor& trainer, Read read) {
  trainer->receive(
    [&](const envelope& e) { REQUIRE_FALSE(with_envelope<msg::VersionReady>(e, read)); },
    caf::after(10s) >> [] { FAIL("no VersionReady"); });
}

/// A sparse-mode publisher (4096-byte buckets) whose trainer and two rollout workers a and b
/// are played by the test; the trainer stands in for the directory too: it would receive a
/// failure, if any. The publisher is stopped at the end of the test.
struct publisher_harness {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor trainer{sys};
  caf::scoped_actor a{sys};
  caf::scoped_actor b{sys};
  experiment_config exp; ///< sync.mode = sparse; the publisher keeps a pointer to it
  caf::actor pub;
  std::vector<peer_info> roster;

  publisher_harness() {
    exp.sync.bucket_bytes = 4096;
    pub = spawn_sync_publisher(
      sys, test_context(exp, "sync_publisher", caf::actor_cast<caf::actor>(trainer)));
    roster = {{"trainer", 0, "test", caf::actor_cast<caf::actor>(trainer)},
              {"rollout_worker", 0, "test", caf::actor_cast<caf::actor>(a)},
              {"rollout_worker", 1, "test", caf::actor_cast<caf::actor>(b)}};
    trainer->send(pub, roster_atom::value, roster);
  }
  ~publisher_harness() {
    trainer->send_exit(pub, caf::exit_reason::user_shutdown);
  }
  /// The trainer's snapshot of version `v` reaches both workers.
  void broadcast(uint64_t v) {
    trainer->send(pub, snapshot(v));
    receive_version(a);
    receive_version(b);
  }
};

/// Waits for the publisher's (shutdown_atom, ok, why) to the directory (played by `trainer`);
/// a VersionReady before it fails the test: no worker holds that version.
std::pair<bool, std::string> expect_job_end(caf::scoped_actor& trainer) {
  std::pair<bool, std::string> out;
  for (bool found = false; !found;)
    trainer->receive(
      [&](const envelope& e) {
        if (e.schema_id() == capnp::typeId<msg::VersionReady>())
          FAIL("a version was declared ready without any worker to hold it");
      },
      [&](shutdown_atom, bool ok, const std::string& why) {
        found = true;
        out = {ok, why};
      },
      caf::after(10s) >> [] { FAIL("the publisher neither finished the version nor ended the job"); });
  return out;
}

} // namespace

TEST_CASE("with every worker gone the publisher ends the job instead of waiting for acks") {
  publisher_harness h;
  auto [trainer, a, b, pub, roster] = std::tie(h.trainer, h.a, h.b, h.pub, h.roster);
  h.broadcast(0);
  a->send(pub, ack(0, roster[1].name(), true, hash_of(0)));
  SECTION("during a broadcast: b never acknowledges, so version 0 can never complete") {}
  SECTION("between versions: nothing is in flight, the next snapshot has no one to go to") {
    b->send(pub, ack(0, roster[2].name(), true, hash_of(0)));
    receive_ready(trainer, [](msg::VersionReady::Reader r) { CHECK(r.getWorkers() == 2); });
  }
  // a goes first: were b first, a's acknowledgement would complete version 0 with a alone.
  trainer->send(pub, peer_down_atom::value, roster[1], std::string{"killed"});
  trainer->send(pub, peer_down_atom::value, roster[2], std::string{"connection lost"});
  auto [ok, why] = expect_job_end(trainer);
  CHECK_FALSE(ok);
  CHECK(why == "every rollout worker is gone");
}

TEST_CASE("the publisher ends the job when a snapshot has no worker to go to") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor trainer{sys};
  experiment_config exp;
  auto pub = spawn_sync_publisher(
    sys, test_context(exp, "sync_publisher", caf::actor_cast<caf::actor>(trainer)));
  std::vector<peer_info> roster{{"trainer", 0, "test", caf::actor_cast<caf::actor>(trainer)}};
  trainer->send(pub, roster_atom::value, roster);
  trainer->send(pub, snapshot(0));
  auto [ok, why] = expect_job_end(trainer);
  CHECK_FALSE(ok);
  CHECK(why == "no rollout worker to publish to");
  trainer->send_exit(pub, caf::exit_reason::user_shutdown);
}

TEST_CASE("the publisher resyncs a failed worker in full and never waits for a lost one") {
  publisher_harness h;
  auto [trainer, a, b, pub, roster] = std::tie(h.trainer, h.a, h.b, h.pub, h.roster);
  auto name_a = roster[1].name();
  auto name_b = roster[2].name();

  // Version 0: the first version is full for everyone.
  trainer->send(pub, snapshot(0));
  auto ra = receive_version(a);
  auto rb = receive_version(b);
  CHECK(ra.full);
  CHECK(rb.full);
  a->send(pub, ack(0, name_a, true, hash_of(0)));
  b->send(pub, ack(0, name_b, true, hash_of(0)));
  receive_ready(trainer, [&](msg::VersionReady::Reader r) {
    CHECK(r.getVersion() == 0);
    CHECK(r.getModelHash() == hash_of(0));
    CHECK(r.getFullWorkers() == 2);
    CHECK(r.getWorkers() == 2);
    CHECK(r.getVerifiedWorkers() == 2); // both acknowledged hash_of(0)
  });

  // Version 1: deltas against 0; b fails it and is sent version 1 in full.
  trainer->send(pub, snapshot(1));
  ra = receive_version(a);
  rb = receive_version(b);
  CHECK_FALSE(ra.full);
  CHECK(ra.base == 0);
  CHECK_FALSE(rb.full);
  a->send(pub, ack(1, name_a, true, hash_of(1)));
  b->send(pub, ack(1, name_b, false, 0));
  rb = receive_version(b);
  CHECK(rb.full);
  CHECK(rb.version == 1);
  b->send(pub, ack(1, name_b, true, hash_of(1)));
  receive_ready(trainer, [&](msg::VersionReady::Reader r) {
    CHECK(r.getVersion() == 1);
    CHECK(r.getSparseWorkers() == 2);
    CHECK(r.getFullWorkers() == 1);
    CHECK(r.getResyncs() == 1);
    CHECK(r.getChangedElements() == 2);
    CHECK(r.getElements() == 377);
    CHECK(r.getVerifiedWorkers() == 2); // b's failed delta is superseded by its full sync
  });

  // Version 2: b holds 1 again, so both get deltas; a wrong hash is a failed delta too.
  trainer->send(pub, snapshot(2));
  ra = receive_version(a);
  rb = receive_version(b);
  CHECK_FALSE(ra.full);
  CHECK_FALSE(rb.full);
  CHECK(rb.base == 1);
  a->send(pub, ack(2, name_a, true, hash_of(2) ^ 1));
  CHECK(receive_version(a).full);
  a->send(pub, ack(2, name_a, true, hash_of(2)));
  b->send(pub, ack(2, name_b, true, hash_of(2)));
  receive_ready(trainer, [&](msg::VersionReady::Reader r) {
    CHECK(r.getResyncs() == 1);
    CHECK(r.getVerifiedWorkers() == 2); // a's wrong hash is replaced by the right one
  });

  // Version 3: b is lost mid-broadcast; a's ack completes the version.
  trainer->send(pub, snapshot(3));
  receive_version(a);
  receive_version(b);
  a->send(pub, ack(3, name_a, true, hash_of(3)));
  trainer->send(pub, peer_down_atom::value, roster[2], std::string{"killed"});
  receive_ready(trainer, [&](msg::VersionReady::Reader r) {
    CHECK(r.getVersion() == 3);
    CHECK(r.getWorkers() == 1);
    CHECK(r.getVerifiedWorkers() == 1); // a; the lost b is not counted
  });
}

TEST_CASE("a worker lost after acknowledging a version is not counted among the verified ones") {
  publisher_harness h;
  auto [trainer, a, b, pub, roster] = std::tie(h.trainer, h.a, h.b, h.pub, h.roster);
  h.broadcast(0);
  // b holds version 0 with the right hash, then goes; a's acknowledgement completes it.
  b->send(pub, ack(0, roster[2].name(), true, hash_of(0)));
  trainer->send(pub, peer_down_atom::value, roster[2], std::string{"killed"});
  a->send(pub, ack(0, roster[1].name(), true, hash_of(0)));
  receive_ready(trainer, [&](msg::VersionReady::Reader r) {
    CHECK(r.getWorkers() == 1);
    CHECK(r.getVerifiedWorkers() == 1); // b's acknowledgement no longer describes a live worker
  });
}

TEST_CASE("acknowledgements that come early, from an unknown worker, for another version or "
          "twice complete nothing") {
  publisher_harness h;
  auto [trainer, a, b, pub, roster] = std::tie(h.trainer, h.a, h.b, h.pub, h.roster);
  auto name_a = roster[1].name();
  auto name_b = roster[2].name();
  // Each stray acknowledgement carries a large apply time: had it counted, VersionReady's
  // applyNsMax would show it, and a version completed early would miss b's hash.
  a->send(pub, ack(0, name_a, true, hash_of(0), 900)); // before the snapshot exists
  h.broadcast(0);
  a->send(pub, ack(0, "rollout_worker#7@elsewhere", true, hash_of(0), 901));
  a->send(pub, ack(5, name_a, true, hash_of(0), 902));
  a->send(pub, ack(0, name_a, true, hash_of(0), 5));
  a->send(pub, ack(0, name_a, true, hash_of(0), 903)); // a repeat
  b->send(pub, ack(0, name_b, true, hash_of(0), 7));
  receive_ready(trainer, [](msg::VersionReady::Reader r) {
    CHECK(r.getVersion() == 0);
    CHECK(r.getWorkers() == 2);
    CHECK(r.getVerifiedWorkers() == 2);
    CHECK(r.getApplyNsMax() == 7);
  });
  // A late acknowledgement of version 0 does not touch version 1.
  trainer->send(pub, snapshot(1));
  receive_version(a);
  receive_version(b);
  b->send(pub, ack(0, name_b, true, hash_of(0), 904));
  a->send(pub, ack(1, name_a, true, hash_of(1), 3));
  b->send(pub, ack(1, name_b, true, hash_of(1), 2));
  receive_ready(trainer, [](msg::VersionReady::Reader r) {
    CHECK(r.getVersion() == 1);
    CHECK(r.getVerifiedWorkers() == 2);
    CHECK(r.getApplyNsMax() == 3);
  });
}

TEST_CASE("both workers get the very same messages of a version: each payload is encoded "
          "once") {
  publisher_harness h;
  auto [trainer, a, b, pub, roster] = std::tie(h.trainer, h.a, h.b, h.pub, h.roster);
  trainer->send(pub, snapshot(0));
  auto ra = receive_version(a);
  auto rb = receive_version(b);
  REQUIRE(ra.messages.size() == 2); // 754 bytes: one bucket
  REQUIRE(rb.messages.size() == ra.messages.size());
  for (size_t k = 0; k < ra.messages.size(); ++k)
    CHECK(ra.messages[k].data() == rb.messages[k].data()); // shared bytes, not copies
  a->send(pub, ack(0, roster[1].name(), true, hash_of(0)));
  b->send(pub, ack(0, roster[2].name(), true, hash_of(0)));
  receive_ready(trainer, [](msg::VersionReady::Reader) {});

  // Version 1: a fails its delta and gets the full payload, encoded now; b keeps the delta.
  trainer->send(pub, snapshot(1));
  ra = receive_version(a);
  rb = receive_version(b);
  CHECK_FALSE(ra.full);
  CHECK(ra.messages[0].data() == rb.messages[0].data());
  a->send(pub, ack(1, roster[1].name(), false, 0));
  auto full = receive_version(a);
  CHECK(full.full);
  CHECK(full.version == 1);
  CHECK(full.buckets == 1);
}

TEST_CASE("a full sync a worker fails, a snapshot during a version or an unreadable snapshot "
          "ends the job") {
  publisher_harness h;
  auto [trainer, a, b, pub, roster] = std::tie(h.trainer, h.a, h.b, h.pub, h.roster);
  std::string why;
  bool whole = true; // false: `why` starts the reason, the envelope's own words follow
  SECTION("a failed full sync") {
    h.broadcast(0);
    a->send(pub, ack(0, roster[1].name(), false, 0));
    why = roster[1].name() + " failed a full sync of version 0: apply failed on purpose";
  }
  SECTION("a snapshot while a version is in flight") {
    h.broadcast(0);
    trainer->send(pub, snapshot(1));
    why = "snapshot 1 arrived while version 0 is still being acknowledged";
  }
  SECTION("a snapshot whose segment table claims more words than it has") {
    const uint32_t table[4] = {0, 1000, 0, 0}; // one segment of 1000 words, none sent
    auto bad = envelope::from_bytes(capnp::typeId<msg::WeightSnapshot>(), table, sizeof table);
    REQUIRE(bad);
    trainer->send(pub, *bad);
    why = "cannot read a weight snapshot: ";
    whole = false;
  }
  auto [ok, got] = expect_job_end(trainer);
  CHECK_FALSE(ok);
  if (whole)
    CHECK(got == why);
  else
    CHECK(got.rfind(why, 0) == 0);
}
