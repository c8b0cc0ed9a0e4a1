#include "actors/sagc/simulator.hpp"

#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

using namespace sorl::sagc;

namespace {

/// Returns a fixed decision and records what it is fed back.
class scripted_policy final : public group_policy {
public:
  explicit scripted_policy(group_decision d) : d_(std::move(d)) {
  }
  group_decision decide(int64_t step) override {
    group_decision d = d_;
    d.step = step;
    return d;
  }
  void observe(const step_timing& timing, const straggler_rule& rule) override {
    timings.push_back(timing);
    windows.emplace_back(rule.durations().begin(), rule.durations().end());
  }
  std::vector<step_timing> timings;
  std::vector<std::vector<double>> windows;

private:
  group_decision d_;
};

group_decision fixed(int64_t g) {
  group_decision d;
  d.group_size = g;
  d.policy = "scripted";
  return d;
}

/// Every rollout takes exactly `seconds` at concurrency 1.
sim_options constant(double seconds) {
  sim_options o;
  o.durations.trace_s = {seconds};
  o.steps = 1;
  return o;
}

} // namespace

TEST_CASE("base durations are common random numbers keyed by seed, step, prompt and index",
          "[simulator]") {
  sim_options o;
  o.durations.tail_fraction = 0.5;
  const double a = sim_base_duration(o, 3, 1, 2);
  CHECK(sim_base_duration(o, 3, 1, 2) == a);
  CHECK(sim_base_duration(o, 3, 1, 3) != a);
  o.seed = 2;
  CHECK(sim_base_duration(o, 3, 1, 2) != a);
  // The lognormal body with σ = 0 is exactly the median; long ones lie in [x_m, cap].
  sim_options body;
  body.durations.sigma = 0;
  CHECK(sim_base_duration(body, 0, 0, 0) == 20.0);
  sim_options tail;
  tail.durations.tail_fraction = 1;
  for (int64_t k = 0; k < 100; ++k) {
    const double d = sim_base_duration(tail, 0, 0, k);
    CHECK(d >= 60.0);
    CHECK(d <= 300.0);
  }
}

TEST_CASE("processor-shared workers stretch durations with load, by hand", "[simulator]") {
  // One worker, two slots, β = 1: two rollouts of 10 s share it at rate 1/2 and finish at
  // 20 s; the third gets a slot at 20 s and runs alone, finishing at 30 s.
  sim_options o = constant(10);
  o.workers = 1;
  o.batch_limit = 2;
  o.load_slowdown = 1;
  o.prompts_per_step = 1;
  scripted_policy p(fixed(3));
  const sim_result r = simulate(p, o);
  REQUIRE(r.steps.size() == 1);
  const sim_step& s = r.steps[0];
  CHECK(s.rollout_phase_s == Approx(30));
  CHECK(s.finished == 3);
  CHECK(s.trained_tokens == Approx(3 * 10 * 40.0));
  // 30 s + 1200 tokens / 20000 tokens/s + 1 s overhead.
  CHECK(s.step_s == Approx(31.06));
  CHECK(s.utility == Approx(2.0 / 3));
  // The worker stamps starts when a slot frees: durations 20, 20 and 10 s.
  REQUIRE(p.windows.size() == 1);
  CHECK(p.windows[0] == std::vector<double>{20e9, 20e9, 10e9});
  CHECK(p.timings[0].finished == 3);
}

TEST_CASE("a deadline cuts the step once every group has its minimum finished",
          "[simulator]") {
  // One worker, one slot, no slowdown: rollouts of prompt 0 finish at 10 and 20 s, those of
  // prompt 1 at 30 and 40 s. Deadline 15 s, min_finished 1: prompt 1 first finishes at
  // 30 s, so the cut is at 30 s; the last rollout (started at 30 s) is aborted.
  sim_options o = constant(10);
  o.workers = 1;
  o.batch_limit = 1;
  o.load_slowdown = 0;
  o.prompts_per_step = 2;
  group_decision d = fixed(2);
  d.deadline_ns = 15'000'000'000;
  d.min_finished = 1;
  scripted_policy p(d);
  sim_result r = simulate(p, o);
  CHECK(r.steps[0].rollout_phase_s == Approx(30));
  CHECK(r.steps[0].finished == 3);
  CHECK(r.steps[0].aborted == 1);
  CHECK(r.steps[0].utility == Approx((0.5 + 0.0) / 2));
  CHECK(p.timings[0].aborted == 1);
  CHECK(r.summary.cut_fraction == Approx(0.25));

  // min_finished 2: prompt 1 needs its second rollout (40 s), the end of the step anyway.
  d.min_finished = 2;
  scripted_policy all(d);
  r = simulate(all, o);
  CHECK(r.steps[0].rollout_phase_s == Approx(40));
  CHECK(r.steps[0].aborted == 0);
}

TEST_CASE("a deadline trains shorter responses than it samples", "[simulator]") {
  sim_options o;
  o.durations.tail_fraction = 0.02;
  o.steps = 200;
  group_policy_options d;
  d.policy = sorl::group_policy_kind::deadline;
  d.group_size = 8;
  d.prompts_per_step = o.prompts_per_step;
  auto p = make_group_policy(d);
  const sim_summary m = simulate(*p, o).summary;
  CHECK(m.cut_fraction > 0);
  CHECK(m.length_ratio < 1);
  CHECK(m.straggler_rate < 0.05);
}

namespace {

/// sagc with G in [2, 32], starting at 8, for the simulator's B.
group_policy_options sagc_options(const sim_options& o) {
  group_policy_options s;
  s.policy = sorl::group_policy_kind::sagc;
  s.g_min = 2;
  s.g_max = 32;
  s.group_size = 8;
  s.prompts_per_step = o.prompts_per_step;
  return s;
}

} // namespace

TEST_CASE("in the light-tailed scenario sagc settles at g_max", "[simulator]") {
  sim_options o;
  o.durations.sigma = 0.25;
  o.steps = 300;
  auto s = sagc_options(o);
  auto p = make_group_policy(s);
  const sim_result r = simulate(*p, o);
  for (size_t t = 10; t < r.steps.size(); ++t)
    CHECK(r.steps[t].decision.group_size == 32);
  CHECK(r.summary.straggler_rate == 0);
}

TEST_CASE("a tail schedule is piecewise linear in the step and constant outside its knots",
          "[simulator]") {
  sim_durations d;
  d.tail_fraction = 0.3; // ignored once there is a schedule
  CHECK(sim_tail_fraction(d, 7) == 0.3);
  d.tail_schedule = {{100, 0.0}, {200, 0.01}};
  CHECK(sim_tail_fraction(d, 0) == 0.0);
  CHECK(sim_tail_fraction(d, 100) == 0.0);
  CHECK(sim_tail_fraction(d, 150) == Approx(0.005));
  CHECK(sim_tail_fraction(d, 200) == Approx(0.01));
  CHECK(sim_tail_fraction(d, 5000) == Approx(0.01));
  // The same (seed, step, prompt, index) gives the same duration whatever else ran, and a
  // step with q = 1 draws only long rollouts.
  sim_options o;
  o.durations.tail_schedule = {{0, 0.0}, {10, 1.0}};
  CHECK(sim_base_duration(o, 5, 2, 3) == sim_base_duration(o, 5, 2, 3));
  for (int64_t k = 0; k < 50; ++k)
    CHECK(sim_base_duration(o, 10, 0, k) >= 60.0);
}

TEST_CASE("in a drifting-tail scenario sagc uses larger groups while the tail is light",
          "[simulator]") {
  // The bench's drifting scenario, shortened: q = 0 for steps [0, 400), linear to 0.5% over
  // [400, 800), 0.5% over [800, 1200). Seed 1 fixed.
  sim_options o;
  o.durations.sigma = 0.3;
  o.durations.tail_schedule = {{400, 0.0}, {800, 0.005}};
  o.steps = 1200;
  o.seed = 1;
  auto s = sagc_options(o);
  sagc_group_policy p(s);
  const sim_result r = simulate(p, o);
  const auto mean_g = [&](size_t begin, size_t end) {
    double g = 0;
    for (size_t t = begin; t < end; ++t)
      g += static_cast<double>(r.steps[t].decision.group_size);
    return g / static_cast<double>(end - begin);
  };
  const double light = mean_g(0, 400);
  const double heavy = mean_g(800, 1200);
  CHECK(light > 24);
  CHECK(heavy < 8);
  CHECK(light > heavy);
  // Overall rate ≤ ε + 0.02: about two binomial standard errors at ε = 0.1 over 1200 steps
  // (sqrt(0.09 / 1200) ≈ 0.009), the room the queue's start-up transient needs.
  CHECK(r.summary.straggler_rate <= s.target_rate + 0.02);
  CHECK(r.summary.weighted_rollouts_per_s > 0);
}

TEST_CASE("the best static G is the largest one whose rate meets epsilon, over every G",
          "[simulator]") {
  // ε = 0.1 over 100 steps: slack sqrt(0.1 × 0.9 / 100) = 0.03, so a rate ≤ 0.13 meets it.
  CHECK(meets_straggler_target(0.13, 0.1, 100));
  CHECK_FALSE(meets_straggler_target(0.1301, 0.1, 100));
  auto run = [](double g, double rate) {
    sim_summary m;
    m.label = "static " + std::to_string(static_cast<int>(g));
    m.mean_g = g;
    m.straggler_rate = rate;
    return m;
  };
  // Rates grow with G, not strictly: G = 6 is the largest that meets ε, and G = 3 sits in
  // between (a noisy run). On the grid {4, 8} alone the choice would be G = 4.
  const std::vector<sim_summary> every{run(2, 0.01), run(3, 0.2),  run(4, 0.05), run(5, 0.08),
                                       run(6, 0.125), run(7, 0.16), run(8, 0.3)};
  const auto b = best_static(every, 0.1, 100);
  CHECK(b.meets);
  CHECK(every[b.index].mean_g == 6);
  const std::vector<sim_summary> grid{run(4, 0.05), run(8, 0.3)};
  CHECK(grid[best_static(grid, 0.1, 100).index].mean_g == 4);
  // None meets ε: the lowest rate, ties to the larger G.
  const std::vector<sim_summary> none{run(2, 0.5), run(3, 0.4), run(4, 0.4), run(5, 0.6)};
  const auto n = best_static(none, 0.1, 100);
  CHECK_FALSE(n.meets);
  CHECK(none[n.index].mean_g == 4);
  CHECK_THROWS_AS(best_static({}, 0.1, 100), std::invalid_argument);
}

TEST_CASE("the best static G on the objective is the most utility-weighted rollouts per "
          "second, with or without the straggler constraint",
          "[simulator]") {
  auto run = [](double g, double rate, double weighted) {
    sim_summary m;
    m.mean_g = g;
    m.straggler_rate = rate;
    m.weighted_rollouts_per_s = weighted;
    return m;
  };
  // ε = 0.1 over 100 steps: a rate <= 0.13 meets it (the test above). G = 6 is the largest
  // G that meets ε (best_static), but G = 5 has more U-roll/s among those that do; G = 8
  // breaks ε and has the most of all.
  const std::vector<sim_summary> every{run(2, 0.01, 1.0), run(4, 0.05, 1.7), run(5, 0.08, 2.1),
                                       run(6, 0.125, 2.0), run(7, 0.16, 2.2),
                                       run(8, 0.3, 2.4)};
  CHECK(every[best_static(every, 0.1, 100).index].mean_g == 6);
  const auto c = best_static_on_objective(every, true, 0.1, 100);
  REQUIRE(c);
  CHECK(every[*c].mean_g == 5);
  const auto o = best_static_on_objective(every, false, 0.1, 100);
  REQUIRE(o);
  CHECK(every[*o].mean_g == 8);
  // Ties on the objective: the lower rate, then the smaller G.
  const std::vector<sim_summary> tied{run(3, 0.05, 2.0), run(4, 0.02, 2.0), run(2, 0.02, 2.0)};
  CHECK(tied[*best_static_on_objective(tied, false, 0.1, 100)].mean_g == 2);
  // None meets ε: nothing under the constraint, the objective's best without it.
  const std::vector<sim_summary> none{run(2, 0.5, 1.0), run(3, 0.4, 1.5)};
  CHECK_FALSE(best_static_on_objective(none, true, 0.1, 100));
  CHECK(none[*best_static_on_objective(none, false, 0.1, 100)].mean_g == 3);
  CHECK_FALSE(best_static_on_objective({}, false, 0.1, 100));
}

TEST_CASE("simulator options out of range are rejected by name", "[simulator]") {
  static_group_policy p(4);
  sim_options o;
  o.workers = 0;
  CHECK_THROWS_WITH(simulate(p, o), Catch::StartsWith("sim_options.workers:"));
  o = sim_options{};
  o.durations.trace_s = {1.0, -2.0};
  CHECK_THROWS_WITH(simulate(p, o), Catch::StartsWith("sim_options.durations.trace_s:"));
  o = sim_options{};
  o.durations.tail_fraction = 2;
  CHECK_THROWS_WITH(simulate(p, o), Catch::StartsWith("sim_options.durations.tail_fraction:"));
  o = sim_options{};
  o.durations.tail_schedule = {{10, 0.0}, {10, 0.01}};
  CHECK_THROWS_WITH(simulate(p, o), Catch::StartsWith("sim_options.durations.tail_schedule:"));
  o.durations.tail_schedule = {{0, 0.0}, {10, 1.5}};
  CHECK_THROWS_WITH(simulate(p, o), Catch::StartsWith("sim_options.durations.tail_schedule:"));
}

TEST_CASE("a duration trace is read one per line, with a header, comments and CSV",
          "[simulator]") {
  const std::string path = std::string(SORL_TEST_DATA_DIR) + "/sagc_trace.csv";
  {
    std::ofstream f(path);
    f << "duration_s,tokens\n# a comment\n\n12.5,300\n  3\n0\n7e1\n";
  }
  CHECK(read_duration_trace(path) == std::vector<double>{12.5, 3, 0, 70});
  {
    std::ofstream f(path);
    f << "1.5\n2.5\nnan\n";
  }
  CHECK_THROWS_WITH(read_duration_trace(path), Catch::Contains("sagc_trace.csv:3: 'nan'"));
  {
    std::ofstream f(path);
    f << "1.5\n-2\n";
  }
  CHECK_THROWS_WITH(read_duration_trace(path), Catch::Contains(":2: '-2'"));
  {
    std::ofstream f(path);
    f << "# nothing\n";
  }
  CHECK_THROWS_WITH(read_duration_trace(path), Catch::Contains("holds no durations"));
  CHECK_THROWS_AS(read_duration_trace(path + ".missing"), std::runtime_error);
}
