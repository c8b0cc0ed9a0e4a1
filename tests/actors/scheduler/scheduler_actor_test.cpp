// The scheduler actor shell with its rollout workers, trainer and directory played by the
// test: requests land on the worker the configured policy picks (siblings of a group stay
// together until the imbalance threshold is passed), finish events free a worker's slot, the
// unfinished requests of a lost worker are placed again and marked with its name, aborts reach
// only the workers holding those ids, and the placement state survives a checkpoint round trip.
//
// Deterministic without sleeps: after a batch of messages the test asks the scheduler for its
// role state; once the answer is back, everything the scheduler sent before it already sits in
// the workers' mailboxes, which the test then reads without waiting.

#include <catch2/catch.hpp>

#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/scheduler/scheduler_actor.hpp"
#include "messages/rollout.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using sorl::test::expect;
using sorl::test::test_context;
using sorl::test::test_system_config;
using namespace std::chrono_literals;
using strings = std::vector<std::string>;

namespace {

envelope request(uint64_t id, uint64_t group, uint64_t task = 0) {
  return build_envelope<msg::GenerateRequest>([&](msg::GenerateRequest::Builder b) {
    b.setRequestId(id);
    b.setGroupId(group);
    b.setTaskIndex(task);
    b.setGroupSize(4);
    b.setMaxNewTokens(8);
  });
}

envelope finish(uint64_t id, const std::string& worker) {
  return build_envelope<msg::RolloutEvent>([&](msg::RolloutEvent::Builder b) {
    b.setRequestId(id);
    b.setKind(msg::EventKind::FINISH);
    b.setWorker(worker);
  });
}

envelope start(uint64_t id, const std::string& worker) {
  return build_envelope<msg::RolloutEvent>([&](msg::RolloutEvent::Builder b) {
    b.setRequestId(id);
    b.setKind(msg::EventKind::START);
    b.setWorker(worker);
  });
}

envelope restore(const std::string& state) {
  return build_envelope<msg::RoleStateRestore>([&](msg::RoleStateRestore::Builder b) {
    b.setState(state);
    b.setSource("test");
  });
}

/// One line per envelope: "request 3", "request 3 from W" (re-placed from W),
/// "abort step 7 [1 4] deadline", or "other".
std::string describe_received(const envelope& e) {
  std::string out = "other";
  if (e.schema_id() == capnp::typeId<msg::GenerateRequest>())
    CHECK_FALSE(with_envelope<msg::GenerateRequest>(e, [&](msg::GenerateRequest::Reader r) {
      out = fmt::format("request {}", r.getRequestId());
      if (r.getReplacedFrom().size() > 0)
        out += fmt::format(" from {}", r.getReplacedFrom().cStr());
    }));
  if (e.schema_id() == capnp::typeId<msg::AbortRollouts>())
    CHECK_FALSE(with_envelope<msg::AbortRollouts>(e, [&](msg::AbortRollouts::Reader a) {
      std::vector<uint64_t> ids;
      for (auto id : a.getRequestIds())
        ids.push_back(id);
      out = fmt::format("abort step {} [{}] {}", a.getStep(), fmt::join(ids, " "),
                        a.getReason().cStr());
    }));
  return out;
}

/// A scheduler with `workers` rollout workers "rollout_worker#i@test" played by scoped actors;
/// `self` is the trainer and the directory. The scheduler is stopped at the end of the test.
struct scheduler_harness {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::deque<caf::scoped_actor> workers;
  experiment_config exp;
  caf::actor scheduler;
  std::vector<peer_info> roster;

  scheduler_harness(placement_kind policy, int n_workers, double threshold = 2.0,
                    const std::string& jsonl = "") {
    exp.scheduler.policy = policy;
    exp.scheduler.imbalance_threshold = threshold;
    if (!jsonl.empty()) {
      exp.task.name = "jsonl";
      exp.task.path = jsonl;
      exp.task.eval_fraction = 0.0;
    }
    auto me = caf::actor_cast<caf::actor>(self);
    scheduler = spawn_scheduler(sys, test_context(exp, "scheduler", me));
    roster.push_back({"trainer", 0, "test", me});
    roster.push_back({"scheduler", 0, "test", scheduler});
    for (int i = 0; i < n_workers; ++i) {
      workers.emplace_back(sys);
      roster.push_back({"rollout_worker", i, "test", caf::actor_cast<caf::actor>(workers.back())});
    }
    self->send(scheduler, roster_atom::value, roster);
  }
  ~scheduler_harness() {
    self->send_exit(scheduler, caf::exit_reason::user_shutdown);
  }

  static std::string name(int i) {
    return fmt::format("rollout_worker#{}@test", i);
  }
  const peer_info& worker_info(int i) const {
    return roster.at(static_cast<size_t>(i) + 2);
  }
  void send(const envelope& e) {
    self->send(scheduler, e);
  }
  /// Requests `ids`, each the only member of its own group (group = id + 100).
  void send_requests(std::initializer_list<uint64_t> ids) {
    for (auto id : ids)
      send(request(id, id + 100));
  }
  /// The scheduler's placement state, which is also the barrier: once it is back, the
  /// scheduler has handled (and sent on) everything the test sent before.
  std::string state() {
    send(build_envelope<msg::RoleStateQuery>([](msg::RoleStateQuery::Builder b) { b.setStep(3); }));
    std::string out;
    expect<msg::RoleState>(self, [&](msg::RoleState::Reader s) {
      CHECK(s.getStep() == 3);
      CHECK(std::string{s.getRole().cStr()} == "scheduler");
      CHECK(s.getOk());
      out = s.getState().cStr();
    });
    return out;
  }
  /// What worker `i` holds in its mailbox, in arrival order, without waiting.
  strings received(int i) {
    strings got;
    for (bool more = true; more;)
      workers.at(static_cast<size_t>(i))
        ->receive([&](const envelope& e) { got.push_back(describe_received(e)); },
                  caf::after(0s) >> [&] { more = false; });
    return got;
  }
  /// Every worker's mailbox after a barrier.
  std::vector<strings> placed() {
    state();
    std::vector<strings> out;
    for (int i = 0; i < static_cast<int>(workers.size()); ++i)
      out.push_back(received(i));
    return out;
  }
};

/// Waits for the job end the scheduler asks the directory (`self`) for; returns its reason.
std::string expect_job_failure(caf::scoped_actor& self) {
  std::string why;
  for (bool found = false; !found;)
    self->receive([&](const envelope&) {},
                  [&](shutdown_atom, bool ok, const std::string& reason) {
                    CHECK_FALSE(ok);
                    why = reason;
                    found = true;
                  },
                  caf::after(20s) >> [&] { FAIL("the scheduler did not end the job"); });
  return why;
}

} // namespace

TEST_CASE("the scheduler places each request on the worker its policy picks") {
  SECTION("round robin cycles through the workers in name order whatever their load") {
    scheduler_harness h(placement_kind::round_robin, 3);
    h.send_requests({1, 2, 3});
    CHECK(h.placed() == std::vector<strings>{{"request 1"}, {"request 2"}, {"request 3"}});
    // Workers 1 and 2 are idle now and worker 0 still runs request 1: round robin does not care.
    h.send(finish(2, h.name(1)));
    h.send(finish(3, h.name(2)));
    h.send_requests({4, 5});
    CHECK(h.placed() == std::vector<strings>{{"request 4"}, {"request 5"}, {}});
  }
  SECTION("least loaded sends a request to the worker with the fewest unfinished requests") {
    scheduler_harness h(placement_kind::least_loaded, 3);
    h.send_requests({1, 2, 3});
    // All idle: ties go to the name that sorts first, then each load of 1 pushes on.
    CHECK(h.placed() == std::vector<strings>{{"request 1"}, {"request 2"}, {"request 3"}});
    // Start events leave the load alone; finish events free the slot.
    h.send(start(1, h.name(0)));
    h.send(finish(2, h.name(1)));
    h.send(finish(3, h.name(2)));
    h.send_requests({4, 5, 6});
    // Loads 1 0 0 → worker 1; 1 1 0 → worker 2; 1 1 1 → worker 0 (the tie).
    CHECK(h.placed() == std::vector<strings>{{"request 6"}, {"request 4"}, {"request 5"}});
    h.send(finish(1, h.name(0)));
    h.send(finish(6, h.name(0)));
    h.send(finish(4, h.name(1)));
    h.send_requests({7, 8});
    // Loads 0 0 1 → worker 0; 1 0 1 → worker 1.
    CHECK(h.placed() == std::vector<strings>{{"request 7"}, {"request 8"}, {}});
  }
  SECTION("the siblings of a group stay on one worker until the imbalance threshold is passed") {
    scheduler_harness h(placement_kind::round_robin, 3, 2.0);
    // Group 10, five siblings: the home worker 0 takes three; before the fourth its load (3)
    // exceeds the least loaded one's (0) by more than 2, so the fourth goes to worker 1, and the
    // fifth to worker 2 (home 3 vs 0 again; worker 2 is now the least loaded).
    for (uint64_t id = 1; id <= 5; ++id)
      h.send(request(id, 10));
    // A new group starts where round robin left off (worker 0 was its last choice).
    h.send(request(6, 11));
    h.send(request(7, 11));
    CHECK(h.placed() == std::vector<strings>{{"request 1", "request 2", "request 3"},
                                             {"request 4", "request 6", "request 7"},
                                             {"request 5"}});
  }
}

TEST_CASE("cache aware: the scheduler builds each prompt as its worker will and follows its prefix") {
  // Tasks 0 and 1 share a 64-token start (<|bos|> and 63 bytes), tasks 2 and 3 another.
  const auto path = std::filesystem::temp_directory_path() / "sorl_scheduler_cache_aware.jsonl";
  const std::string a(63, 'a'), b(63, 'b');
  std::ofstream{path} << "{\"prompt\": \"" << a << "1+1=\", \"answer\": \"2\"}\n"
                      << "{\"prompt\": \"" << a << "2+2=\", \"answer\": \"4\"}\n"
                      << "{\"prompt\": \"" << b << "3+3=\", \"answer\": \"6\"}\n"
                      << "{\"prompt\": \"" << b << "4+4=\", \"answer\": \"8\"}\n";
  for (const auto policy : {placement_kind::least_loaded, placement_kind::cache_aware}) {
    INFO(to_string(policy));
    scheduler_harness h(policy, 2, 2.0, path.string());
    // Tasks in the order 0, 2, 3, 1, each its own group. Least loaded alternates by load (ties
    // to worker 0): 0 → 0, 2 → 1, 3 → 0, 1 → 1. Cache aware: 0 → 0; 2 (no prefix) → 1, whose
    // index is empty; 3 → 1 and 1 → 0, where their starts are.
    h.send(request(1, 101, 0));
    h.send(request(2, 102, 2));
    h.send(request(3, 103, 3));
    h.send(request(4, 104, 1));
    if (policy == placement_kind::least_loaded)
      CHECK(h.placed() == std::vector<strings>{{"request 1", "request 3"}, {"request 2", "request 4"}});
    else
      CHECK(h.placed() == std::vector<strings>{{"request 1", "request 4"}, {"request 2", "request 3"}});
  }
  std::filesystem::remove(path);
}

TEST_CASE(
  "the scheduler moves a lost worker's requests, forwards aborts, and ends a job with no worker") {
  SECTION("a lost worker's unfinished requests are placed again, marked with its name") {
    scheduler_harness h(placement_kind::round_robin, 3);
    h.send_requests({1, 2, 3, 4, 5, 6});
    CHECK(h.placed() == std::vector<strings>{{"request 1", "request 4"},
                                             {"request 2", "request 5"},
                                             {"request 3", "request 6"}});
    h.send(finish(4, h.name(0)));
    h.self->send(h.scheduler, peer_down_atom::value, h.worker_info(0), std::string{"killed"});
    // Only request 1 was unfinished on worker 0; round robin goes on after worker 2.
    CHECK(h.placed() == std::vector<strings>{{}, {"request 1 from rollout_worker#0@test"}, {}});
    // A lost member of another role does not disturb placement.
    h.self->send(h.scheduler, peer_down_atom::value, h.roster.at(0), std::string{"gone"});
    h.send_requests({7, 8});
    CHECK(h.placed() == std::vector<strings>{{}, {"request 8"}, {"request 7"}});
  }
  SECTION("a late finish from a lost worker does not free the slot of the request's new worker") {
    scheduler_harness h(placement_kind::round_robin, 3);
    h.send_requests({1});
    CHECK(h.placed() == std::vector<strings>{{"request 1"}, {}, {}});
    h.self->send(h.scheduler, peer_down_atom::value, h.worker_info(0), std::string{"killed"});
    CHECK(h.placed() == std::vector<strings>{{}, {"request 1 from rollout_worker#0@test"}, {}});
    // Worker 0's finish, sent before it died, arrives after the news of its death.
    h.send(finish(1, h.name(0)));
    // Request 1 still runs on worker 1, so losing worker 1 places it again.
    h.self->send(h.scheduler, peer_down_atom::value, h.worker_info(1), std::string{"killed"});
    CHECK(h.placed() == std::vector<strings>{{}, {}, {"request 1 from rollout_worker#1@test"}});
  }
  SECTION("an abort reaches only the workers holding those requests, with the ids they hold") {
    scheduler_harness h(placement_kind::round_robin, 3);
    h.send_requests({1, 2, 3, 4});
    CHECK(h.placed() ==
          std::vector<strings>{{"request 1", "request 4"}, {"request 2"}, {"request 3"}});
    h.send(finish(3, h.name(2)));
    // 3 has finished and 99 was never requested: neither is forwarded.
    h.send(build_envelope<msg::AbortRollouts>([](msg::AbortRollouts::Builder b) {
      b.setStep(7);
      auto ids = b.initRequestIds(4);
      ids.set(0, 4);
      ids.set(1, 3);
      ids.set(2, 99);
      ids.set(3, 1);
      b.setReason("deadline");
    }));
    CHECK(h.placed() == std::vector<strings>{{"abort step 7 [4 1] deadline"}, {}, {}});
  }
  SECTION("a request that arrives with no live worker ends the job with a reason") {
    scheduler_harness h(placement_kind::round_robin, 0);
    h.send(request(5, 9));
    CHECK(expect_job_failure(h.self) ==
          "cannot place request 5: no live rollout worker to place request 5 (group 9) on; keep "
          "it until a worker joins");
  }
  SECTION("losing the last worker with requests in flight ends the job with a reason") {
    scheduler_harness h(placement_kind::round_robin, 1);
    h.send_requests({1, 2});
    h.send(finish(1, h.name(0)));
    CHECK(h.placed() == std::vector<strings>{{"request 1", "request 2"}});
    h.self->send(h.scheduler, peer_down_atom::value, h.worker_info(0), std::string{"killed"});
    CHECK(expect_job_failure(h.self) ==
          "cannot place request 2: no live rollout worker to place request 2 (group 102) on; keep "
          "it until a worker joins");
  }
}

TEST_CASE("the scheduler's placement state round-trips, and a corrupt one is refused by key") {
  SECTION("the scheduler's state round-trips through RoleState and RoleStateRestore") {
    std::string saved;
    {
      scheduler_harness h(placement_kind::round_robin, 3);
      CHECK(h.state() == R"({"format":"sorl.scheduler","format_version":1,"round_robin_last":""})");
      h.send_requests({1, 2});
      saved = h.state();
      CHECK(
        saved ==
        R"({"format":"sorl.scheduler","format_version":1,"round_robin_last":"rollout_worker#1@test"})");
    }
    // A fresh scheduler restored from it goes on after worker 1.
    scheduler_harness h(placement_kind::round_robin, 3);
    h.send(restore(saved));
    expect<msg::RoleStateRestored>(h.self, [](msg::RoleStateRestored::Reader r) {
      CHECK(std::string{r.getRole().cStr()} == "scheduler");
      CHECK(r.getOk());
      CHECK(std::string{r.getReason().cStr()} == "");
    });
    h.send_requests({3});
    CHECK(h.placed() == std::vector<strings>{{}, {}, {"request 3"}});
  }
  SECTION("a corrupt scheduler state is refused by key and changes nothing") {
    scheduler_harness h(placement_kind::round_robin, 3);
    h.send(restore(
      R"({"format":"sorl.scheduler","format_version":2,"round_robin_last":"rollout_worker#1@test"})"));
    expect<msg::RoleStateRestored>(h.self, [](msg::RoleStateRestored::Reader r) {
      CHECK(std::string{r.getRole().cStr()} == "scheduler");
      CHECK_FALSE(r.getOk());
      CHECK(std::string{r.getReason().cStr()} ==
            "scheduler state: key 'format_version': expected 1, got 2");
    });
    h.send(restore("not json"));
    expect<msg::RoleStateRestored>(h.self, [](msg::RoleStateRestored::Reader r) {
      CHECK_FALSE(r.getOk());
      CHECK(std::string{r.getReason().cStr()} == "scheduler state: not a JSON object");
    });
    h.send_requests({1});
    CHECK(h.placed() == std::vector<strings>{{"request 1"}, {}, {}});
  }
}
