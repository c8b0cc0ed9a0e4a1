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
  const auto d = placement_options_from(cfg, 4096);
  CHECK(d.policy == plain.policy);
  CHECK(d.imbalance_threshold == plain.imbalance_threshold);
  CHECK(d.queued_token_weight == plain.queued_token_weight);
  CHECK(d.cache_threshold == plain.cache_threshold);
  CHECK(d.cache_imbalance_threshold == plain.cache_imbalance_threshold);
  CHECK(d.group_affinity); // the scheduler always keeps a group's siblings together
  cfg.scheduler.policy = sorl::placement_kind::least_loaded;
  cfg.scheduler.imbalance_threshold = 5.5;
  const auto o = placement_options_from(cfg, 4096);
  CHECK(o.policy == placement_policy::least_loaded);
  CHECK(o.imbalance_threshold == 5.5);
  CHECK(o.index_blocks == 4096);
  cfg.scheduler.policy = sorl::placement_kind::cache_aware;
  cfg.scheduler.cache_threshold = 0.6;
  cfg.scheduler.cache_imbalance_threshold = 7;
  const auto c = placement_options_from(cfg, 0);
  CHECK(c.policy == placement_policy::cache_aware);
  CHECK(c.cache_threshold == 0.6);
  CHECK(c.cache_imbalance_threshold == 7);
  CHECK(c.index_blocks == 0);
  cfg.scheduler.policy = sorl::placement_kind::sglang_cache_aware;
  CHECK(placement_options_from(cfg, 1).policy == placement_policy::sglang_cache_aware);
  CHECK_FALSE(placement_options_from(cfg, 1).group_affinity); // SGLang's rule has none
  CHECK(c.group_affinity);
}

// -- cache-aware placement ----------------------------------------------------------------

namespace {

/// `blocks` whole 16-token blocks of `family`'s tokens, then `tail` tokens of `tail_id`'s.
std::vector<int32_t> prompt(int32_t family, int blocks, int32_t tail_id = 0, int tail = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < blocks * 16; ++i)
    t.push_back(family * 1000 + i);
  for (int i = 0; i < tail; ++i)
    t.push_back(500000 + tail_id * 100 + i);
  return t;
}

/// Workers "a" and "b" under cache_aware with cache_imbalance_threshold = `threshold`.
placement cache_aware_with_threshold(double threshold) {
  placement_options o;
  o.policy = placement_policy::cache_aware;
  o.cache_imbalance_threshold = threshold;
  placement p(o);
  p.join("a");
  p.join("b");
  return p;
}

placement_request req(uint64_t id, const std::vector<int32_t>& tokens, uint64_t group = 0) {
  return {id, group == 0 ? id + 1000 : group, static_cast<int64_t>(tokens.size()),
          block_chain(tokens, 16)};
}

std::string place_req(placement& p, const placement_request& r) {
  auto got = p.place(r);
  REQUIRE(got);
  return *got.worker;
}

} // namespace

TEST_CASE("block chains name whole blocks and the whole path before them", "[placement]") {
  const auto a = block_chain(prompt(1, 3, 0, 5), 16);
  CHECK(a.size() == 3); // the 5-token partial block has no hash
  const auto b = block_chain(prompt(1, 2), 16);
  REQUIRE(b.size() == 2);
  CHECK(b[0] == a[0]);
  CHECK(b[1] == a[1]);
  // The same second block after a different first block is a different path.
  auto other = prompt(2, 1);
  const auto second = prompt(1, 2);
  other.insert(other.end(), second.begin() + 16, second.end());
  const auto c = block_chain(other, 16);
  CHECK(c[0] != a[0]);
  CHECK(c[1] != a[1]);
  CHECK(block_chain({1, 2, 3}, 16).empty());
  CHECK_THROWS_AS(block_chain({1}, 0), std::invalid_argument);
}

TEST_CASE("a prefix index matches leading blocks only and drops the least recent, deepest first",
          "[placement]") {
  prefix_index idx(4);
  const auto a = block_chain(prompt(1, 3), 16);
  const auto b = block_chain(prompt(2, 2), 16);
  idx.insert(a);
  CHECK(idx.match(a) == 3);
  CHECK(idx.match(block_chain(prompt(1, 3, 7, 32), 16)) == 3); // a longer prompt of a
  CHECK(idx.match(b) == 0);
  idx.insert(b); // 5 blocks > 4: a's deepest block goes
  CHECK(idx.size() == 4);
  CHECK(idx.match(a) == 2);
  CHECK(idx.match(b) == 2);
  // A prompt sharing only the first token, then diverging, matches nothing.
  auto diverging = prompt(1, 3);
  diverging[1] = -5;
  CHECK(idx.match(block_chain(diverging, 16)) == 0);
  idx.clear();
  CHECK(idx.size() == 0);
  CHECK(idx.match(a) == 0);
  prefix_index none(0);
  none.insert(a);
  CHECK(none.match(a) == 0);
  CHECK_THROWS_AS(prefix_index(-1), std::invalid_argument);
}

TEST_CASE("cache aware sends a prompt to the worker holding its longest prefix", "[placement]") {
  auto p = make(placement_policy::cache_aware, {"a", "b"});
  // Nothing cached: least loaded, ties to the first name.
  CHECK(place_req(p, req(1, prompt(1, 3))) == "a");
  CHECK(place_req(p, req(2, prompt(2, 3))) == "b");
  // Loads 1 and 1: the cached prefix decides; 48 of 64 tokens = 0.75 >= 0.3.
  CHECK(place_req(p, req(3, prompt(1, 3, 3, 16))) == "a");
  CHECK(place_req(p, req(4, prompt(2, 3, 4, 16))) == "b");
  CHECK(place_req(p, req(5, prompt(2, 3, 5, 16))) == "b"); // loads 2 and 2
  CHECK(p.stats().cache_routed == 3);
  CHECK(p.stats().cache_balanced == 0);
  // The estimated cached tokens on the chosen workers: 0 + 0 + 48 + 48 + 48 (request 5's tail
  // block differs from request 4's) of 48 + 48 + 64 × 3 prompt tokens.
  CHECK(p.stats().matched_tokens == 48 + 48 + 48);
  CHECK(p.stats().prompt_tokens == 48 + 48 + 64 * 3);
  CHECK(p.index("a").match(block_chain(prompt(1, 3, 3, 16), 16)) == 4);
}

TEST_CASE("cache aware needs the prefix to cover cache_threshold of the prompt", "[placement]") {
  auto p = make(placement_policy::cache_aware, {"a", "b"});
  CHECK(place_req(p, req(1, prompt(1, 1))) == "a");
  // 16 cached of 64 = 0.25 < 0.3: least loaded (b) instead of a.
  CHECK(place_req(p, req(2, prompt(1, 1, 2, 48))) == "b");
  // 16 of 48 = 0.33 >= 0.3: both hold that block now, loads 1 and 1: the name first, a.
  CHECK(place_req(p, req(3, prompt(1, 1, 3, 32))) == "a");
  CHECK(p.stats().cache_routed == 1);
}

TEST_CASE("cache aware yields to the least loaded past the imbalance threshold", "[placement]") {
  auto p = cache_aware_with_threshold(2.0);
  CHECK(place_req(p, req(1, prompt(1, 4))) == "a");
  p.join("c");
  // b and c idle: the prefix on a wins while a's load exceeds theirs by at most 2.
  CHECK(place_req(p, req(2, prompt(1, 4, 2, 8))) == "a");
  CHECK(place_req(p, req(3, prompt(1, 4, 3, 8))) == "a");
  // a: 3, b: 0 → 3 > 2: b, which then holds the prefix as well.
  CHECK(place_req(p, req(4, prompt(1, 4, 4, 8))) == "b");
  CHECK(p.stats().cache_balanced == 1);
  CHECK(p.index("b").match(block_chain(prompt(1, 4), 16)) == 4);
  // Both hold it; b is less loaded (1 against 3).
  CHECK(place_req(p, req(5, prompt(1, 4, 5, 8))) == "b");
  p.complete(1);
  p.complete(2);
  p.complete(3); // a: 0, b: 2, c: 0 — a holds the prefix and is the least loaded
  CHECK(place_req(p, req(6, prompt(1, 4, 6, 8))) == "a");
}

TEST_CASE("cache aware keeps a group's siblings on its home and forgets on a weight change",
          "[placement]") {
  auto p = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
  const auto shared = prompt(3, 2);
  CHECK(place_req(p, req(1, shared, 7)) == "a");
  CHECK(place_req(p, req(2, shared, 7)) == "a"); // sibling: affinity, not a lookup
  CHECK(p.stats().affinity_hits == 1);
  CHECK(place_req(p, req(3, prompt(4, 2))) == "b");
  p.weights_changed();
  CHECK(p.index("a").size() == 0);
  CHECK(p.index("b").size() == 0);
  // Loads a: 2, b: 1 and nothing cached any more: least loaded.
  CHECK(place_req(p, req(4, prompt(3, 2, 4, 4))) == "b");
}

TEST_CASE("a worker lost mid-episode: its requests are re-placed with their prefixes",
          "[placement]") {
  auto p = make(placement_policy::cache_aware, {"a", "b"});
  CHECK(place_req(p, req(1, prompt(1, 3))) == "a");
  CHECK(place_req(p, req(2, prompt(2, 3))) == "b");
  const auto orphans = p.worker_lost("a");
  REQUIRE(orphans.size() == 1);
  CHECK(orphans[0].request_id == 1);
  CHECK(place_req(p, req(1, prompt(1, 3))) == "b");
  CHECK(p.index("b").match(block_chain(prompt(1, 3), 16)) == 3);
  CHECK_THROWS_AS(p.index("a"), std::invalid_argument);
}

TEST_CASE("SGLang's rule: prefix above 0.3, else the smallest tree, balance only past 64 and 1.5x",
          "[placement]") {
  auto p = make(placement_policy::sglang_cache_aware, {"a", "b"});
  CHECK(place_req(p, req(1, prompt(1, 4))) == "a"); // both trees empty: the first name
  CHECK(place_req(p, req(2, prompt(2, 1))) == "b"); // no match: the smallest tree (a: 4, b: 0)
  // No match: the smallest tree (a: 4 blocks, b: 1), although both run one request.
  CHECK(place_req(p, req(3, prompt(5, 1))) == "b");
  // 16 of 64 tokens match on a (0.25, not above 0.3): the smallest tree (b: 2 blocks).
  CHECK(place_req(p, req(4, prompt(1, 1, 4, 48))) == "b");
  CHECK(p.index("a").size() == 4);
  CHECK(p.index("b").size() == 6);
  // Matches follow the tree whatever the load, below the balance thresholds.
  for (uint64_t id = 10; id < 10 + 66; ++id)
    CHECK(place_req(p, req(id, prompt(1, 4, static_cast<int32_t>(id), 4))) == "a");
  CHECK(p.in_flight("a") == 67);
  CHECK(p.in_flight("b") == 3);
  // 67 - 3 = 64, not > 64: still a.
  CHECK(place_req(p, req(80, prompt(1, 4, 80, 4))) == "a");
  CHECK(p.stats().cache_balanced == 0);
  // 68 - 3 = 65 > 64 and 68 > 1.5 × 3: the least loaded, although a holds the prefix.
  CHECK(place_req(p, req(81, prompt(1, 4, 81, 4))) == "b");
  CHECK(p.stats().cache_balanced == 1);
  CHECK(p.stats().cache_routed == 67);
}

TEST_CASE("placement refuses cache options outside their ranges", "[placement]") {
  placement_options o;
  o.cache_threshold = 1.5;
  CHECK_THROWS_AS(placement(o), std::invalid_argument);
  o.cache_threshold = 0.3;
  o.block_size = 0;
  CHECK_THROWS_AS(placement(o), std::invalid_argument);
  o.block_size = 16;
  o.index_blocks = -1;
  CHECK_THROWS_AS(placement(o), std::invalid_argument);
  o.index_blocks = 0;
  o.cache_imbalance_threshold = -1;
  CHECK_THROWS_AS(placement(o), std::invalid_argument);
}

TEST_CASE("cache aware sends a new prefix where the cache has room, within the imbalance threshold",
          "[placement]") {
  auto p = cache_aware_with_threshold(2.0);
  CHECK(place_req(p, req(1, prompt(1, 1))) == "a"); // a: 1 block
  CHECK(place_req(p, req(2, prompt(2, 6))) == "b"); // b: 6 blocks
  p.complete(1);
  // a is idle, b runs one; a prompt of a new family goes to a, whose index is smaller.
  CHECK(place_req(p, req(3, prompt(3, 2))) == "a"); // a: 3 blocks, load 1
  // a new family: a holds 3 blocks, b 6, loads 1 and 1: a.
  CHECK(place_req(p, req(4, prompt(4, 2))) == "a"); // a: 5 blocks, load 2
  CHECK(place_req(p, req(5, prompt(5, 2))) == "a"); // a: 7 blocks, load 3; b: load 1
  // a's index is now the larger: b.
  CHECK(place_req(p, req(6, prompt(6, 1))) == "b"); // b: 7 blocks, load 2
  // Equal indexes (7 and 7): the less loaded, b (2 against 3).
  CHECK(place_req(p, req(7, prompt(7, 1))) == "b"); // b: 8 blocks, load 3
  CHECK(place_req(p, req(8, prompt(8, 1))) == "a"); // a: 8 blocks, load 4
  CHECK(place_req(p, req(9, prompt(9, 6))) == "b"); // equal: the less loaded (3 against 4)
  CHECK(place_req(p, req(10, prompt(10, 1))) == "a"); // a: 8 against b: 14 blocks
  CHECK(place_req(p, req(11, prompt(11, 1))) == "a"); // a: 9, load 5 against b: 4
  CHECK(place_req(p, req(12, prompt(12, 1))) == "a"); // a: 10, load 6 against 4: within 2
  // a: load 7 against b: 4, 3 > 2: the roomier a is passed over for b.
  CHECK(place_req(p, req(13, prompt(13, 1))) == "b");
  CHECK(p.stats().cache_routed == 0);
}

TEST_CASE("cache aware is work-conserving: an idle worker takes a request past imbalance_threshold",
          "[placement]") {
  // Default cache_imbalance_threshold (64): a prefix alone would keep every request below on
  // the worker that cached it first.
  auto p = make(placement_policy::cache_aware, {"a", "b"});
  CHECK(place_req(p, req(1, prompt(1, 4))) == "a");
  CHECK(place_req(p, req(2, prompt(1, 4, 2, 8))) == "a"); // a: 1, b idle: 1 <= 2
  CHECK(place_req(p, req(3, prompt(1, 4, 3, 8))) == "a"); // a: 2, b idle: 2 <= 2
  // a: 3 > 2 with b idle: b, although the prefix is on a and within 64.
  CHECK(place_req(p, req(4, prompt(1, 4, 4, 8))) == "b");
  CHECK(p.stats().cache_balanced == 1);
  // b now holds the prefix too: equal matches go to the less loaded (b: 1 against a: 3).
  CHECK(place_req(p, req(5, prompt(1, 4, 5, 8))) == "b");
  CHECK(place_req(p, req(6, prompt(1, 4, 6, 8))) == "b"); // 2 against 3
  CHECK(place_req(p, req(7, prompt(1, 4, 7, 8))) == "a"); // 3 against 3: the name first
  CHECK(p.stats().cache_routed == 5);

  // A worker that runs anything is not idle: the prefix keeps deciding within 64.
  auto q = make(placement_policy::cache_aware, {"a", "b"});
  CHECK(place_req(q, req(1, prompt(1, 4))) == "a");
  CHECK(place_req(q, req(2, prompt(2, 4))) == "b"); // a new prefix: the roomier b
  for (uint64_t id = 3; id < 3 + 20; ++id)
    CHECK(place_req(q, req(id, prompt(1, 4, static_cast<int32_t>(id), 8))) == "a");
  CHECK(q.in_flight("a") == 21);
  CHECK(q.in_flight("b") == 1);
  CHECK(q.stats().cache_balanced == 0);
  // Once b has finished its request it is idle, and a runs 21 > 2 more: b.
  q.complete(2);
  CHECK(place_req(q, req(30, prompt(1, 4, 30, 8))) == "b");
  CHECK(q.stats().cache_balanced == 1);
}

TEST_CASE("cache aware: an idle worker takes a new prefix the roomier worker would overload",
          "[placement]") {
  auto p = make(placement_policy::cache_aware, {"a", "b"});
  CHECK(place_req(p, req(1, prompt(1, 1))) == "a"); // a: 1 block
  CHECK(place_req(p, req(2, prompt(2, 6))) == "b"); // b: 6 blocks
  p.complete(2);                                     // b idle with the larger index
  CHECK(place_req(p, req(3, prompt(3, 1))) == "a");  // a: 2 blocks, load 2
  CHECK(place_req(p, req(4, prompt(4, 1))) == "a");  // a: 3 blocks, load 3 (2 <= 2 before it)
  // a is still the roomier (3 blocks against 6) but runs 3 > 2 with b idle: b.
  CHECK(place_req(p, req(5, prompt(5, 1))) == "b");
  CHECK(p.stats().cache_routed == 0);
}

TEST_CASE("cache aware splits a step of groups sharing instructions over both workers",
          "[placement]") {
  // 4 groups x 8 rollouts whose prompts are 3 blocks of shared instructions and one block of
  // their own, submitted at once (nothing completes), group affinity on, default thresholds.
  // Hand trace: group 1 -> a with all its siblings (affinity within 64); group 2 matches the
  // instructions on a only, but a runs 8 > 2 with b idle: b, which then holds them too; group
  // 3 matches 3 blocks on both at loads 8 and 8: the name first, a; group 4 the less loaded b.
  auto p = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
  const std::vector<std::string> home = {"a", "b", "a", "b"};
  for (uint64_t g = 0; g < 4; ++g)
    for (uint64_t s = 0; s < 8; ++s) {
      const uint64_t id = g * 8 + s + 1;
      CHECK(place_req(p, req(id, prompt(7, 3, static_cast<int32_t>(g), 16), g + 1)) == home[g]);
    }
  CHECK(p.in_flight("a") == 16);
  CHECK(p.in_flight("b") == 16);
  CHECK(p.stats().affinity_hits == 28);
  CHECK(p.stats().affinity_overrides == 0);
  CHECK(p.stats().cache_balanced == 1);
  CHECK(p.stats().cache_routed == 2);

  // SGLang's rule on the same step keeps all 32 on a (no balance below 64).
  auto s = make(placement_policy::sglang_cache_aware, {"a", "b"});
  for (uint64_t g = 0; g < 4; ++g)
    for (uint64_t i = 0; i < 8; ++i)
      CHECK(place_req(s, req(g * 8 + i + 1, prompt(7, 3, static_cast<int32_t>(g), 16), g + 1))
            == "a");
}

TEST_CASE("cache aware keeps a group's siblings on its home while another worker idles", "[placement]") {
  auto p = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
  // One group of 8: its siblings stay on the home within cache_imbalance_threshold (64), b idle.
  for (uint64_t id = 1; id <= 8; ++id)
    CHECK(place_req(p, req(id, prompt(2, 4), 9)) == "a");
  CHECK(p.in_flight("b") == 0);
  CHECK(p.stats().affinity_hits == 7);
}

TEST_CASE("cache aware balances a group's siblings once the prefill a move adds is at most a "
          "rollout's generation", "[placement]") {
  // One group of 8 with a 64-token prompt, nothing cached on b, default thresholds. With an
  // estimate of 64 generated tokens, moving a sibling to b re-prefills 64 <= 64 tokens: the
  // siblings balance as under least_loaded past imbalance_threshold (2). Hand trace of
  // (load a, load b) before each placement: (0,0) a; (1,0) a; (2,0) a; (3,0) 3 > 2: b, which
  // now holds the prompt; (3,1) a; (4,1) b; (4,2) a; (5,2) b.
  auto p = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
  p.observe_generation(64);
  const std::vector<std::string> split = {"a", "a", "a", "b", "a", "b", "a", "b"};
  for (uint64_t id = 1; id <= 8; ++id)
    CHECK(place_req(p, req(id, prompt(2, 4), 9)) == split[id - 1]);
  CHECK(p.in_flight("a") == 5);
  CHECK(p.in_flight("b") == 3);
  CHECK(p.stats().affinity_overrides == 3);

  // One token fewer expected than the move would prefill: the group stays home, as before
  // any rollout finished (a long shared prompt with short answers: route_bench's traces).
  for (const std::optional<int64_t> generated : {std::optional<int64_t>{63}, std::optional<int64_t>{}}) {
    auto q = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
    if (generated)
      q.observe_generation(*generated);
    for (uint64_t id = 1; id <= 8; ++id)
      CHECK(place_req(q, req(id, prompt(2, 4), 9)) == "a");
    CHECK(q.stats().affinity_overrides == 0);
  }

  // What the other worker already caches counts. Both come to hold family 5's 96-token
  // prefix: group 50 (3 siblings) on a, then group 51's first on b by idle relief (a runs
  // 3 > 2) and its other 3 with it (a 3, b 4). Group 52's 112-token prompt (the prefix and 16
  // tokens of its own) matches 6 blocks on both: the less loaded a is its home; siblings 2-4
  // stay (a 7, b 4); the 5th, at 3 > 2, re-prefills only 16 tokens on b.
  for (const int64_t generated : {int64_t{16}, int64_t{15}}) {
    INFO("generation estimate " << generated);
    auto c = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
    c.observe_generation(generated);
    for (uint64_t id = 100; id < 103; ++id)
      CHECK(place_req(c, req(id, prompt(5, 6), 50)) == "a");
    for (uint64_t id = 110; id < 114; ++id)
      CHECK(place_req(c, req(id, prompt(5, 6), 51)) == "b");
    for (uint64_t id = 120; id < 124; ++id)
      CHECK(place_req(c, req(id, prompt(5, 6, 52, 16), 52)) == "a");
    CHECK(place_req(c, req(124, prompt(5, 6, 52, 16), 52)) == (generated == 16 ? "b" : "a"));
  }
}

TEST_CASE("the generation estimate is a moving average that a restored placement keeps",
          "[placement]") {
  auto p = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
  CHECK_FALSE(p.generation_estimate());
  p.observe_generation(100);
  CHECK(p.generation_estimate() == 100.0);
  p.observe_generation(200);
  CHECK(p.generation_estimate() == 106.25); // 100 + (200 - 100) / 16
  CHECK_THROWS_AS(p.observe_generation(-1), std::invalid_argument);
  CHECK(p.generation_estimate() == 106.25);

  auto restored = make(placement_policy::cache_aware, {"a", "b"}, true, 2.0);
  restore_placement_state(save_placement_state(p), restored);
  CHECK(restored.generation_estimate() == 106.25);
  // A state saved before any finish (or by an older build) carries no estimate.
  restore_placement_state(
    R"({"format":"sorl.scheduler","format_version":1,"round_robin_last":""})", restored);
  CHECK_FALSE(restored.generation_estimate());
  for (const std::string bad :
       {R"({"format":"sorl.scheduler","format_version":1,"round_robin_last":"","generation_estimate":-2})",
        R"({"format":"sorl.scheduler","format_version":1,"round_robin_last":"","generation_estimate":"9"})"}) {
    INFO(bad);
    CHECK_THROWS_WITH(restore_placement_state(bad, p),
                      Catch::Contains("'generation_estimate'"));
  }
  CHECK(p.generation_estimate() == 106.25); // unchanged by the refused states
  CHECK_THROWS_AS(p.restore_generation_estimate(-1.0), std::invalid_argument);
}
