// The scheduler's decisions without CAF (actors/scheduler/scheduler_core.hpp): where each
// request goes, what a lost worker's requests become, which finish events free a slot, and how
// aborts are split by worker. Workers "a", "b", "c" with round robin unless said otherwise, so
// every expected worker follows from the name order.

#include "actors/scheduler/scheduler_core.hpp"

// The scheduler's core and shell reach no libtorch header (see rollout_wire_test.cpp).
#ifdef C10_MACROS_MACROS_H_
#error "actors/scheduler/scheduler_core.hpp reaches a libtorch header"
#endif

#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

using namespace sorl;
using namespace sorl::scheduler;
using ids = std::vector<uint64_t>;

namespace {

scheduler_core with_workers(const std::vector<std::string>& workers,
                            placement_policy policy = placement_policy::round_robin) {
  placement_options o;
  o.policy = policy;
  o.group_affinity = true;
  scheduler_core core(o);
  for (const auto& w : workers)
    core.join(w);
  return core;
}

/// Request `id`, alone in group id + 100, with a value in every field.
rollout::rollout_request request(uint64_t id) {
  rollout::rollout_request r;
  r.request_id = id;
  r.step = 7;
  r.group_id = id + 100;
  r.sample_index = 2;
  r.split = ml::task_split::eval;
  r.task_index = 905;
  r.seed = 0xDEADBEEFull + id;
  r.weight_version = 6;
  r.max_new_tokens = 96;
  r.temperature = 0.7;
  r.top_p = 0.8;
  r.top_k = 20;
  return r;
}

rollout::event_record event(uint64_t id, const std::string& worker,
                            rollout::event_kind kind = rollout::event_kind::finish) {
  rollout::event_record e;
  e.event.request_id = id;
  e.event.kind = kind;
  e.worker = worker;
  return e;
}

/// "worker:id" of each send, with " from W" for a re-placed request.
std::vector<std::string> sends(const dispatch_result& d) {
  std::vector<std::string> out;
  for (const auto& s : d.sends)
    out.push_back(s.worker + ":" + std::to_string(s.request.request_id)
                  + (s.request.replaced_from.empty() ? "" : " from " + s.request.replaced_from));
  return out;
}

/// Submits each id and returns where it went.
std::vector<std::string> submit(scheduler_core& core, const ids& requests) {
  std::vector<std::string> out;
  for (auto id : requests) {
    auto d = core.submit(request(id));
    CHECK(d.failures.empty());
    CHECK(d.warnings.empty());
    for (auto& s : sends(d))
      out.push_back(s);
  }
  return out;
}

void check_same_fields(const rollout::rollout_request& got, const rollout::rollout_request& want) {
  CHECK(got.request_id == want.request_id);
  CHECK(got.step == want.step);
  CHECK(got.group_id == want.group_id);
  CHECK(got.sample_index == want.sample_index);
  CHECK(got.split == want.split);
  CHECK(got.task_index == want.task_index);
  CHECK(got.seed == want.seed);
  CHECK(got.weight_version == want.weight_version);
  CHECK(got.max_new_tokens == want.max_new_tokens);
  CHECK(got.temperature == want.temperature);
  CHECK(got.top_p == want.top_p);
  CHECK(got.top_k == want.top_k);
}

} // namespace

TEST_CASE("a request goes to the worker the placement picks with every field unchanged") {
  auto core = with_workers({"a", "b", "c"});
  auto d = core.submit(request(1));
  REQUIRE(d.sends.size() == 1);
  CHECK(d.sends[0].worker == "a");
  check_same_fields(d.sends[0].request, request(1));
  CHECK(d.sends[0].request.replaced_from.empty());
  CHECK(submit(core, {2, 3, 4}) == std::vector<std::string>{"b:2", "c:3", "a:4"});
  CHECK(core.held() == 4);
  // A second roster joins no one twice.
  core.join("a");
  CHECK(core.placement().workers() == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("a request submitted twice is placed once and the second is warned about") {
  auto core = with_workers({"a", "b"});
  CHECK(submit(core, {1}) == std::vector<std::string>{"a:1"});
  auto again = core.submit(request(1));
  CHECK(again.sends.empty());
  CHECK(again.failures.empty());
  CHECK(again.warnings == std::vector<std::string>{"request 1 submitted twice"});
  CHECK(core.held() == 1);
  CHECK(core.placement().in_flight("a") == 1);
  CHECK(core.placement().in_flight("b") == 0);
}

TEST_CASE("a lost worker's unfinished requests are placed again with replaced_from set") {
  auto core = with_workers({"a", "b", "c"});
  CHECK(submit(core, {1, 2, 3, 4, 5, 6}) ==
        std::vector<std::string>{"a:1", "b:2", "c:3", "a:4", "b:5", "c:6"});
  CHECK(core.on_event(event(4, "a")));
  auto d = core.worker_lost("a", "killed");
  // Only 1 was unfinished on a; round robin goes on after c, the last it chose.
  CHECK(sends(d) == std::vector<std::string>{"b:1 from a"});
  check_same_fields(d.sends[0].request, request(1));
  CHECK(d.failures.empty());
  CHECK(d.warnings == std::vector<std::string>{"a is gone (killed); re-placing 1 requests"});
  CHECK(core.placement().worker_of(1) == "b");
  CHECK(core.held() == 5);

  SECTION("losing its new worker too places it again, named after the latest loss") {
    auto again = core.worker_lost("b", "killed");
    CHECK(sends(again) == std::vector<std::string>{"c:1 from b", "c:2 from b", "c:5 from b"});
  }
  SECTION("a worker that is not live changes nothing") {
    auto none = core.worker_lost("a", "killed");
    CHECK(none.sends.empty());
    CHECK(none.failures.empty());
    CHECK(none.warnings.empty());
    CHECK(core.worker_lost("zz", "never joined").warnings.empty());
    CHECK(core.held() == 5);
  }
}

TEST_CASE("a late finish from a lost worker is ignored and the new worker's finish frees the slot") {
  auto core = with_workers({"a", "b", "c"});
  CHECK(submit(core, {1}) == std::vector<std::string>{"a:1"});
  CHECK(sends(core.worker_lost("a", "killed")) == std::vector<std::string>{"b:1 from a"});
  // a's finish, sent before it died, arrives after the news of its death.
  CHECK_FALSE(core.on_event(event(1, "a")));
  CHECK(core.held() == 1);
  CHECK(core.placement().worker_of(1) == "b");
  CHECK(core.placement().in_flight("b") == 1);
  CHECK(core.on_event(event(1, "b")));
  CHECK(core.held() == 0);
  CHECK(core.placement().in_flight("b") == 0);
  // Once finished, a repeated finish changes nothing.
  CHECK_FALSE(core.on_event(event(1, "b")));
}

TEST_CASE("start and chunk events free nothing, a finish frees its worker's slot") {
  auto core = with_workers({"a", "b"}, placement_policy::least_loaded);
  CHECK(submit(core, {1, 2}) == std::vector<std::string>{"a:1", "b:2"});
  CHECK_FALSE(core.on_event(event(1, "a", rollout::event_kind::start)));
  CHECK_FALSE(core.on_event(event(1, "a", rollout::event_kind::chunk)));
  CHECK(core.placement().in_flight("a") == 1);
  CHECK(core.on_event(event(1, "a")));
  CHECK(core.placement().in_flight("a") == 0);
  // Loads 0 and 1: the next request goes to a.
  CHECK(submit(core, {3}) == std::vector<std::string>{"a:3"});
}

TEST_CASE("an abort is split by the worker holding each id, unknown and finished ids dropped") {
  auto core = with_workers({"a", "b", "c"});
  CHECK(submit(core, {1, 2, 3, 4}) == std::vector<std::string>{"a:1", "b:2", "c:3", "a:4"});
  CHECK(core.on_event(event(3, "c")));
  auto d = core.abort(rollout::abort_request{7, {4, 3, 99, 2, 1}, "deadline"});
  REQUIRE(d.aborts.size() == 2);
  CHECK(d.aborts[0].worker == "a");
  CHECK(d.aborts[0].abort.request_ids == ids{4, 1});
  CHECK(d.aborts[1].worker == "b");
  CHECK(d.aborts[1].abort.request_ids == ids{2});
  for (const auto& a : d.aborts) {
    CHECK(a.abort.step == 7);
    CHECK(a.abort.reason == "deadline");
  }
  CHECK(d.sends.empty());
  // The abort itself frees nothing: the workers' abort finish events do.
  CHECK(core.held() == 3);
  CHECK(core.abort(rollout::abort_request{7, {3, 99}, "deadline"}).aborts.empty());
}

TEST_CASE("a request no live worker can take is a failure naming it, and it stays held") {
  SECTION("no worker has joined") {
    auto core = with_workers({});
    auto d = core.submit(request(5));
    CHECK(d.sends.empty());
    CHECK(d.failures == std::vector<std::string>{
                          "cannot place request 5: no live rollout worker to place request 5 "
                          "(group 105) on; keep it until a worker joins"});
    CHECK(core.held() == 1);
    // Its finish can never come from a worker; one that claims it frees nothing.
    CHECK_FALSE(core.on_event(event(5, "a")));
  }
  SECTION("the last worker is lost with requests in flight") {
    auto core = with_workers({"a"});
    CHECK(submit(core, {1, 2}) == std::vector<std::string>{"a:1", "a:2"});
    CHECK(core.on_event(event(1, "a")));
    auto d = core.worker_lost("a", "killed");
    CHECK(d.sends.empty());
    CHECK(d.failures == std::vector<std::string>{
                          "cannot place request 2: no live rollout worker to place request 2 "
                          "(group 102) on; keep it until a worker joins"});
    CHECK(d.warnings == std::vector<std::string>{"a is gone (killed); re-placing 1 requests"});
  }
}

TEST_CASE("the scheduler core's state round-trips and a corrupt one is refused by key") {
  auto core = with_workers({"a", "b", "c"});
  submit(core, {1, 2});
  const auto saved = core.save_state();
  CHECK(saved == R"({"format":"sorl.scheduler","format_version":1,"round_robin_last":"b"})");
  auto fresh = with_workers({"a", "b", "c"});
  CHECK(fresh.restore_state(saved).empty());
  CHECK(submit(fresh, {3}) == std::vector<std::string>{"c:3"});
  CHECK(fresh.restore_state("not json") == "scheduler state: not a JSON object");
  CHECK(fresh.save_state() ==
        R"({"format":"sorl.scheduler","format_version":1,"round_robin_last":"c"})");
}

namespace {

/// Task t's prompt: 64 tokens shared by its family t / 100, then 8 of its own.
std::vector<int32_t> family_prompt(uint64_t task) {
  if (task == 999)
    throw std::invalid_argument("no task 999");
  std::vector<int32_t> t;
  for (int i = 0; i < 64; ++i)
    t.push_back(static_cast<int32_t>(task / 100 * 1000 + i));
  for (int i = 0; i < 8; ++i)
    t.push_back(static_cast<int32_t>(task * 10 + i));
  return t;
}

rollout::rollout_request task_request(uint64_t id, uint64_t task, uint64_t version = 6) {
  rollout::rollout_request r;
  r.request_id = id;
  r.group_id = id + 100;
  r.task_index = task;
  r.weight_version = version;
  return r;
}

} // namespace

TEST_CASE("cache aware placement matches prompts, re-places a lost worker's episodes with their "
          "prefixes, and forgets them on new weights") {
  placement_options o;
  o.policy = placement_policy::cache_aware;
  o.group_affinity = true;
  std::vector<uint64_t> asked;
  scheduler_core core(o, [&](const rollout::rollout_request& r) {
    asked.push_back(r.task_index);
    return family_prompt(r.task_index);
  });
  core.join("a");
  core.join("b");
  auto place = [&](uint64_t id, uint64_t task, uint64_t version = 6) {
    auto d = core.submit(task_request(id, task, version));
    CHECK(d.failures.empty());
    CHECK(d.warnings.empty());
    REQUIRE(d.sends.size() == 1);
    return d.sends[0].worker;
  };
  CHECK(place(1, 100) == "a"); // nothing cached: least loaded, the first name
  CHECK(place(2, 200) == "b");
  CHECK(place(3, 101) == "a"); // family 1's 64 tokens of 72 are on a; loads 1 and 1
  CHECK(place(4, 201) == "b");
  CHECK(place(5, 102) == "a");
  CHECK(core.placement().stats().cache_routed == 3);

  // a dies mid-episode: its three episodes restart on b, which then holds family 1 as well.
  auto d = core.worker_lost("a", "killed");
  CHECK(sends(d) == std::vector<std::string>{"b:1 from a", "b:3 from a", "b:5 from a"});
  CHECK(core.held() == 5);
  const auto family1 = block_chain(family_prompt(100), 16);
  CHECK(core.placement().index("b").match(family1) == 4);
  CHECK(core.placement().index("b").size() == 8);

  // Newer weights: the workers dropped their caches, and so does the estimate.
  CHECK(place(7, 104, 7) == "b");
  CHECK(core.placement().index("b").size() == 4);
  // A prompt that cannot be built is placed all the same (its worker reports why).
  CHECK(place(8, 999, 7) == "b");
  CHECK(core.placement().index("b").size() == 4);
  // Each prompt was built once: a re-placement reuses the chain.
  CHECK(asked == ids{100, 200, 101, 201, 102, 104, 999});
  // A sibling right after its group's first request reuses its prompt too.
  auto sibling = task_request(9, 105, 7);
  CHECK(core.submit(sibling).sends.size() == 1);
  sibling.request_id = 10;
  auto d10 = core.submit(sibling);
  REQUIRE(d10.sends.size() == 1);
  CHECK(asked.size() == 8);
  CHECK(core.placement().index("b").match(family1) == 4);
}
