// The group_tokens straggler rule (actors/sagc/timing.hpp, "Two straggler rules") and the
// sagc policy on it (actors/sagc/group_policy.hpp): verdicts by hand, independence from load
// and from the prompts per step, in-flight flags that the close never withdraws, and the
// relative window through a checkpoint.

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/sagc/controller_state.hpp"
#include "actors/sagc/group_policy.hpp"
#include "actors/sagc/timing.hpp"
#include "runtime/config.hpp"
#include "tests/actors/sagc/timing_events.hpp"

using namespace sorl::sagc;
using sorl::straggler_rule_kind;
using sorl::sagc::test::ev;

namespace {

constexpr int64_t ms = 1'000'000; // ns

straggler_rule_options tokens_rule(double kappa = 3.0, size_t window = 256,
                                   size_t min_samples = 8) {
  straggler_rule_options o;
  o.kappa = kappa;
  o.window = window;
  o.min_samples = min_samples;
  o.kind = straggler_rule_kind::group_tokens;
  return o;
}

/// One rollout of `tokens` tokens that takes `tokens × ns_per_token` ns on worker w0.
void finished(rollout_timing& t, uint64_t id, int64_t step, uint64_t group, int64_t tokens,
              int64_t ns_per_token) {
  REQUIRE(t.observe(ev(id, step, timing_kind::start, 0, 0, "w0", group)));
  REQUIRE(t.observe(ev(id, step, timing_kind::finish, tokens * ns_per_token, tokens, "w0", group)));
}

/// Step `step`: group 1 = {10, 11, 12, 40} tokens (ids 1-4), group 2 = {20, 21, 22, 23}
/// (ids 5-8), group 3 = one finished of 9 tokens (id 9) and one aborted at 500 (id 10).
step_timing three_groups(rollout_timing& t, int64_t step, int64_t ns_per_token) {
  const uint64_t base = static_cast<uint64_t>(step) * 100;
  const std::vector<int64_t> g1{10, 11, 12, 40}, g2{20, 21, 22, 23};
  for (size_t i = 0; i < 4; ++i) {
    finished(t, base + 1 + i, step, 1, g1[i], ns_per_token);
    finished(t, base + 5 + i, step, 2, g2[i], ns_per_token);
  }
  finished(t, base + 9, step, 3, 9, ns_per_token);
  REQUIRE(t.observe(ev(base + 10, step, timing_kind::start, 0, 0, "w0", 3)));
  REQUIRE(t.observe(ev(base + 10, step, timing_kind::abort, 500 * ns_per_token, 500, "w0", 3)));
  return t.close_step(step);
}

std::vector<uint64_t> ids_of(const std::vector<straggler_flag>& flags) {
  std::vector<uint64_t> ids;
  for (const auto& f : flags)
    ids.push_back(f.request_id);
  return ids;
}

step_timing groups_step(int64_t step, int64_t judged, int64_t events) {
  step_timing t;
  t.step = step;
  t.started = t.finished = t.timed = 4 * judged;
  t.groups_judged = judged;
  t.group_events = events;
  t.straggler_event = events > 0;
  return t;
}

} // namespace

TEST_CASE("judge_group flags tokens over kappa times the group's nearest-rank median",
          "[timing]") {
  // Sorted 10, 11, 12, 40: the median is the 2nd (lower middle), 11; threshold 33.
  group_verdict v = judge_group({10, 12, 40, 11}, 3.0);
  CHECK(v.judged);
  CHECK(v.median_tokens == 11);
  CHECK(v.threshold_tokens == 33.0);
  CHECK(v.stragglers == std::vector<size_t>{2});
  // Exactly at the threshold is not over it: 33 = 3 × 11.
  CHECK(judge_group({11, 11, 33}, 3.0).stragglers.empty());
  CHECK(judge_group({11, 11, 34}, 3.0).stragglers == std::vector<size_t>{2});
  // A median of 0 tokens is floored at 1: only responses of more than κ tokens are flagged.
  v = judge_group({0, 0, 3, 4}, 3.0);
  CHECK(v.median_tokens == 1);
  CHECK(v.stragglers == std::vector<size_t>{3});
  // One rollout has no sibling to be slow against.
  CHECK_FALSE(judge_group({500}, 3.0).judged);
  CHECK_FALSE(judge_group({}, 3.0).judged);
  CHECK_THROWS_AS(judge_group({1, -1}, 3.0), std::invalid_argument);
  CHECK_THROWS_AS(judge_group({1, 2}, 0.0), std::invalid_argument);
}

TEST_CASE("a step's group_tokens verdict counts groups, flags by tokens, and fills the "
          "relative window by group then request id",
          "[timing]") {
  rollout_timing t(tokens_rule());
  const step_timing s = three_groups(t, 0, 1 * ms);
  // Group 1: 40 > 3 × 11. Group 2: median 21, none over 63. Group 3: one finished, not
  // judged; its aborted rollout is not flagged either.
  CHECK(s.groups_judged == 2);
  CHECK(s.group_events == 1);
  CHECK(s.group_event_rate() == 0.5);
  CHECK(ids_of(s.stragglers) == std::vector<uint64_t>{4});
  CHECK(s.stragglers[0].tokens == 40);
  CHECK(s.stragglers[0].elapsed_ns == 40 * ms);
  CHECK(s.straggler_event);
  const std::vector<double> want{10.0 / 11, 1, 12.0 / 11, 40.0 / 11,
                                 20.0 / 21, 1, 22.0 / 21, 23.0 / 21};
  const auto& got = t.rule().relative_lengths();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i)
    CHECK(got[i] == want[i]);
  // The duration window is filled under either rule (the deadline policy reads it).
  CHECK(t.rule().samples() == 9);
}

TEST_CASE("the group_tokens verdict does not change with load, the wall_clock one does",
          "[timing]") {
  // Step 0 at 1 ms per token fills the duration window; step 1 has the same tokens at
  // 5 ms per token (five times the load): every one of its rollouts is slow by the clock.
  rollout_timing by_tokens(tokens_rule());
  straggler_rule_options clock_options = tokens_rule();
  clock_options.kind = straggler_rule_kind::wall_clock;
  rollout_timing by_clock(clock_options);
  const step_timing light = three_groups(by_tokens, 0, 1 * ms);
  three_groups(by_clock, 0, 1 * ms);
  const step_timing heavy = three_groups(by_tokens, 1, 5 * ms);
  const step_timing heavy_clock = three_groups(by_clock, 1, 5 * ms);
  CHECK(ids_of(heavy.stragglers) == std::vector<uint64_t>{104});
  CHECK(heavy.group_events == light.group_events);
  CHECK(heavy.groups_judged == light.groups_judged);
  // Step 0's nine durations 9, 10, 11, 12, 20, 21, 22, 23, 40 ms: median 20 ms, threshold
  // 60 ms. At 5 ms per token every rollout of more than 12 tokens is over it (group 2's four
  // and the 40), and so is the aborted one (2.5 s).
  CHECK(ids_of(heavy_clock.stragglers) == std::vector<uint64_t>{104, 105, 106, 107, 108, 110});
  CHECK(heavy_clock.straggler_event);
  // The clock rule still reports the token verdict beside its own.
  CHECK(heavy_clock.groups_judged == 2);
  CHECK(heavy_clock.group_events == 1);
}

TEST_CASE("an aborted rollout already over its group's threshold is a straggler",
          "[timing]") {
  rollout_timing t(tokens_rule());
  for (uint64_t id = 1; id <= 3; ++id)
    finished(t, id, 0, 7, 10, ms);
  REQUIRE(t.observe(ev(4, 0, timing_kind::start, 0, 0, "w0", 7)));
  REQUIRE(t.observe(ev(4, 0, timing_kind::abort, 31 * ms, 31, "w0", 7)));
  const step_timing s = t.close_step(0);
  REQUIRE(s.stragglers.size() == 1);
  CHECK(s.stragglers[0].request_id == 4);
  CHECK(s.stragglers[0].aborted);
  CHECK(s.group_events == 1);
  // Its length is censored: only the three finished ones enter the relative window.
  CHECK(t.rule().relative_lengths().size() == 3);
}

TEST_CASE("a running rollout is flagged once half its group finished and the close agrees",
          "[timing]") {
  rollout_timing t(tokens_rule());
  // Group 5 of four rollouts; ids 1 and 2 finish with 10 and 30 tokens.
  for (uint64_t id = 1; id <= 4; ++id)
    REQUIRE(t.observe(ev(id, 0, timing_kind::start, 0, 0, "w0", 5)));
  REQUIRE(t.observe(ev(1, 0, timing_kind::finish, 10 * ms, 10, "w0", 5)));
  REQUIRE(t.observe(ev(3, 0, timing_kind::chunk, 20 * ms, 95, "w0", 5)));
  // One of ⌈4/2⌉ = 2 finished: the median is not bounded yet.
  CHECK(t.in_flight_stragglers(0).empty());
  REQUIRE(t.observe(ev(2, 0, timing_kind::finish, 30 * ms, 30, "w0", 5)));
  // Bound m = 30 (2nd smallest finished): 95 > 90 is flagged, 80 is not.
  REQUIRE(t.observe(ev(4, 0, timing_kind::chunk, 25 * ms, 80, "w0", 5)));
  const auto flags = t.in_flight_stragglers(0);
  CHECK(ids_of(flags) == std::vector<uint64_t>{3});
  CHECK(flags[0].tokens == 95);
  CHECK_FALSE(flags[0].ended);
  // Whatever they end with, the final median is at most 30, so id 3 stays a straggler.
  REQUIRE(t.observe(ev(3, 0, timing_kind::finish, 40 * ms, 100, "w0", 5)));
  REQUIRE(t.observe(ev(4, 0, timing_kind::finish, 40 * ms, 80, "w0", 5)));
  const step_timing s = t.close_step(0);
  CHECK(ids_of(s.stragglers) == std::vector<uint64_t>{3}); // median 30, threshold 90
}

TEST_CASE("under group_tokens sagc estimates P(G) over G rollouts whatever B, and queues "
          "the share of groups with an event, by hand",
          "[group_policy]") {
  // Relative window {1, 1, 1, 4}, κ = 2: k = 1 of n = 4, p̂ = 0.25 (a = 0).
  straggler_rule rule(tokens_rule(2.0, 4, 4));
  for (double r : {1.0, 1.0, 1.0, 4.0})
    REQUIRE(rule.add_relative(r));
  const window_tail tail = window_tail_of(rule);
  CHECK(tail.kind == straggler_rule_kind::group_tokens);
  CHECK(tail.samples == 4);
  CHECK(tail.over == 1);
  REQUIRE(tail.threshold);
  CHECK(*tail.threshold == 2.0);
  CHECK(tail_estimate(tail, 0.0) == 0.25);

  for (int64_t b : {1, 4}) {
    INFO("prompts per step " << b);
    group_policy_options o;
    o.policy = sorl::group_policy_kind::sagc;
    o.g_min = 1;
    o.g_max = 4;
    o.group_size = 2;
    o.prompts_per_step = b;
    o.v = 1.0;
    o.target_rate = 0.1;
    o.tail_prior = 0.0;
    sagc_group_policy p(o);
    // One group of four has an event: s = 0.25, Q = 0.25 − 0.1 = 0.15.
    p.observe(groups_step(0, 4, 1), rule);
    CHECK(p.virtual_queue() == Approx(0.15).margin(1e-12));
    // Q = 0.15: U(G) − Q·(1 − 0.75^G) = −.0375, .434375, .579948, .647461 → G = 4.
    auto d = p.decide(1);
    CHECK(d.group_size == 4);
    CHECK(d.p_straggler == Approx(1 - 0.75 * 0.75 * 0.75 * 0.75).epsilon(1e-12));
    // Every group has an event: s = 1, Q = 1.05; scores −.2625, .040625, .059635,
    // .032227 → G = 3.
    p.observe(groups_step(1, 4, 4), rule);
    d = p.decide(2);
    CHECK(d.virtual_queue == Approx(1.05).epsilon(1e-12));
    CHECK(d.group_size == 3);
    CHECK(p.score(2) == Approx(0.040625).epsilon(1e-9));
    CHECK(d.reason == "Q=1.05 window k=1/4 > thr=2x group median p=0.25 -> G=3: V*U=0.6667"
                      " - Q*P=0.607");
    CHECK(p.steps_counted() == 2);
    CHECK(p.events_counted() == 2);
    CHECK(p.event_sum() == Approx(1.25).epsilon(1e-12));
    // A step without a judged group does not move the queue, and says so.
    step_timing unjudged = groups_step(2, 0, 0);
    unjudged.started = unjudged.finished = unjudged.timed = 4; // four groups of one
    p.observe(unjudged, rule);
    CHECK(p.virtual_queue() == Approx(1.05).epsilon(1e-12));
    CHECK(p.steps_counted() == 2);
    CHECK_THAT(p.decide(3).reason, Catch::Contains("no group had 2 finished rollouts"));
  }
}

TEST_CASE("the deadline policy budgets time from the duration window under group_tokens",
          "[group_policy]") {
  straggler_rule rule(tokens_rule(3.0, 8, 4));
  for (double d : {1e9, 1e9, 2e9, 2e9})
    REQUIRE(rule.add(d));
  for (double r : {1.0, 1.0, 1.0, 1.0})
    REQUIRE(rule.add_relative(r));
  group_policy_options o;
  o.policy = sorl::group_policy_kind::deadline;
  o.group_size = 4;
  o.g_min = 2;
  o.g_max = 8;
  o.deadline_kappa = 2.0;
  deadline_group_policy p(o);
  p.observe(groups_step(0, 2, 0), rule);
  // Duration median 1 s (lower middle), budget 2 s; not 2 × the relative median 1.
  const auto d = p.decide(1);
  REQUIRE(d.deadline_ns);
  CHECK(*d.deadline_ns == 2'000'000'000);
}

TEST_CASE("the relative window and the event sum survive a checkpoint, and older states "
          "restore without them",
          "[group_policy]") {
  group_policy_options o;
  o.policy = sorl::group_policy_kind::sagc;
  o.g_min = 2;
  o.g_max = 8;
  o.group_size = 4;
  o.prompts_per_step = 3;
  rollout_timing kept(tokens_rule(3.0, 16, 4));
  auto kept_policy = make_group_policy(o);
  for (int64_t step = 0; step < 3; ++step) {
    kept_policy->decide(step);
    kept_policy->observe(three_groups(kept, step, ms), kept.rule());
  }
  const std::string saved = save_controller_state(kept, *kept_policy);

  rollout_timing resumed(tokens_rule(3.0, 16, 4));
  auto resumed_policy = make_group_policy(o);
  CHECK(restore_controller_state(saved, resumed, *resumed_policy).empty());
  CHECK(resumed.rule().relative_lengths() == kept.rule().relative_lengths());
  CHECK(resumed.rule().relative_lengths().size() == 16); // 24 seen, the window keeps 16
  CHECK(resumed_policy->memory().event_sum == Approx(1.5).epsilon(1e-12)); // 3 × 1/2
  const auto a = kept_policy->decide(3), b = resumed_policy->decide(3);
  CHECK(a.group_size == b.group_size);
  CHECK(a.reason == b.reason);
  CHECK(save_controller_state(kept, *kept_policy) == save_controller_state(resumed, *resumed_policy));

  // A state written before the group_tokens rule: no relative window, no event sum.
  nlohmann::json old = nlohmann::json::parse(saved);
  old.erase("window_relative");
  old.erase("event_sum");
  rollout_timing older(tokens_rule(3.0, 16, 4));
  auto older_policy = make_group_policy(o);
  CHECK(restore_controller_state(old.dump(), older, *older_policy).empty());
  CHECK(older.rule().relative_lengths().empty());
  CHECK(older_policy->memory().event_sum == older_policy->memory().events_counted);

  // A corrupt relative window is refused by key.
  std::string bad = saved;
  bad.replace(bad.find("\"window_relative\":["), 19, "\"window_relative\":[-1,");
  rollout_timing target(tokens_rule(3.0, 16, 4));
  auto target_policy = make_group_policy(o);
  CHECK_THROWS_WITH(restore_controller_state(bad, target, *target_policy),
                    Catch::Contains("'window_relative'"));
}

TEST_CASE("[sagc].straggler_rule selects the rule, group_tokens by default") {
  sorl::experiment_config cfg;
  CHECK(straggler_rule_from(cfg).kind == straggler_rule_kind::group_tokens);
  cfg.sagc.straggler_rule = straggler_rule_kind::wall_clock;
  CHECK(straggler_rule_from(cfg).kind == straggler_rule_kind::wall_clock);
}
