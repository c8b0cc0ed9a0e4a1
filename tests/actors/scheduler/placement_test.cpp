#include "actors/scheduler/placement.hpp"
#include "runtime/config.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace sorl::scheduler;

namespace {

placement make(placement_policy policy, const std::vector<std::string>& workers,
               bool affinity = false, double threshold = 2.0) {
  placement_options o;
  o.policy = policy;
  o.group_affinity = affinity;
  o.imbalance_threshold = threshold;
  placement p(o);
  for (const auto& w : workers)
    p.join(w);
  return p;
}

std::string place_ok(placement& p, uint64_t id, uint64_t group = 0, int64_t tokens = 10) {
  auto r = p.place(id, group, tokens);
  REQUIRE(r);
  REQUIRE(r.error.empty());
  return *r.worker;
}

std::vector<uint64_t> ids_of(const std::vector<orphaned_request>& v) {
  std::vector<uint64_t> ids;
  for (const auto& o : v)
    ids.push_back(o.request_id);
  return ids;
}

} // namespace

TEST_CASE("round robin cycles through workers in name order", "[placement]") {
  // Joined out of order on purpose: the cycle follows names, not join order.
  auto p = make(placement_policy::round_robin, {"w-c", "w-a", "w-b"});
  std::vector<std::string> got;
  for (uint64_t id = 0; id < 7; ++id)
    got.push_back(place_ok(p, id, id));
  CHECK(got == std::vector<std::string>{"w-a", "w-b", "w-c", "w-a", "w-b", "w-c", "w-a"});
  CHECK(p.in_flight("w-a") == 3);
  CHECK(p.in_flight("w-b") == 2);
  CHECK(p.in_flight_total() == 7);
}

TEST_CASE("round robin ignores load and resumes after a worker joins or leaves",
          "[placement]") {
  auto p = make(placement_policy::round_robin, {"a", "b", "c"});
  CHECK(place_ok(p, 1) == "a");
  CHECK(place_ok(p, 2) == "b");
  p.report_load("c", {100000});
  p.worker_lost("c");
  CHECK(place_ok(p, 3) == "a"); // wraps past the lost "c"
  p.join("bb");                 // sorts between b and c
  CHECK(place_ok(p, 4) == "b");
  CHECK(place_ok(p, 5) == "bb");
  CHECK(place_ok(p, 6) == "a");
}

TEST_CASE("least loaded picks the smallest in-flight count, ties to the first name",
          "[placement]") {
  auto p = make(placement_policy::least_loaded, {"w2", "w1", "w3"});
  // All idle: tie → "w1" (name order, not join order).
  CHECK(place_ok(p, 10) == "w1");
  CHECK(place_ok(p, 11) == "w2");
  CHECK(place_ok(p, 12) == "w3");
  CHECK(place_ok(p, 13) == "w1");
  // w1: 2, w2: 1, w3: 1. Completing one on w3 makes it the unique minimum.
  CHECK(p.complete(12) == "w3");
  CHECK(place_ok(p, 14) == "w3");
  // w1: 2, w2: 1, w3: 1 → tie between w2 and w3 goes to w2.
  CHECK(place_ok(p, 15) == "w2");
  CHECK(p.load("w1") == Approx(2.0));
}

TEST_CASE("least loaded counts queued tokens when weighted", "[placement]") {
  placement_options o;
  o.policy = placement_policy::least_loaded;
  o.queued_token_weight = 1.0 / 128; // 128 queued tokens weigh as one request (exact in binary)
  placement p(o);
  p.join("a");
  p.join("b");
  p.report_load("a", {320}); // load 2.5
  p.report_load("b", {64});  // load 0.5
  CHECK(p.load("a") == 2.5);
  CHECK(place_ok(p, 1, 1, 128) == "b"); // b: 1 + (64 + 128)/128 = 2.5
  CHECK(p.load("b") == 2.5);
  CHECK(place_ok(p, 2, 2, 0) == "a"); // tie 2.5 / 2.5 → "a"
  // A fresh report replaces the estimate of prompts placed since the last one.
  p.report_load("b", {0});
  CHECK(p.load("b") == 1.0);
  CHECK_THROWS_WITH(p.report_load("b", {-1}), Catch::Contains("< 0"));
  CHECK_THROWS_WITH(p.report_load("zz", {1}), Catch::Contains("'zz' is not live"));
}

TEST_CASE("a lost worker returns exactly its in-flight requests for re-placement",
          "[placement]") {
  auto p = make(placement_policy::round_robin, {"a", "b"});
  for (uint64_t id = 1; id <= 6; ++id)
    place_ok(p, id * 10, id, static_cast<int64_t>(id)); // a: 10,30,50  b: 20,40,60
  p.complete(30);                                     // finished before the loss
  auto orphans = p.worker_lost("a");
  CHECK(ids_of(orphans) == std::vector<uint64_t>{10, 50});
  REQUIRE(orphans.size() == 2);
  CHECK(orphans[1].group_id == 5);
  CHECK(orphans[1].prompt_tokens == 5);
  CHECK_FALSE(p.is_live("a"));
  CHECK(p.in_flight_total() == 3);
  CHECK(p.stats().orphaned == 2);
  // The caller places them again; only b is left.
  for (const auto& o : orphans)
    CHECK(place_ok(p, o.request_id, o.group_id, o.prompt_tokens) == "b");
  CHECK(p.in_flight("b") == 5);
  // A late finish from the lost worker is no longer in flight there.
  CHECK(p.worker_of(10) == std::optional<std::string>("b"));
  CHECK(p.worker_of(30) == std::nullopt);
  // Losing a worker with nothing in flight returns an empty list.
  p.join("c");
  CHECK(p.leave("c").empty());
}

TEST_CASE("group affinity keeps siblings on their group's worker", "[placement]") {
  auto p = make(placement_policy::least_loaded, {"a", "b"}, /*affinity=*/true,
                /*threshold=*/10.0);
  CHECK(place_ok(p, 1, 7) == "a");
  CHECK(p.group_home(7) == std::optional<std::string>("a"));
  for (uint64_t id = 2; id <= 4; ++id)
    CHECK(place_ok(p, id, 7) == "a"); // least loaded alone would pick b
  CHECK(place_ok(p, 5, 8) == "b");    // a new group goes by the policy
  CHECK(p.stats().affinity_hits == 3);
  // The group is forgotten once its last request completes.
  for (uint64_t id = 1; id <= 4; ++id)
    p.complete(id);
  CHECK(p.group_home(7) == std::nullopt);
}

TEST_CASE("group affinity yields to the least loaded worker past the imbalance threshold",
          "[placement]") {
  auto p = make(placement_policy::round_robin, {"a", "b", "c"}, /*affinity=*/true,
                /*threshold=*/2.0);
  // Siblings of group 1 pile onto a: loads a−min go 1, 2, 3 before each placement.
  CHECK(place_ok(p, 1, 1) == "a"); // home chosen by round robin
  CHECK(place_ok(p, 2, 1) == "a"); // 1 − 0 = 1 ≤ 2
  CHECK(place_ok(p, 3, 1) == "a"); // 2 − 0 = 2 ≤ 2 (not strictly above)
  CHECK(place_ok(p, 4, 1) == "b"); // 3 − 0 = 3 > 2 → least loaded, tie b/c → b
  CHECK(place_ok(p, 5, 1) == "c"); // 3 − 0 > 2 → c (b has 1)
  CHECK(place_ok(p, 6, 1) == "a"); // 3 − 1 = 2 ≤ 2 → home again
  CHECK(p.stats().affinity_overrides == 2);
  CHECK(p.stats().affinity_hits == 3);
  CHECK(p.group_home(1) == std::optional<std::string>("a"));
}

TEST_CASE("a group whose home worker is lost picks a new home", "[placement]") {
  auto p = make(placement_policy::least_loaded, {"a", "b"}, true, 100.0);
  place_ok(p, 1, 3);
  place_ok(p, 2, 3);
  place_ok(p, 3, 4); // b
  auto orphans = p.worker_lost("a");
  CHECK(ids_of(orphans) == std::vector<uint64_t>{1, 2});
  CHECK(p.group_home(3) == std::nullopt);
  for (const auto& o : orphans)
    CHECK(place_ok(p, o.request_id, o.group_id, o.prompt_tokens) == "b");
  CHECK(p.group_home(3) == std::optional<std::string>("b"));
}

TEST_CASE("no live worker is a value with a clear error, not a throw", "[placement]") {
  placement p;
  auto r = p.place(42, 1, 10);
  CHECK_FALSE(r);
  CHECK(r.error.find("no live rollout worker") != std::string::npos);
  CHECK(r.error.find("42") != std::string::npos);
  p.join("a");
  p.worker_lost("a");
  CHECK_FALSE(p.place(42, 1, 10));
  CHECK(p.in_flight_total() == 0);
}

TEST_CASE("caller mistakes raise errors that name the values", "[placement]") {
  auto p = make(placement_policy::round_robin, {"a"});
  place_ok(p, 5);
  CHECK_THROWS_WITH(p.place(5, 0, 1), Catch::Contains("request 5 is already in flight"));
  CHECK_THROWS_WITH(p.place(6, 0, -3), Catch::Contains("prompt_tokens = -3"));
  CHECK_THROWS_WITH(p.complete(99), Catch::Contains("request 99 is not in flight"));
  p.complete(5);
  CHECK_THROWS_WITH(p.complete(5), Catch::Contains("request 5 is not in flight"));
  CHECK_THROWS_WITH(p.join("a"), Catch::Contains("'a' is already live"));
  CHECK_THROWS_AS(p.join(""), std::invalid_argument);
  CHECK_THROWS_WITH(p.worker_lost("ghost"), Catch::Contains("'ghost' is not live"));
  CHECK_THROWS_WITH(p.load("ghost"), Catch::Contains("'ghost' is not live"));
  placement_options bad;
  bad.imbalance_threshold = -1;
  CHECK_THROWS_AS(placement(bad), std::invalid_argument);
}

TEST_CASE("placement is deterministic for the same calls", "[placement]") {
  auto run = [] {
    auto p = make(placement_policy::least_loaded, {"x", "y", "z"}, true, 1.0);
    std::vector<std::string> out;
    for (uint64_t id = 0; id < 40; ++id) {
      out.push_back(place_ok(p, id, id / 4, static_cast<int64_t>(id % 5)));
      if (id % 3 == 0)
        p.complete(id);
    }
    return out;
  };
  CHECK(run() == run());
}

TEST_CASE("a restored placement continues round robin where the saved one stopped",
          "[placement]") {
  auto kept = make(placement_policy::round_robin, {"a", "b", "c"});
  CHECK(place_ok(kept, 1) == "a");
  CHECK(place_ok(kept, 2) == "b");
  auto restored = make(placement_policy::round_robin, {"a", "b", "c"});
  restore_placement_state(save_placement_state(kept), restored);
  CHECK(place_ok(kept, 3) == "c");
  CHECK(place_ok(restored, 3) == "c"); // a fresh placement would start at "a"
  CHECK(place_ok(restored, 4) == "a");

  for (const std::string bad : {"", "{\"format\":\"sorl.scheduler\",\"format_version\":1}",
                                "{\"format\":\"x\",\"format_version\":1,\"round_robin_last\":\"a\"}",
                                "{\"format\":\"sorl.scheduler\",\"format_version\":1,"
                                "\"round_robin_last\":7}"}) {
    INFO(bad);
    CHECK_THROWS_AS(restore_placement_state(bad, restored), std::invalid_argument);
  }
  CHECK(restored.round_robin_last() == "a"); // unchanged by the refused states
}

TEST_CASE("placement options come from [scheduler], with the config's defaults", "[placement]") {
  sorl::experiment_config cfg;
  const placement_options plain;
  const auto d = placement_options_from(cfg);
  CHECK(d.policy == plain.policy);
  CHECK(d.imbalance_threshold == plain.imbalance_threshold);
  CHECK(d.queued_token_weight == plain.queued_token_weight);
  CHECK(d.group_affinity); // the scheduler always keeps a group's siblings together
  cfg.scheduler.policy = sorl::placement_kind::least_loaded;
  cfg.scheduler.imbalance_threshold = 5.5;
  const auto o = placement_options_from(cfg);
  CHECK(o.policy == placement_policy::least_loaded);
  CHECK(o.imbalance_threshold == 5.5);
}
