// The version protocol of weight synchronisation: who gets a delta, who gets a full sync, and
// when the publisher's base snapshot may advance.

#include <catch2/catch.hpp>

#include "actors/sync/sync_protocol.hpp"
#include "runtime/config.hpp"

using namespace sorl::sync;
using names = std::vector<std::string>;

namespace {

/// Three workers that all acknowledged version 0 (the first, full, version).
sync_protocol three_on_version_zero(sync_protocol_options o = {}) {
  sync_protocol p{o};
  for (auto w : {"a", "b", "c"})
    p.add_worker(w);
  auto plan = p.begin(0);
  REQUIRE(plan.full == names{"a", "b", "c"});
  CHECK(plan.sparse.empty());
  CHECK_FALSE(plan.base_version);
  CHECK(plan.why_full == (o.sparse ? "first version" : "sync.mode = full"));
  CHECK(p.on_ack("a", 0, true) == ack_action::wait);
  CHECK(p.on_ack("b", 0, true) == ack_action::wait);
  CHECK(p.on_ack("c", 0, true) == ack_action::complete);
  p.commit();
  REQUIRE(p.base_version() == 0u);
  return p;
}

} // namespace

TEST_CASE("the first version is full, later ones are deltas against the acknowledged base") {
  auto p = three_on_version_zero();
  auto plan = p.begin(1);
  CHECK(plan.sparse == names{"a", "b", "c"});
  CHECK(plan.full.empty());
  CHECK(plan.base_version == 0u);
  CHECK(p.on_ack("a", 1, true) == ack_action::wait);
  CHECK(p.on_ack("b", 1, true) == ack_action::wait);
  CHECK(p.base_version() == 0u); // not ahead of what every worker acknowledged
  CHECK_THROWS_AS(p.commit(), std::logic_error);
  CHECK(p.waiting() == names{"c"});
  CHECK(p.on_ack("c", 1, true) == ack_action::complete);
  p.commit();
  CHECK(p.base_version() == 1u);
  CHECK(p.holds("b") == 1u);
}

TEST_CASE("a worker that fails the delta gets the same version in full") {
  auto p = three_on_version_zero();
  p.begin(1);
  CHECK(p.on_ack("b", 1, false) == ack_action::send_full);
  CHECK_FALSE(p.holds("b"));
  CHECK(p.resyncs() == 1u);
  CHECK(p.on_ack("a", 1, true) == ack_action::wait);
  CHECK(p.on_ack("c", 1, true) == ack_action::wait); // b still owes the full version
  CHECK(p.on_ack("b", 1, true) == ack_action::complete);
  p.commit();
  // b holds the base again, so the next version is a delta for everyone.
  auto plan = p.begin(2);
  CHECK(plan.sparse == names{"a", "b", "c"});
  CHECK(p.resyncs() == 0u);
}

TEST_CASE("a failed full sync cannot be repaired and fails the job") {
  auto p = three_on_version_zero();
  p.begin(1);
  CHECK(p.on_ack("a", 1, false) == ack_action::send_full);
  CHECK(p.on_ack("a", 1, false) == ack_action::fail);
  sync_protocol fresh;
  fresh.add_worker("x");
  fresh.begin(0);
  CHECK(fresh.on_ack("x", 0, false) == ack_action::fail);
}

TEST_CASE("a worker that missed a version or joined late gets a full sync") {
  auto p = three_on_version_zero();
  p.begin(1);
  p.on_ack("a", 1, true);
  p.on_ack("b", 1, true);
  CHECK(p.on_ack("c", 1, false) == ack_action::send_full);
  CHECK(p.on_ack("c", 1, true) == ack_action::complete);
  p.commit();
  p.add_worker("d"); // holds nothing
  auto plan = p.begin(2);
  CHECK(plan.sparse == names{"a", "b", "c"});
  CHECK(plan.full == names{"d"});
  CHECK(plan.why_full == "new or stale workers");
  // Joining while a version is in flight does not make that version wait for the newcomer.
  p.add_worker("e");
  for (auto w : {"a", "b", "c"})
    CHECK(p.on_ack(w, 2, true) == ack_action::wait);
  CHECK(p.on_ack("d", 2, true) == ack_action::complete);
  CHECK(p.on_ack("e", 2, true) == ack_action::ignore);
  p.commit();
  auto next = p.begin(3);
  CHECK(next.full == names{"e"});
  CHECK(next.sparse == names{"a", "b", "c", "d"});
}

TEST_CASE("full anchors every N versions, and mode full sends everything in full") {
  sync_protocol_options o;
  o.full_every = 3;
  auto p = three_on_version_zero(o);
  for (uint64_t v = 1; v <= 6; ++v) {
    auto plan = p.begin(v);
    if (v % 3 == 0) {
      CHECK(plan.full.size() == 3);
      CHECK(plan.why_full == "full anchor (every 3 versions)");
    } else {
      CHECK(plan.sparse.size() == 3);
    }
    for (auto w : {"a", "b", "c"})
      p.on_ack(w, v, true);
    p.commit();
  }
  sync_protocol_options full;
  full.sparse = false;
  auto q = three_on_version_zero(full);
  auto plan = q.begin(1);
  CHECK(plan.full.size() == 3);
  CHECK(plan.why_full == "sync.mode = full");
}

TEST_CASE("a worker lost during a broadcast does not hold the version back") {
  auto p = three_on_version_zero();
  p.begin(1);
  p.on_ack("a", 1, true);
  CHECK_FALSE(p.remove_worker("c"));     // b still owes its ack
  CHECK(p.on_ack("b", 1, true) == ack_action::complete);
  p.commit();
  p.begin(2);
  p.on_ack("a", 2, true);
  CHECK(p.remove_worker("b"));           // the last one owed: the version is complete
  p.commit();
  CHECK(p.base_version() == 2u);
  CHECK(p.workers() == 1u);
  CHECK_FALSE(p.remove_worker("zz"));
}

TEST_CASE("stale, unknown and repeated acknowledgements are ignored") {
  auto p = three_on_version_zero();
  CHECK(p.on_ack("a", 0, true) == ack_action::ignore); // nothing in flight
  p.begin(1);
  CHECK(p.on_ack("a", 0, true) == ack_action::ignore); // old version
  CHECK(p.on_ack("a", 2, true) == ack_action::ignore); // future version
  CHECK(p.on_ack("nobody", 1, true) == ack_action::ignore);
  CHECK(p.on_ack("a", 1, true) == ack_action::wait);
  CHECK(p.on_ack("a", 1, true) == ack_action::ignore); // repeat
  CHECK(p.on_ack("a", 1, false) == ack_action::ignore); // late failure after success
  CHECK(p.holds("a") == 1u);
}

TEST_CASE("versions must increase and never overlap") {
  auto p = three_on_version_zero();
  CHECK_THROWS_AS(p.begin(0), std::invalid_argument);
  p.begin(1);
  CHECK_THROWS_AS(p.begin(2), std::logic_error);
  CHECK_THROWS_AS(sync_protocol(sync_protocol_options{true, -1}), std::invalid_argument);
  CHECK(std::string{to_string(ack_action::send_full)} == "send_full");
}

TEST_CASE("protocol options come from [sync], with the config's defaults") {
  sorl::experiment_config cfg;
  const sync_protocol_options plain;
  const auto d = protocol_options_from(cfg);
  CHECK(d.sparse == plain.sparse);
  CHECK(d.full_every == plain.full_every);
  cfg.sync.mode = sorl::sync_kind::full;
  cfg.sync.full_every = 7;
  const auto o = protocol_options_from(cfg);
  CHECK_FALSE(o.sparse);
  CHECK(o.full_every == 7);
}
