#include "actors/sagc/timing.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/actors/sagc/timing_events.hpp"

using namespace sorl::sagc;
using sorl::sagc::test::ev;

namespace {

constexpr int64_t ms = 1'000'000; // ns

/// Runs one step whose rollouts take `durations_ms` (ids first_id, first_id+1, ...) and
/// closes it.
step_timing run_step(rollout_timing& t, int64_t step, const std::vector<int64_t>& durations_ms,
                     uint64_t first_id) {
  uint64_t id = first_id;
  for (int64_t d : durations_ms) {
    REQUIRE(t.observe(ev(id, step, timing_kind::start, 1000)));
    REQUIRE(t.observe(ev(id, step, timing_kind::finish, 1000 + d * ms, d)));
    ++id;
  }
  return t.close_step(step);
}

straggler_rule_options rule(double kappa, size_t window, size_t min_samples = 8) {
  straggler_rule_options o;
  o.kappa = kappa;
  o.window = window;
  o.min_samples = min_samples;
  return o;
}

std::vector<uint64_t> ids_of(const std::vector<straggler_flag>& flags) {
  std::vector<uint64_t> ids;
  for (const auto& f : flags)
    ids.push_back(f.request_id);
  return ids;
}

int64_t count(const timing_issue_counts& c, timing_issue i) {
  return c[static_cast<size_t>(i)];
}

} // namespace

TEST_CASE("nearest-rank percentiles match hand-computed values", "[timing]") {
  // The textbook example: {15, 20, 35, 40, 50}.
  const std::vector<int64_t> v{50, 15, 40, 20, 35};
  CHECK(nearest_rank_percentile(v, 0) == 15);
  CHECK(nearest_rank_percentile(v, 30) == 20);  // k = ceil(1.5) = 2
  CHECK(nearest_rank_percentile(v, 40) == 20);  // k = ceil(2.0) = 2
  CHECK(nearest_rank_percentile(v, 50) == 35);  // k = ceil(2.5) = 3
  CHECK(nearest_rank_percentile(v, 100) == 50);
  // Even count: the median is the lower middle value, not an average.
  CHECK(nearest_rank_percentile(std::vector<int64_t>{4, 1, 3, 2}, 50) == 2);
  std::vector<int64_t> hundred(100);
  for (int64_t i = 0; i < 100; ++i)
    hundred[static_cast<size_t>(i)] = i + 1;
  CHECK(nearest_rank_percentile(hundred, 99) == 99); // exact rank, not bumped to 100
  CHECK(nearest_rank_percentile(std::vector<double>{0.5, 2.5}, 50) == 0.5);
  CHECK_THROWS_AS(nearest_rank_percentile(std::vector<int64_t>{}, 50), std::invalid_argument);
  CHECK_THROWS_AS(nearest_rank_percentile(v, 101), std::invalid_argument);
  CHECK_THROWS_AS(nearest_rank_percentile(v, std::nan("")), std::invalid_argument);
  CHECK_THROWS_AS(nearest_rank_percentile(std::vector<double>{1.0, INFINITY}, 50),
                  std::invalid_argument);
}

TEST_CASE("a step's durations and token counts give nearest-rank p50/p90/max and p50/p99/max",
          "[timing]") {
  rollout_timing t;
  // Ten rollouts of 1..10 ms with 10·k tokens, finished in reverse order.
  for (uint64_t k = 1; k <= 10; ++k)
    t.observe(ev(k, 0, timing_kind::start, 500, 0, "w0"));
  for (uint64_t k = 10; k >= 1; --k)
    t.observe(ev(k, 0, timing_kind::finish, 500 + static_cast<int64_t>(k) * ms,
                 static_cast<int64_t>(k) * 10));
  auto s = t.summary(0);
  CHECK(s.started == 10);
  CHECK(s.finished == 10);
  CHECK(s.running == 0);
  CHECK(s.timed == 10);
  CHECK(s.duration_p50_ns == 5 * ms);  // k = ceil(5.0) = 5
  CHECK(s.duration_p90_ns == 9 * ms);  // k = ceil(9.0) = 9
  CHECK(s.duration_max_ns == 10 * ms);
  CHECK(s.tokens_p50 == 50);
  CHECK(s.tokens_p99 == 100); // k = ceil(9.9) = 10
  CHECK(s.tokens_max == 100);
  // An empty window judges nobody.
  CHECK_FALSE(s.threshold_ns);
  CHECK(s.stragglers.empty());
  CHECK_FALSE(s.straggler_event);
  // summary() changes nothing; close_step gives the same numbers.
  auto c = t.close_step(0);
  CHECK(c.duration_p90_ns == s.duration_p90_ns);
  CHECK(t.rule().samples() == 10);
}

TEST_CASE("nothing is flagged while the window holds fewer than min_samples durations",
          "[timing]") {
  straggler_rule r(rule(2.0, 16, 8));
  for (int i = 0; i < 7; ++i)
    REQUIRE(r.add(10.0));
  CHECK_FALSE(r.threshold_ns());
  CHECK(r.median_ns() == Approx(10.0));
  CHECK_FALSE(r.is_straggler(1e18));
  REQUIRE(r.add(10.0));
  REQUIRE(r.threshold_ns());
  CHECK(*r.threshold_ns() == Approx(20.0));
  CHECK(r.is_straggler(20.5));
  CHECK_FALSE(r.is_straggler(20.0)); // strictly above
}

TEST_CASE("stragglers exceed kappa times the median of a window that spans steps", "[timing]") {
  rollout_timing t(rule(2.0, 8, 8));
  // Step 0: too few samples before it, so even the 100 ms rollout is not flagged.
  auto s0 = run_step(t, 0, {10, 11, 12, 13, 14, 15, 16, 100}, 0);
  CHECK_FALSE(s0.threshold_ns);
  CHECK_FALSE(s0.straggler_event);
  // Window now {10..16, 100}: the 4th smallest is 13 ms, threshold 26 ms.
  auto s1 = run_step(t, 1, {20, 26, 27, 5}, 100);
  REQUIRE(s1.threshold_ns);
  CHECK(*s1.threshold_ns == Approx(26.0 * ms));
  CHECK(ids_of(s1.stragglers) == std::vector<uint64_t>{102}); // 27 > 26; 26 is not
  CHECK(s1.stragglers[0].elapsed_ns == 27 * ms);
  CHECK(s1.stragglers[0].ended);
  CHECK_FALSE(s1.stragglers[0].aborted);
  CHECK(s1.straggler_event);
  // The window keeps the 8 most recent: 10..13 evicted →
  // {14, 15, 16, 100, 20, 26, 27, 5}, sorted {5, 14, 15, 16, 20, 26, 27, 100}: median 16.
  auto s2 = run_step(t, 2, {30}, 200);
  REQUIRE(s2.threshold_ns);
  CHECK(*s2.threshold_ns == Approx(32.0 * ms));
  CHECK_FALSE(s2.straggler_event);
  CHECK(*t.rule().median_ns() == Approx(20.0 * ms)); // {..., 30} replaced 14
}

TEST_CASE("a running rollout past the threshold is flagged from its chunks or an injected now",
          "[timing]") {
  rollout_timing t(rule(2.0, 8, 8));
  run_step(t, 0, {10, 10, 10, 10, 10, 10, 10, 10}, 0); // threshold 20 ms
  t.observe(ev(1, 1, timing_kind::start, 0, 0, "w0"));
  t.observe(ev(2, 1, timing_kind::start, 0, 0, "w0"));
  t.observe(ev(3, 1, timing_kind::start, 5 * ms, 0, "w1"));
  t.observe(ev(1, 1, timing_kind::chunk, 15 * ms, 40, "w0"));
  CHECK(t.in_flight_stragglers(1).empty()); // 15 ms ≤ 20 ms
  t.observe(ev(1, 1, timing_kind::chunk, 21 * ms, 55, "w0"));
  auto flags = t.in_flight_stragglers(1);
  REQUIRE(ids_of(flags) == std::vector<uint64_t>{1});
  CHECK(flags[0].elapsed_ns == 21 * ms);
  CHECK(flags[0].tokens == 55);
  CHECK_FALSE(flags[0].ended);
  // An out-of-order older chunk does not move progress back.
  t.observe(ev(1, 1, timing_kind::chunk, 18 * ms, 50, "w0"));
  CHECK(t.in_flight_stragglers(1)[0].tokens == 55);
  // "now" on w0's clock catches rollout 2, which sent no chunk; w1's rollout is judged on
  // w1's clock only.
  flags = t.in_flight_stragglers(1, {{"w0", 30 * ms}});
  CHECK(ids_of(flags) == std::vector<uint64_t>{1, 2});
  flags = t.in_flight_stragglers(1, {{"w0", 30 * ms}, {"w1", 26 * ms}});
  CHECK(ids_of(flags) == std::vector<uint64_t>{1, 2, 3}); // 26 − 5 = 21 > 20
  // Once ended, a rollout is judged by its duration, not in flight.
  t.observe(ev(1, 1, timing_kind::finish, 22 * ms, 60, "w0"));
  CHECK(ids_of(t.in_flight_stragglers(1, {{"w0", 30 * ms}})) == std::vector<uint64_t>{2});
  auto s = t.summary(1);
  CHECK(ids_of(s.stragglers) == std::vector<uint64_t>{1});
  CHECK(s.running == 2);
}

TEST_CASE("no in-flight flags before the window has enough samples", "[timing]") {
  rollout_timing t(rule(2.0, 8, 8));
  t.observe(ev(1, 0, timing_kind::start, 0));
  CHECK(t.in_flight_stragglers(0, {{"w0", 1'000'000 * ms}}).empty());
}

TEST_CASE("an aborted rollout past the threshold counts as a straggler but not as a duration",
          "[timing]") {
  rollout_timing t(rule(2.0, 16, 8));
  run_step(t, 0, {10, 10, 10, 10, 10, 10, 10, 10}, 0); // threshold 20 ms
  t.observe(ev(1, 1, timing_kind::start, 0));
  t.observe(ev(1, 1, timing_kind::abort, 25 * ms, 70));
  t.observe(ev(2, 1, timing_kind::start, 0));
  t.observe(ev(2, 1, timing_kind::abort, 5 * ms, 7));
  t.observe(ev(3, 1, timing_kind::start, 0));
  t.observe(ev(3, 1, timing_kind::finish, 10 * ms, 9));
  auto s = t.close_step(1);
  CHECK(s.aborted == 2);
  CHECK(s.finished == 1);
  CHECK(s.timed == 1);
  CHECK(s.tokens_max == 9); // tokens of finished rollouts only
  REQUIRE(ids_of(s.stragglers) == std::vector<uint64_t>{1});
  CHECK(s.stragglers[0].aborted);
  CHECK(s.stragglers[0].tokens == 70);
  CHECK(s.straggler_event);
  CHECK(t.rule().samples() == 9); // 8 + the one finished: aborted durations are censored
}

TEST_CASE("events out of order give the same statistics as events in order", "[timing]") {
  std::vector<timing_event> events;
  for (uint64_t k = 1; k <= 9; ++k) {
    const auto d = static_cast<int64_t>(k * k) * ms;
    const std::string w = k % 2 ? "a" : "b";
    events.push_back(ev(k, 0, timing_kind::start, 100, 0, w, k / 3));
    events.push_back(ev(k, 0, timing_kind::chunk, 100 + d / 2, 3, w, k / 3));
    events.push_back(ev(k, 0, timing_kind::finish, 100 + d, static_cast<int64_t>(k), w, k / 3));
  }
  rollout_timing in_order, reversed;
  for (const auto& e : events)
    in_order.observe(e);
  for (auto it = events.rbegin(); it != events.rend(); ++it)
    reversed.observe(*it);
  auto a = in_order.close_step(0);
  auto b = reversed.close_step(0);
  CHECK(a.timed == 9);
  CHECK(b.timed == 9);
  CHECK(a.duration_p50_ns == 25 * ms);
  CHECK(b.duration_p50_ns == a.duration_p50_ns);
  CHECK(b.duration_p90_ns == a.duration_p90_ns);
  CHECK(b.tokens_p99 == a.tokens_p99);
  CHECK(in_order.rule().durations() == reversed.rule().durations());
  CHECK(to_map(reversed.issues()).empty());
}

TEST_CASE("malformed and duplicate events are ignored with a counted reason", "[timing]") {
  rollout_timing t(rule(2.0, 8, 8));
  CHECK_FALSE(t.observe(ev(1, -1, timing_kind::start, 0)));
  CHECK_FALSE(t.observe(ev(1, 0, timing_kind::start, 0, 0, "")));
  CHECK_FALSE(t.observe(ev(1, 0, timing_kind::chunk, 0, -5)));

  // Duplicate finish: the first one stands.
  CHECK(t.observe(ev(1, 0, timing_kind::start, 0)));
  CHECK(t.observe(ev(1, 0, timing_kind::finish, 4 * ms, 4)));
  CHECK_FALSE(t.observe(ev(1, 0, timing_kind::finish, 9 * ms, 9)));
  // Duplicate start from the same worker: the earliest stands.
  CHECK(t.observe(ev(2, 0, timing_kind::start, 2 * ms)));
  CHECK_FALSE(t.observe(ev(2, 0, timing_kind::start, 1 * ms)));
  CHECK(t.observe(ev(2, 0, timing_kind::finish, 7 * ms, 2)));
  // End before start on the same clock.
  CHECK(t.observe(ev(3, 0, timing_kind::start, 10 * ms)));
  CHECK(t.observe(ev(3, 0, timing_kind::finish, 3 * ms, 1)));
  // Start and finish on different clocks (the restart's start never arrived).
  CHECK(t.observe(ev(4, 0, timing_kind::start, 0, 0, "w0")));
  CHECK(t.observe(ev(4, 0, timing_kind::finish, 5 * ms, 1, "w1")));
  // Finish without start, abort after finish, finish after abort, duplicate abort.
  CHECK(t.observe(ev(5, 0, timing_kind::finish, 5 * ms, 1)));
  CHECK_FALSE(t.observe(ev(1, 0, timing_kind::abort, 5 * ms)));
  CHECK(t.observe(ev(6, 0, timing_kind::start, 0)));
  CHECK(t.observe(ev(6, 0, timing_kind::abort, 1 * ms)));
  CHECK_FALSE(t.observe(ev(6, 0, timing_kind::finish, 2 * ms)));
  CHECK_FALSE(t.observe(ev(6, 0, timing_kind::abort, 2 * ms)));

  auto s = t.close_step(0);
  CHECK(s.finished == 5);
  CHECK(s.aborted == 1);
  CHECK(s.timed == 2); // rollouts 1 (4 ms) and 2 (6 ms)
  CHECK(s.duration_p50_ns == 4 * ms);
  CHECK(s.duration_max_ns == 6 * ms);
  CHECK(count(s.issues, timing_issue::no_worker) == 1);
  CHECK(count(s.issues, timing_issue::negative_tokens) == 1);
  CHECK(count(s.issues, timing_issue::duplicate_finish) == 1);
  CHECK(count(s.issues, timing_issue::duplicate_start) == 1);
  CHECK(count(s.issues, timing_issue::negative_duration) == 1);
  CHECK(count(s.issues, timing_issue::clock_mismatch) == 1);
  CHECK(count(s.issues, timing_issue::missing_start) == 1);
  CHECK(count(s.issues, timing_issue::event_after_end) == 2);
  CHECK(count(s.issues, timing_issue::duplicate_abort) == 1);

  // Events of a closed step are late; closing it again is the caller's mistake.
  CHECK_FALSE(t.observe(ev(7, 0, timing_kind::start, 0)));
  CHECK_THROWS_WITH(t.close_step(0), Catch::Contains("not after the last closed step 0"));

  // NaN and negative durations offered to the rule directly (e.g. from a simulator).
  straggler_rule r;
  CHECK_FALSE(r.add(std::numeric_limits<double>::quiet_NaN()));
  CHECK_FALSE(r.add(std::numeric_limits<double>::infinity()));
  CHECK_FALSE(r.add(-1.0));
  CHECK(r.samples() == 0);
  CHECK(count(r.rejected(), timing_issue::non_finite_duration) == 2);
  CHECK(count(r.rejected(), timing_issue::negative_duration) == 1);

  // The run-wide counters hold event-time and close-time issues alike.
  auto all = to_map(t.issues());
  CHECK(all.at("bad_step") == 1);
  CHECK(all.at("late_event") == 1);
  CHECK(all.at("clock_mismatch") == 1);
  CHECK(all.at("negative_duration") == 1);
  CHECK(all.at("event_after_end") == 2);
  CHECK(all.count("skipped_step") == 0);
}

TEST_CASE("a rollout re-placed on another worker restarts its clock there", "[timing]") {
  rollout_timing t;
  t.observe(ev(1, 0, timing_kind::start, 100 * ms, 0, "lost"));
  t.observe(ev(1, 0, timing_kind::chunk, 150 * ms, 30, "lost"));
  // The new worker's clock is unrelated to the old one (here: far smaller).
  t.observe(ev(1, 0, timing_kind::start, 2 * ms, 0, "spare"));
  t.observe(ev(1, 0, timing_kind::finish, 9 * ms, 12, "spare"));
  auto s = t.close_step(0);
  CHECK(t.restarts() == 1);
  CHECK(s.started == 1);
  CHECK(s.timed == 1);
  CHECK(s.duration_max_ns == 7 * ms);
  CHECK(s.tokens_max == 12);
}

TEST_CASE("closing a later step discards older open steps as skipped", "[timing]") {
  rollout_timing t;
  t.observe(ev(1, 3, timing_kind::start, 0));
  t.observe(ev(2, 3, timing_kind::start, 0));
  t.observe(ev(3, 4, timing_kind::start, 0));
  t.observe(ev(3, 4, timing_kind::finish, 1 * ms, 1));
  auto s = t.close_step(4);
  CHECK(s.timed == 1);
  CHECK(t.issues(timing_issue::skipped_step) == 2);
  CHECK(t.last_closed_step() == std::optional<int64_t>(4));
  CHECK(t.summary(3).started == 0);
}

TEST_CASE("invalid straggler rule options are rejected", "[timing]") {
  CHECK_THROWS_AS(straggler_rule(rule(0.0, 8)), std::invalid_argument);
  CHECK_THROWS_AS(straggler_rule(rule(std::nan(""), 8)), std::invalid_argument);
  CHECK_THROWS_AS(straggler_rule(rule(2.0, 0, 1)), std::invalid_argument);
  CHECK_THROWS_AS(straggler_rule(rule(2.0, 4, 8)), std::invalid_argument);
  CHECK_THROWS_AS(straggler_rule(rule(2.0, 4, 0)), std::invalid_argument);
}
