// The sagc_controller's core (actors/sagc/controller_core.hpp): a step closes once, in order,
// whether the trainer asks for its timing or the next decision needs it. Timings are
// hand-built worker timestamps; nothing sleeps.

#include "actors/sagc/controller_core.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "actors/sagc/controller_state.hpp"
#include "tests/actors/sagc/same_decision.hpp"

using namespace sorl::sagc;

namespace {

constexpr int64_t s = 1'000'000'000; // ns per second

/// κ = 2 over a window of 8, judged from 8 durations on.
straggler_rule_options rule() {
  straggler_rule_options o;
  o.kappa = 2;
  o.window = 8;
  o.min_samples = 8;
  return o;
}

/// The sagc policy with G in [2, 4] from 3, ε = 0.5, V = 0.5, B = 2, prior 1/2: the numbers
/// of tests/actors/sagc/controller_actor_test.cpp, so both check the same hand computation.
group_policy_options sagc_options() {
  group_policy_options o;
  o.policy = sorl::group_policy_kind::sagc;
  o.group_size = 3;
  o.g_min = 2;
  o.g_max = 4;
  o.target_rate = 0.5;
  o.v = 0.5;
  o.prompts_per_step = 2;
  o.tail_prior = 0.5;
  return o;
}

timing_event event(uint64_t request, int64_t step, timing_kind kind, int64_t ns, int64_t tokens) {
  timing_event e;
  e.request_id = request;
  e.step = step;
  e.group_id = request / 4;
  e.kind = kind;
  e.worker_ns = ns;
  e.tokens = tokens;
  e.worker = "rollout_worker#0@test";
  return e;
}

/// The rollouts of `step`, request ids 8·step + i, each taking durations[i] from 0 on one
/// worker.
void run_step(controller_core& c, int64_t step, const std::vector<int64_t>& durations) {
  for (size_t i = 0; i < durations.size(); ++i) {
    const auto id = static_cast<uint64_t>(8 * step) + i;
    CHECK(c.observe(event(id, step, timing_kind::start, 0, 0)).empty());
    CHECK(c.observe(event(id, step, timing_kind::finish, durations[i], 10)).empty());
  }
}

/// Seven rollouts of 1 s and one of `slow`.
std::vector<int64_t> seven_and(int64_t slow) {
  std::vector<int64_t> d(7, 1 * s);
  d.push_back(slow);
  return d;
}

using sorl::sagc::test::check_same;

} // namespace

TEST_CASE("the controller core learns a step before deciding the next, asked for its timing or not",
          "[controller_core]") {
  controller_core asked(rule(), sagc_options());
  controller_core silent(rule(), sagc_options());
  check_same(asked.decide(0), silent.decide(0));
  // Step 0 {1 s × 7, 10 s}: no threshold judges it, Q stays 0. The window then has median
  // 1 s, threshold 2 s, k = 1 of n = 8: p = (1 + 1/2) / (8 + 1) = 1/6, so with Q = 0 the
  // utility alone picks G = g_max = 4, P(4) = 1 − (5/6)^8.
  // Step 1 {1 s × 7, 5 s}: an event against the 2 s threshold, Q = 0 + 1 − 0.5 = 0.5, and
  // score(G) = 0.5 (1 − 1/G) − 0.5 (1 − (5/6)^(2G)) is highest at G = 3, P(3) = 1 − (5/6)^6.
  struct expected {
    int64_t slow;
    bool event;
    int64_t group_size;
    double queue, p_straggler;
  };
  const expected steps[] = {{10 * s, false, 4, 0.0, 1 - 390625.0 / 1679616},
                            {5 * s, true, 3, 0.5, 1 - 15625.0 / 46656}};
  for (int64_t step = 0; step < 2; ++step) {
    const expected& e = steps[step];
    run_step(asked, step, seven_and(e.slow));
    run_step(silent, step, seven_and(e.slow));
    CHECK(asked.step_timing(step).timing.straggler_event == e.event);
    const group_decision a = asked.decide(step + 1);
    const group_decision d = silent.decide(step + 1); // closes `step` itself
    check_same(a, d);
    CHECK(d.group_size == e.group_size);
    CHECK(d.virtual_queue == e.queue);
    CHECK(d.p_straggler == Approx(e.p_straggler).epsilon(1e-12));
    CHECK(silent.timing().last_closed_step() == step);
  }
}

TEST_CASE("a step's report is the same every time it is asked and the step is learned once",
          "[controller_core]") {
  controller_core c(rule(), sagc_options());
  run_step(c, 0, seven_and(10 * s));
  run_step(c, 1, seven_and(5 * s)); // still open when step 0 is asked for
  const step_report r0 = c.step_timing(0);
  CHECK(r0.timing.finished == 8);
  CHECK_FALSE(r0.timing.threshold_ns);
  CHECK(c.decide(2).group_size == 3); // closes step 1 (as in the case above)
  for (int ask = 0; ask < 2; ++ask) {
    const step_report r1 = c.step_timing(1);
    CHECK(r1.warning.empty());
    CHECK(r1.timing.step == 1);
    CHECK(r1.timing.finished == 8);
    CHECK(r1.timing.duration_p50_ns == 1 * s);
    CHECK(r1.timing.duration_p90_ns == 5 * s); // nearest rank ⌈0.9 · 8⌉ = 8th
    CHECK(r1.timing.duration_max_ns == 5 * s);
    CHECK(r1.timing.threshold_ns == 2.0 * s);
    REQUIRE(r1.timing.stragglers.size() == 1);
    CHECK(r1.timing.stragglers[0].request_id == 15);
    CHECK(r1.timing.straggler_event);
    CHECK(r1.flagged_in_flight == 0);
  }
  CHECK(c.step_timing(0).timing.finished == r0.timing.finished);
  const policy_memory m = c.policy().memory();
  CHECK(m.steps_counted == 2);
  CHECK(m.events_counted == 1);
  CHECK(m.virtual_queue == 0.5);
  CHECK(m.last_observed == 1);
}

TEST_CASE("closing a step first closes the open steps before it, oldest first",
          "[controller_core]") {
  controller_core c(rule(), sagc_options());
  run_step(c, 0, std::vector<int64_t>(8, 1 * s));
  run_step(c, 1, std::vector<int64_t>(8, 3 * s));
  // Step 1 is judged against the window step 0 filled: median 1 s, threshold 2 s.
  const step_report r1 = c.step_timing(1);
  CHECK(r1.timing.threshold_ns == 2.0 * s);
  CHECK(r1.timing.stragglers.size() == 8);
  const step_report r0 = c.step_timing(0);
  CHECK(r0.timing.finished == 8);
  CHECK(r0.timing.duration_max_ns == 1 * s);
  CHECK(c.timing().issues(timing_issue::skipped_step) == 0);
  CHECK(c.policy().memory().steps_counted == 2);
}

TEST_CASE("a rollout past the threshold while it runs is returned once and counted in its step",
          "[controller_core]") {
  controller_core c(rule(), sagc_options());
  run_step(c, 0, std::vector<int64_t>(8, 1 * s)); // threshold 2 s from step 1 on
  c.step_timing(0);
  CHECK(c.observe(event(100, 1, timing_kind::start, 10 * s, 0)).empty());
  CHECK(c.observe(event(101, 1, timing_kind::start, 10 * s, 0)).empty());
  CHECK(c.observe(event(101, 1, timing_kind::chunk, 11 * s, 16)).empty()); // 1 s in
  const auto flagged = c.observe(event(100, 1, timing_kind::chunk, 12 * s + s / 2, 16));
  REQUIRE(flagged.size() == 1);
  CHECK(flagged[0].request_id == 100);
  CHECK(flagged[0].elapsed_ns == 2 * s + s / 2);
  CHECK(flagged[0].tokens == 16);
  CHECK(c.observe(event(100, 1, timing_kind::chunk, 13 * s, 32)).empty()); // already flagged
  const step_report r1 = c.step_timing(1);
  CHECK(r1.flagged_in_flight == 1);
  CHECK(r1.timing.running == 2);
}

TEST_CASE("a step whose report is no longer kept, or a negative one, is reported empty with a "
          "warning",
          "[controller_core]") {
  group_policy_options fixed;
  fixed.group_size = 8;
  controller_core c(rule(), fixed);
  for (int64_t step = 0; step <= 17; ++step)
    CHECK(c.decide(step).group_size == 8); // closes steps 0 … 16, one by one
  CHECK(c.timing().last_closed_step() == 16);
  const step_report gone = c.step_timing(0);
  CHECK_THAT(gone.warning, Catch::Contains("not after the last closed step 16"));
  CHECK(gone.timing.step == 0);
  CHECK(gone.timing.started == 0);
  CHECK(c.step_timing(1).warning.empty()); // the last 16 closed steps are kept
  CHECK_THAT(c.step_timing(-1).warning, Catch::Contains("negative"));
  CHECK(c.timing().last_closed_step() == 16);
}

TEST_CASE("a controller core restored from another's saved state decides the next step the same",
          "[controller_core]") {
  controller_core kept(rule(), sagc_options());
  run_step(kept, 0, seven_and(10 * s));
  run_step(kept, 1, seven_and(5 * s));
  kept.step_timing(1);
  controller_core resumed(rule(), sagc_options());
  CHECK(resumed.restore(kept.save()).empty());
  check_same(resumed.decide(2), kept.decide(2));
  CHECK_THROWS_AS(resumed.restore("{}"), controller_state_error);
}
