// Saving and restoring the sagc_controller's decision state (actors/sagc/controller_state.hpp):
// a restored controller decides exactly as the one that kept running, given the same timings.

#include "actors/sagc/controller_state.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/actors/sagc/same_decision.hpp"

using namespace sorl::sagc;

namespace {

constexpr int64_t s = 1'000'000'000; // ns per second

/// The controller's core as its actor shell holds it: timing statistics and the policy.
struct controller {
  rollout_timing timing;
  std::unique_ptr<group_policy> policy;

  explicit controller(sorl::group_policy_kind name = sorl::group_policy_kind::sagc)
    : timing(rule_options()), policy(make_group_policy(options(name))) {
  }

  static straggler_rule_options rule_options() {
    straggler_rule_options o;
    o.kappa = 3;
    o.window = 16;
    o.min_samples = 8;
    return o;
  }
  /// B = 4, G in [2, 8] starting at 4, V = 1 (small, so that Q visibly moves G), ε = 0.1.
  static group_policy_options options(sorl::group_policy_kind name) {
    group_policy_options o;
    o.policy = name;
    o.group_size = 4;
    o.g_min = 2;
    o.g_max = 8;
    o.prompts_per_step = 4;
    o.v = 1;
    o.target_rate = 0.1;
    o.tail_prior = 0.5;
    return o;
  }

  /// One step whose rollouts take `durations` (ns) on one worker, fed back as the shell does.
  void run_step(int64_t step, const std::vector<int64_t>& durations) {
    for (size_t i = 0; i < durations.size(); ++i) {
      timing_event e;
      e.request_id = static_cast<uint64_t>(step * 100 + static_cast<int64_t>(i));
      e.step = step;
      e.worker = "w0";
      e.kind = timing_kind::start;
      e.worker_ns = 0;
      REQUIRE(timing.observe(e));
      e.kind = timing_kind::finish;
      e.worker_ns = durations[i];
      e.tokens = 4;
      REQUIRE(timing.observe(e));
    }
    policy->observe(timing.close_step(step), timing.rule());
  }
};

/// Seven rollouts of 1 s and, when given, one of `slow` seconds.
std::vector<int64_t> step_durations(int64_t slow = 0) {
  std::vector<int64_t> d(7, 1 * s);
  d.push_back(slow > 0 ? slow * s : 1 * s);
  return d;
}

/// Steps 0-2: no straggler (the window fills), then a 5 s and a 10 s straggler.
void run_three_steps(controller& c) {
  for (int64_t step = 0; step < 3; ++step) {
    c.policy->decide(step);
    c.run_step(step, step_durations(step == 0 ? 0 : step == 1 ? 5 : 10));
  }
}

using sorl::sagc::test::check_same;

} // namespace

TEST_CASE("a restored sagc controller decides as the uninterrupted one on the same timings") {
  controller kept;
  run_three_steps(kept);
  const std::string saved = save_controller_state(kept.timing, *kept.policy);

  controller resumed;
  CHECK(restore_controller_state(saved, resumed.timing, *resumed.policy).empty());

  // Q = (0 + 0 − 0.1)⁺ = 0, then 0 + 1 − 0.1 = 0.9, then 1.8. The window holds the last 16
  // durations: 14 of 1 s, 5 s and 10 s; median 1 s, threshold 3 s, k = 2, n = 16, so
  // p̂ = 2.5/17 and with V = 1, B = 4: V·U(G) − Q·(1 − (1 − p̂)^{4G}) is −0.796 at G = 2,
  // −0.866 at 3, ..., −0.914 at 8: G = 2. Two long rollouts of 16 show ε unreachable (the
  // Wilson lower bound of k/n, 0.034, gives the smallest group's 8 rollouts an event with
  // probability 0.24 > 0.1; one of 16 gave 0.08), so the target is b + ε with
  // b = 1 − (14/16)^8.
  auto d_kept = kept.policy->decide(3);
  auto d_resumed = resumed.policy->decide(3);
  CHECK(d_kept.virtual_queue == Approx(1.8).epsilon(1e-12));
  CHECK(d_kept.group_size == 2);
  CHECK(d_kept.target_rate == Approx(1.1 - std::pow(14.0 / 16, 8)).epsilon(1e-12));
  check_same(d_kept, d_resumed);

  // Without the saved state the first step after the resume would differ: a fresh
  // controller has no threshold and takes the initial G = 4.
  controller forgetful;
  CHECK(forgetful.policy->decide(3).group_size == 4);

  // The same next timings keep both in step: identical decisions and identical state.
  kept.run_step(3, step_durations());
  resumed.run_step(3, step_durations());
  check_same(kept.policy->decide(4), resumed.policy->decide(4));
  CHECK(save_controller_state(kept.timing, *kept.policy) ==
        save_controller_state(resumed.timing, *resumed.policy));
  CHECK(resumed.timing.rule().samples() == 16);
  CHECK(*resumed.timing.last_closed_step() == 3);
}

TEST_CASE("a restored deadline controller keeps its window and deadline") {
  controller kept(sorl::group_policy_kind::deadline);
  run_three_steps(kept);
  controller resumed(sorl::group_policy_kind::deadline);
  REQUIRE(restore_controller_state(save_controller_state(kept.timing, *kept.policy), resumed.timing,
                                   *resumed.policy)
            .empty());
  auto d = resumed.policy->decide(3);
  check_same(kept.policy->decide(3), d);
  // Deadline: 3 × the window median of 1 s.
  CHECK(d.deadline_ns == 3 * s);
}

TEST_CASE("a checkpoint of another policy restores the window and says so") {
  controller kept(sorl::group_policy_kind::fixed);
  run_three_steps(kept);
  controller resumed(sorl::group_policy_kind::sagc);
  auto warning = restore_controller_state(save_controller_state(kept.timing, *kept.policy),
                                          resumed.timing, *resumed.policy);
  CHECK(warning.find("\"static\"") != std::string::npos);
  CHECK(warning.find("\"sagc\"") != std::string::npos);
  // The window is there (threshold 3 s, k = 2 of 16), the queue starts at 0: with Q = 0 the
  // largest G has the best score.
  auto d = resumed.policy->decide(3);
  CHECK(d.virtual_queue == 0);
  CHECK(d.group_size == 8);
  CHECK(resumed.timing.rule().samples() == 16);
}

TEST_CASE("a corrupt controller state is refused by key and changes nothing") {
  controller kept;
  run_three_steps(kept);
  const std::string good = save_controller_state(kept.timing, *kept.policy);
  auto with = [&](const std::string& from, const std::string& to) {
    auto at = good.find(from);
    REQUIRE(at != std::string::npos);
    return std::string{good}.replace(at, from.size(), to);
  };
  struct bad_case {
    std::string text;
    std::string says;
  };
  const std::vector<bad_case> cases{
    {"", "not a JSON object"},
    {"[1,2]", "not a JSON object"},
    {good.substr(0, good.size() / 2), "not a JSON object"},
    {with("\"format\":\"sorl.sagc_controller\"", "\"format\":\"sorl.scheduler\""), "'format'"},
    {with("\"format_version\":1", "\"format_version\":2"), "'format_version'"},
    {with("\"virtual_queue\":", "\"virtual_q\":"), "'virtual_queue': missing"},
    {with("\"virtual_queue\":", "\"virtual_queue\":\"x\",\"_\":"),
     "'virtual_queue': expected a number"},
    {with("\"virtual_queue\":", "\"virtual_queue\":-1,\"_\":"),
     "virtual_queue: must be finite and >= 0"},
    {with("\"events_counted\":", "\"events_counted\":99,\"_\":"), "events_counted: 99 is outside"},
    {with("\"window_ns\":[", "\"window_ns\":[-5,"), "'window_ns': expected durations >= 0"},
    {with("\"window_ns\":[", "\"window_ns\":[\"1\","), "'window_ns'"},
    {with("\"last_closed_step\":2", "\"last_closed_step\":-2"), "'last_closed_step': must be >= 0"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    controller target;
    target.run_step(0, step_durations()); // some state of its own to keep
    const std::string before = save_controller_state(target.timing, *target.policy);
    try {
      restore_controller_state(c.text, target.timing, *target.policy);
      FAIL("restored a corrupt state");
    } catch (const controller_state_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(c.says));
    }
    CHECK(save_controller_state(target.timing, *target.policy) == before);
  }
  // Also when this run's policy would not use the corrupt part.
  controller fixed(sorl::group_policy_kind::fixed);
  CHECK_THROWS_AS(
    restore_controller_state(with("\"virtual_queue\":", "\"virtual_queue\":-1,\"_\":"),
                             fixed.timing, *fixed.policy),
    controller_state_error);
  CHECK(fixed.timing.rule().samples() == 0);
}
