// The sagc_controller actor: decodes rollout timing messages, flags a straggler from its chunk
// messages while it is still running, and answers the trainer's queries. The worker-side
// timestamps in the messages are the injected clock: nothing here sleeps or reads time.

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/sagc/controller_actor.hpp"
#include "messages/rollout.capnp.h"
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

constexpr int64_t s = 1'000'000'000; // ns per second

envelope event(uint64_t request, uint64_t step, msg::EventKind kind, int64_t ns,
               uint32_t tokens, msg::FinishReason reason = msg::FinishReason::EOS) {
  return build_envelope<msg::RolloutEvent>([&](msg::RolloutEvent::Builder b) {
    b.setRequestId(request);
    b.setStep(step);
    b.setGroupId(request / 4);
    b.setKind(kind);
    b.setWorkerNs(ns);
    b.setTokens(tokens);
    b.setWorker("rollout_worker#0@test");
    b.setFinishReason(reason);
  });
}

/// Sends a query and returns the reply, opened as `Reply`.
template <class Query, class Reply, class Fill, class Read>
void ask(caf::scoped_actor& self, const caf::actor& to, Fill fill, Read read) {
  self->send(to, build_envelope<Query>(fill));
  self->receive(
    [&](const envelope& e) {
      auto err = with_envelope<Reply>(e, read);
      CHECK_FALSE(err);
    },
    caf::after(10s) >> [&] { FAIL("no reply from the controller"); });
}

/// The sagc policy with G in [2, 4] from 3, κ = 2 over a window of 8 durations (the wall-clock
/// rule), ε = 0.5, V = 0.5 and B = 2 (a step of size G has 2G rollouts), small enough to
/// compute its decisions by hand.
experiment_config small_sagc() {
  experiment_config exp;
  exp.sagc.policy = group_policy_kind::sagc;
  exp.sagc.straggler_rule = straggler_rule_kind::wall_clock;
  exp.sagc.g_min = 2;
  exp.sagc.g_max = 4;
  exp.sagc.group_size = 3;
  exp.sagc.kappa = 2.0;
  exp.sagc.window = 8;
  exp.sagc.target_rate = 0.5;
  exp.sagc.v = 0.5;
  exp.algorithm.prompts_per_step = 2;
  return exp;
}

/// Eight rollouts of `step` (request ids 8·step + r): seven of 1 s and one of `slow` seconds.
void send_step(caf::scoped_actor& self, const caf::actor& ctl, uint64_t step, int64_t slow) {
  for (uint64_t r = 0; r < 8; ++r) {
    const uint64_t id = 8 * step + r;
    self->send(ctl, event(id, step, msg::EventKind::START, 0, 0));
    self->send(ctl, event(id, step, msg::EventKind::FINISH, (r == 7 ? slow : 1) * s, 10));
  }
}

/// Asks `ctl` for the decision of `step` and reads it with `read`.
template <class Read>
void decide(caf::scoped_actor& self, const caf::actor& ctl, uint64_t step, Read read) {
  ask<msg::GroupSizeQuery, msg::GroupSizeDecision>(
    self, ctl, [&](msg::GroupSizeQuery::Builder b) { b.setStep(step); }, read);
}

} // namespace

TEST_CASE("the controller flags a straggler from its chunk messages before it finishes") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  experiment_config exp; // static G = 8, κ = 3, straggler rule needs 8 durations
  exp.sagc.straggler_rule = straggler_rule_kind::wall_clock; // flagged by its duration
  auto ctl = spawn_sagc_controller(sys, test_context(exp, "sagc_controller"));

  ask<msg::GroupSizeQuery, msg::GroupSizeDecision>(
    self, ctl, [](msg::GroupSizeQuery::Builder b) { b.setStep(0); },
    [](msg::GroupSizeDecision::Reader d) {
      CHECK(d.getGroupSize() == 8);
      CHECK(std::string{d.getPolicy().cStr()} == "static");
      CHECK(d.getDeadlineNs() == 0);
    });

  // Step 0: eight rollouts of exactly 1 s each → median 1 s, threshold 3 s for step 1.
  for (uint64_t r = 0; r < 8; ++r) {
    self->send(ctl, event(r, 0, msg::EventKind::START, 0, 0));
    self->send(ctl, event(r, 0, msg::EventKind::FINISH, 1 * s, 10));
  }
  ask<msg::StepTimingQuery, msg::StepTiming>(
    self, ctl, [](msg::StepTimingQuery::Builder b) { b.setStep(0); },
    [](msg::StepTiming::Reader t) {
      CHECK(t.getRollouts() == 8);
      CHECK(t.getDurationP50Ns() == 1 * s);
      CHECK(t.getThresholdNs() == 0); // no history before step 0
      CHECK(t.getFlaggedInFlight() == 0);
    });

  // Step 1: rollout 100 sends a chunk 3.5 s after its start (past 3 × 1 s), rollout 101 one at
  // 2.5 s (below). The step is summarised before rollout 100 finishes.
  self->send(ctl, event(100, 1, msg::EventKind::START, 10 * s, 0));
  self->send(ctl, event(101, 1, msg::EventKind::START, 10 * s, 0));
  self->send(ctl, event(101, 1, msg::EventKind::CHUNK, 10 * s + 2500'000'000, 16));
  self->send(ctl, event(100, 1, msg::EventKind::CHUNK, 10 * s + 3500'000'000, 16));
  self->send(ctl, event(101, 1, msg::EventKind::FINISH, 10 * s + 2600'000'000, 20));
  ask<msg::StepTimingQuery, msg::StepTiming>(
    self, ctl, [](msg::StepTimingQuery::Builder b) { b.setStep(1); },
    [](msg::StepTiming::Reader t) {
      CHECK(t.getThresholdNs() == 3 * s);
      CHECK(t.getRollouts() == 1);        // 101 finished; 100 is still running
      CHECK(t.getStragglers() == 0);      // no finished rollout passed the threshold...
      CHECK(t.getFlaggedInFlight() == 1); // ...but 100 was flagged while it ran
      CHECK_FALSE(t.getStragglerEvent());
    });
  self->send_exit(ctl, caf::exit_reason::user_shutdown);
}

TEST_CASE("the controller answers with the configured deadline policy and its budget") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  experiment_config exp;
  exp.sagc.policy = group_policy_kind::deadline;
  exp.sagc.group_size = 8;
  auto ctl = spawn_sagc_controller(sys, test_context(exp, "sagc_controller"));
  // No history: no deadline yet.
  ask<msg::GroupSizeQuery, msg::GroupSizeDecision>(
    self, ctl, [](msg::GroupSizeQuery::Builder b) { b.setStep(0); },
    [](msg::GroupSizeDecision::Reader d) {
      CHECK(std::string{d.getPolicy().cStr()} == "deadline");
      CHECK(d.getGroupSize() == 8);
      CHECK(d.getDeadlineNs() == 0);
    });
  for (uint64_t r = 0; r < 8; ++r) {
    self->send(ctl, event(r, 0, msg::EventKind::START, 0, 0));
    self->send(ctl, event(r, 0, msg::EventKind::FINISH, 2 * s, 10));
  }
  ask<msg::StepTimingQuery, msg::StepTiming>(
    self, ctl, [](msg::StepTimingQuery::Builder b) { b.setStep(0); },
    [](msg::StepTiming::Reader t) { CHECK(t.getRollouts() == 8); });
  // deadline = deadline_kappa (3) × median (2 s); min_finished = g_min (2).
  ask<msg::GroupSizeQuery, msg::GroupSizeDecision>(
    self, ctl, [](msg::GroupSizeQuery::Builder b) { b.setStep(1); },
    [](msg::GroupSizeDecision::Reader d) {
      CHECK(d.getDeadlineNs() == 6 * s);
      CHECK(d.getMinFinished() == 2);
    });
  self->send_exit(ctl, caf::exit_reason::user_shutdown);
}

TEST_CASE("a controller restored from another's saved state answers the next step the same") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  experiment_config exp;
  exp.sagc.policy = group_policy_kind::sagc;
  exp.sagc.group_size = 4;
  exp.sagc.g_min = 2;
  exp.sagc.g_max = 8;
  exp.sagc.straggler_rule = straggler_rule_kind::wall_clock; // the 5 s straggler below
  auto kept = spawn_sagc_controller(sys, test_context(exp, "sagc_controller"));
  auto resumed = spawn_sagc_controller(sys, test_context(exp, "sagc_controller"));

  // Steps 0 and 1 on `kept`: eight 1 s rollouts, then seven 1 s and a 5 s straggler.
  for (uint64_t step = 0; step < 2; ++step) {
    for (uint64_t r = 0; r < 8; ++r) {
      uint64_t id = step * 8 + r;
      self->send(kept, event(id, step, msg::EventKind::START, 0, 0));
      int64_t took = (step == 1 && r == 7 ? 5 : 1) * s;
      self->send(kept, event(id, step, msg::EventKind::FINISH, took, 10));
    }
    ask<msg::StepTimingQuery, msg::StepTiming>(
      self, kept, [&](msg::StepTimingQuery::Builder b) { b.setStep(step); },
      [&](msg::StepTiming::Reader t) { CHECK(t.getStragglerEvent() == (step == 1)); });
  }
  std::string saved;
  ask<msg::RoleStateQuery, msg::RoleState>(
    self, kept, [](msg::RoleStateQuery::Builder b) { b.setStep(2); },
    [&](msg::RoleState::Reader r) {
      CHECK(r.getOk());
      CHECK(std::string{r.getRole().cStr()} == "sagc_controller");
      saved = r.getState();
    });
  ask<msg::RoleStateRestore, msg::RoleStateRestored>(
    self, resumed,
    [&](msg::RoleStateRestore::Builder b) {
      b.setState(saved);
      b.setSource("test");
    },
    [](msg::RoleStateRestored::Reader r) {
      CHECK(r.getOk());
      CHECK(std::string{r.getReason().cStr()}.empty());
    });

  // Q = (0 − 0.1)⁺ + 1 − 0.1 = 0.9 on both; the decisions agree field by field.
  std::vector<std::string> reasons;
  for (const auto& ctl : {kept, resumed})
    ask<msg::GroupSizeQuery, msg::GroupSizeDecision>(
      self, ctl, [](msg::GroupSizeQuery::Builder b) { b.setStep(2); },
      [&](msg::GroupSizeDecision::Reader d) {
        CHECK(d.getVirtualQueue() == Approx(0.9).epsilon(1e-12));
        reasons.push_back(fmt::format("{} {} {} {}", d.getGroupSize(), d.getVirtualQueue(),
                                      d.getPStraggler(), d.getReason().cStr()));
      });
  REQUIRE(reasons.size() == 2);
  CHECK(reasons[0] == reasons[1]);

  // A corrupt state is refused with a reason, not silently reset.
  ask<msg::RoleStateRestore, msg::RoleStateRestored>(
    self, resumed,
    [&](msg::RoleStateRestore::Builder b) {
      b.setState("{\"format\":\"sorl.sagc_controller\"}");
      b.setSource("test");
    },
    [](msg::RoleStateRestored::Reader r) {
      CHECK_FALSE(r.getOk());
      CHECK_THAT(std::string{r.getReason().cStr()}, Catch::Contains("format_version"));
    });
  self->send_exit(kept, caf::exit_reason::user_shutdown);
  self->send_exit(resumed, caf::exit_reason::user_shutdown);
}

TEST_CASE("the controller runs the configured sagc policy from the queue and the window") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto ctl = spawn_sagc_controller(sys, test_context(small_sagc(), "sagc_controller"));
  auto run_step = [&](uint64_t step, int64_t slow, bool expect_event) {
    send_step(self, ctl, step, slow);
    ask<msg::StepTimingQuery, msg::StepTiming>(
      self, ctl, [&](msg::StepTimingQuery::Builder b) { b.setStep(step); },
      [&](msg::StepTiming::Reader t) {
        CHECK(t.getRollouts() == 8);
        CHECK(t.getStragglerEvent() == expect_event);
      });
  };
  // No window yet: the initial G, no estimate.
  decide(self, ctl, 0, [](msg::GroupSizeDecision::Reader d) {
    CHECK(std::string{d.getPolicy().cStr()} == "sagc");
    CHECK(d.getGroupSize() == 3);
    CHECK(d.getVirtualQueue() == 0.0);
    CHECK(std::isnan(d.getPStraggler()));
    CHECK(d.getDeadlineNs() == 0);
  });
  // Step 0 has no threshold to judge it (s = 0, Q = max(0, 0 - 0.5) = 0). Its durations fill
  // the window {1 x 7, 10} s: median 1 s, threshold 2 s, k = 1 of n = 8 above it, so with the
  // prior a = 1/2 p = (1 + 1/2) / (8 + 1) = 1/6 and P(G) = 1 - (5/6)^(2G).
  run_step(0, 10, false);
  // Q = 0: only the utility counts, G = g_max = 4; P(4) = 1 - (5/6)^8.
  decide(self, ctl, 1, [](msg::GroupSizeDecision::Reader d) {
    CHECK(d.getGroupSize() == 4);
    CHECK(d.getVirtualQueue() == 0.0);
    CHECK(d.getPStraggler() == Approx(1 - 390625.0 / 1679616).epsilon(1e-12));
    CHECK(d.getUtility() == 0.75);
  });
  // Step 1: the 5 s rollout is past the 2 s threshold: an event, Q = 0 + 1 - 0.5 = 0.5. The
  // window becomes {1 x 7, 5} s: the same median, threshold and k, so p = 1/6 again.
  run_step(1, 5, true);
  // Q = 0.5, V = 0.5: score(G) = 0.5 (1 - 1/G) - 0.5 P(G) with P = .517747, .665102, .767432
  // for G = 2, 3, 4: scores -.008873, .000782, -.008716 → G = 3.
  decide(self, ctl, 2, [](msg::GroupSizeDecision::Reader d) {
    CHECK(d.getVirtualQueue() == 0.5);
    CHECK(d.getGroupSize() == 3);
    CHECK(d.getPStraggler() == Approx(1 - 15625.0 / 46656).epsilon(1e-12));
    CHECK(std::string{d.getReason().cStr()}.rfind("sagc: Q=0.5 window k=1/8 > thr=2s", 0) == 0);
  });
  self->send_exit(ctl, caf::exit_reason::user_shutdown);
}

TEST_CASE("the controller learns a step's timing before the next decision without a "
          "StepTimingQuery") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  // The policy and timings of the sagc case above, with the same hand computation, but no
  // StepTimingQuery before each decision.
  auto ctl = spawn_sagc_controller(sys, test_context(small_sagc(), "sagc_controller"));
  decide(self, ctl, 0, [](msg::GroupSizeDecision::Reader d) { CHECK(d.getGroupSize() == 3); });
  // Step 0 {1 s × 7, 10 s}: p = 1/6, Q = 0 → G = g_max = 4, P(4) = 1 − (5/6)^8. Without
  // learning step 0 the controller would still answer the initial G = 3 with no estimate.
  send_step(self, ctl, 0, 10);
  decide(self, ctl, 1, [](msg::GroupSizeDecision::Reader d) {
    CHECK(d.getGroupSize() == 4);
    CHECK(d.getVirtualQueue() == 0.0);
    CHECK(d.getPStraggler() == Approx(1 - 390625.0 / 1679616).epsilon(1e-12));
  });
  // Step 1 {1 s × 7, 5 s}: an event against the 2 s threshold, Q = 0.5 → G = 3.
  send_step(self, ctl, 1, 5);
  decide(self, ctl, 2, [](msg::GroupSizeDecision::Reader d) {
    CHECK(d.getVirtualQueue() == 0.5);
    CHECK(d.getGroupSize() == 3);
    CHECK(d.getPStraggler() == Approx(1 - 15625.0 / 46656).epsilon(1e-12));
  });
  // Asked afterwards, step 1's timing is the one the decision learned.
  ask<msg::StepTimingQuery, msg::StepTiming>(
    self, ctl, [](msg::StepTimingQuery::Builder b) { b.setStep(1); },
    [](msg::StepTiming::Reader t) {
      CHECK(t.getRollouts() == 8);
      CHECK(t.getThresholdNs() == 2 * s);
      CHECK(t.getStragglers() == 1);
      CHECK(t.getStragglerEvent());
    });
  self->send_exit(ctl, caf::exit_reason::user_shutdown);
}
