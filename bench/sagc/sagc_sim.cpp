// Group-size policies on a simulated synchronous RL cluster (ARCHITECTURE.md §6 SAGC):
// static G for every G in [g_min, g_max] (the range sagc picks from), the deadline baseline,
// and the adaptive sagc controller, each
// driving the same simulator (actors/sagc/simulator.hpp, which documents the model) with
// the same random rollouts, through the same group_policy objects and rollout_timing the
// sagc_controller actor uses. Prints one table per scenario:
//
//   1. long-tailed (default): a lognormal body plus rare Pareto "long" rollouts, like
//      multi-turn agentic rollouts with slow tool calls; or `--trace FILE` (durations in
//      seconds, one per line) resampled;
//   2. light-tailed: a lognormal body only, where sagc should settle at g_max;
//   3. drifting tail: the long-tailed mixture with a tail probability that grows over the
//      run (a modelling assumption of how a workload drifts as the policy learns: longer
//      responses and more multi-turn agentic rollouts): q = 0 over the first third of the
//      steps (light phase), linear from 0 to q_end over the middle third (ramp), q_end over
//      the last third (heavy phase); q_end = 0.5% by default (--drift-tail). The best static
//      G is chosen as in the other scenarios, on its rate over the whole run; per-phase
//      mean G, straggler-event rate and utility-weighted rollouts/s are printed for sagc and
//      that static G.
//
// After each scenario's table, a second one puts sagc next to every static G in
// [g_min, g_max] and the deadline baseline on the objective (utility-weighted rollouts/s and
// rollouts/s, as ratios sagc / that policy) and on the straggler-event rate, and marks three
// static G (actors/sagc/simulator.hpp): L, the largest G whose rate meets ε (best_static:
// the most mean U under the constraint, sagc's own objective); C, the most U-roll/s among
// the G that meet ε; O, the most U-roll/s of all, constraint ignored
// (best_static_on_objective). A static G that breaks ε can beat sagc on the objective:
// the constraint costs throughput, and the O row says how much.
//
// Column "U-roll/s": utility-weighted rollouts per second, Σ_t Σ_j n_tj·U(n_tj) / total
// time, n_tj = finished rollouts of prompt j at step t, U(n) = 1 − 1/n (without a cut,
// Σ_t U(G_t)·B·G_t / total time). Useful samples per second of wall clock: if progress
// towards a reward is proportional to them (an assumption), the time to reach a reward
// scales as its inverse. See actors/sagc/simulator.hpp.
//
// Usage: sagc_sim [--trace FILE] [--steps N] [--seed S] [--prompts B] [--workers W]
//                 [--batch-limit L] [--epsilon E] [--v V] [--kappa K] [--deadline-kappa K]
//                 [--straggler-rule wall_clock|group_tokens]
//                 [--drift-tail Q] [--g-min G] [--g-max G] [--group-size G]
//                 [--load-slowdown BETA] [--decode-tokens-per-s R]
//                 [--learner-tokens-per-s R] [--overhead-s S] [--scenarios long,light,drift]
//                 [--record PATH]
// (--group-size: sagc's initial G and the deadline baseline's G; --scenarios: which tables,
// "long" being the trace when --trace is given; the rest set sim_options.) The run's record
// (bench/record.hpp) holds every table printed: per scenario S, "S" (every policy), "S-vs-sagc"
// (sagc against each) and, for the drift, "drift-phases"; it goes to --record PATH, else
// $SORL_BENCH_RECORD, else runs/bench/.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "actors/sagc/group_policy.hpp"
#include "actors/sagc/simulator.hpp"
#include "bench/record.hpp"

using namespace sorl::sagc;

namespace {

struct args {
  std::string trace;
  sim_options sim;
  group_policy_options policy;
  double drift_tail = 0.005; ///< q at the end of the drifting scenario
  /// Comma-separated scenarios to run: "long" (the long-tailed mixture, or the trace),
  /// "light", "drift".
  std::string scenarios = "long,light,drift";
  std::string record; ///< --record PATH; "" = record_path's default
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "sagc_sim: %s\nusage: sagc_sim [--trace FILE] [--steps N] [--seed S] "
               "[--prompts B] [--workers W] [--batch-limit L] [--epsilon E] [--v V] "
               "[--kappa K] [--deadline-kappa K] [--straggler-rule wall_clock|group_tokens] "
               "[--drift-tail Q] [--g-min G] [--g-max G] "
               "[--group-size G] [--load-slowdown BETA] [--decode-tokens-per-s R] "
               "[--learner-tokens-per-s R] [--overhead-s S] [--scenarios long,light,drift] "
               "[--record PATH]\n",
               why);
  std::exit(2);
}

double number(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0')
    usage((flag + " needs a number, got '" + text + "'").c_str());
  return v;
}

args parse(int argc, char** argv) {
  args a;
  a.sim.steps = 5000;
  a.sim.prompts_per_step = 8;
  a.policy.g_min = 2;
  a.policy.g_max = 32;
  a.policy.group_size = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help")
      usage("help");
    if (i + 1 >= argc)
      usage((flag + " needs a value").c_str());
    const char* value = argv[++i];
    if (flag == "--trace")
      a.trace = value;
    else if (flag == "--steps")
      a.sim.steps = static_cast<int64_t>(number(flag, value));
    else if (flag == "--seed")
      a.sim.seed = static_cast<uint64_t>(number(flag, value));
    else if (flag == "--prompts")
      a.sim.prompts_per_step = static_cast<int64_t>(number(flag, value));
    else if (flag == "--workers")
      a.sim.workers = static_cast<int64_t>(number(flag, value));
    else if (flag == "--batch-limit")
      a.sim.batch_limit = static_cast<int64_t>(number(flag, value));
    else if (flag == "--epsilon")
      a.policy.target_rate = number(flag, value);
    else if (flag == "--v")
      a.policy.v = number(flag, value);
    else if (flag == "--kappa")
      a.sim.rule.kappa = number(flag, value);
    else if (flag == "--deadline-kappa")
      a.policy.deadline_kappa = number(flag, value);
    else if (flag == "--straggler-rule") {
      const std::string rule = value;
      if (rule == "wall_clock")
        a.sim.rule.kind = sorl::straggler_rule_kind::wall_clock;
      else if (rule == "group_tokens")
        a.sim.rule.kind = sorl::straggler_rule_kind::group_tokens;
      else
        usage(("--straggler-rule: '" + rule + "' is not wall_clock or group_tokens").c_str());
    }
    else if (flag == "--drift-tail")
      a.drift_tail = number(flag, value);
    else if (flag == "--g-min")
      a.policy.g_min = static_cast<int64_t>(number(flag, value));
    else if (flag == "--g-max")
      a.policy.g_max = static_cast<int64_t>(number(flag, value));
    else if (flag == "--group-size")
      a.policy.group_size = static_cast<int64_t>(number(flag, value));
    else if (flag == "--load-slowdown")
      a.sim.load_slowdown = number(flag, value);
    else if (flag == "--decode-tokens-per-s")
      a.sim.decode_tokens_per_s = number(flag, value);
    else if (flag == "--learner-tokens-per-s")
      a.sim.learner_tokens_per_s = number(flag, value);
    else if (flag == "--overhead-s")
      a.sim.overhead_s = number(flag, value);
    else if (flag == "--scenarios")
      a.scenarios = value;
    else if (flag == "--record")
      a.record = value;
    else
      usage(("unknown option " + flag).c_str());
  }
  a.policy.prompts_per_step = a.sim.prompts_per_step;
  size_t from = 0;
  while (from <= a.scenarios.size()) {
    const size_t comma = std::min(a.scenarios.find(',', from), a.scenarios.size());
    const std::string name = a.scenarios.substr(from, comma - from);
    if (name != "long" && name != "light" && name != "drift")
      usage(("--scenarios: unknown scenario '" + name + "' (long, light, drift)").c_str());
    from = comma + 1;
  }
  return a;
}

/// Prints a policy's row and adds it to the scenario's record table.
void print_row(const sim_summary& m, sorl::bench::record_table& t) {
  std::printf("%-12s %6.2f %8.3f %9.1f %9.1f %10.3f %7.3f %6.2f %7.3f %8.3f\n",
              m.label.c_str(), m.mean_g, m.straggler_rate, m.mean_step_s, m.p99_step_s,
              m.rollouts_per_s, m.mean_utility, 100 * m.cut_fraction, m.length_ratio,
              m.weighted_rollouts_per_s);
  t.add_row({m.label, m.mean_g, m.straggler_rate, m.mean_step_s, m.p99_step_s, m.rollouts_per_s,
             m.mean_utility, 100 * m.cut_fraction, m.length_ratio, m.weighted_rollouts_per_s});
}

/// A named range of steps [begin, end) summarised on its own.
struct phase {
  std::string name;
  int64_t begin = 0;
  int64_t end = 0;
};

sim_summary summarize_phase(const std::vector<sim_step>& steps, const phase& ph) {
  const auto n = static_cast<int64_t>(steps.size());
  const int64_t b = std::clamp<int64_t>(ph.begin, 0, n);
  const int64_t e = std::clamp<int64_t>(ph.end, b, n);
  return summarize(std::vector<sim_step>(steps.begin() + b, steps.begin() + e), ph.name);
}

void run_scenario(const std::string& name, const std::string& title, const sim_options& sim,
                  const group_policy_options& base, sorl::bench::bench_record& rec,
                  const std::vector<phase>& phases = {}) {
  std::printf("\n== %s ==\n", title.c_str());
  sorl::bench::record_table& table =
    rec.add_table(name, title,
                  {{"policy", "policy"},
                   {"mean_g", "mean G", "", 2},
                   {"straggler_rate", "steps with a straggler", "share", 3},
                   {"step_mean_s", "step mean", "s", 1},
                   {"step_p99_s", "step p99", "s", 1},
                   {"rollouts_per_s", "rollouts/s", "1/s", 3},
                   {"mean_u", "mean U", "", 3},
                   {"cut", "cut", "%", 2},
                   {"length_ratio", "length ratio", "", 3},
                   {"u_rollouts_per_s", "U-roll/s", "1/s", 3}});
  std::printf("%-12s %6s %8s %9s %9s %10s %7s %6s %7s %8s\n", "policy", "mean G", "strag/st",
              "step mean", "step p99", "rollouts/s", "mean U", "cut %", "len rat", "U-roll/s");
  std::vector<sim_summary> statics;
  std::vector<std::vector<sim_step>> static_steps;
  for (int64_t g = base.g_min; g <= base.g_max; ++g) {
    static_group_policy p(g);
    sim_result r = simulate(p, sim, "static " + std::to_string(g));
    statics.push_back(r.summary);
    if (!phases.empty())
      static_steps.push_back(std::move(r.steps));
    print_row(statics.back(), table);
  }
  group_policy_options d = base;
  d.policy = sorl::group_policy_kind::deadline;
  auto deadline = make_group_policy(d);
  const sim_summary deadline_run =
    simulate(*deadline, sim, "deadline " + std::to_string(d.group_size)).summary;
  print_row(deadline_run, table);
  group_policy_options s = base;
  s.policy = sorl::group_policy_kind::sagc;
  sagc_group_policy sagc(s);
  const sim_result sagc_run = simulate(sagc, sim, "sagc");
  const sim_summary& m = sagc_run.summary;
  print_row(m, table);
  sorl::bench::record_table& versus =
    rec.add_table(name + "-vs-sagc", "sagc against every static G and the deadline: " + title,
                  {{"policy", "policy"},
                   {"mean_g", "mean G", "", 2},
                   {"straggler_rate", "steps with a straggler", "share", 3},
                   {"meets", "meets ε"},
                   {"u_rollouts_per_s", "U-roll/s", "1/s", 3, true},
                   {"rollouts_per_s", "rollouts/s", "1/s", 3, true},
                   {"sagc_over_u", "sagc / it, U-roll/s", "", 3},
                   {"sagc_over_rollouts", "sagc / it, rollouts/s", "", 3},
                   {"mark", "mark"}});

  // Every static G next to sagc on the objective and on the constraint, with three marks:
  // L, the largest G that meets epsilon (best_static: what sagc's own objective, mean U,
  // prefers under the constraint); C, the most U-roll/s among the G that meet epsilon; O,
  // the most U-roll/s of all (best_static_on_objective, actors/sagc/simulator.hpp).
  const best_static_choice largest = best_static(statics, base.target_rate, sim.steps);
  const auto on_c = best_static_on_objective(statics, true, base.target_rate, sim.steps);
  const auto on_o = best_static_on_objective(statics, false, base.target_rate, sim.steps);
  std::printf("sagc vs every static G and the deadline (objective: U-roll/s; ratio > 1: sagc "
              "ahead; meets: strag/st <= epsilon + 1 s.e.):\n");
  std::printf("  %-12s %6s %8s %6s %8s %10s %12s %13s  %s\n", "policy", "mean G", "strag/st",
              "meets", "U-roll/s", "rollouts/s", "sagc/x U-r/s", "sagc/x roll/s", "mark");
  auto compare = [&](const sim_summary& x, const std::string& mark) {
    const bool meets = meets_straggler_target(x.straggler_rate, base.target_rate, sim.steps);
    versus.add_row({x.label, x.mean_g, x.straggler_rate, meets ? "yes" : "no",
                    x.weighted_rollouts_per_s, x.rollouts_per_s,
                    m.weighted_rollouts_per_s / x.weighted_rollouts_per_s,
                    m.rollouts_per_s / x.rollouts_per_s, mark});
    std::printf("  %-12s %6.2f %8.3f %6s %8.3f %10.3f %12.3f %13.3f  %s\n", x.label.c_str(),
                x.mean_g, x.straggler_rate,
                meets_straggler_target(x.straggler_rate, base.target_rate, sim.steps) ? "yes"
                                                                                     : "no",
                x.weighted_rollouts_per_s, x.rollouts_per_s,
                m.weighted_rollouts_per_s / x.weighted_rollouts_per_s,
                m.rollouts_per_s / x.rollouts_per_s, mark.c_str());
  };
  for (size_t i = 0; i < statics.size(); ++i) {
    std::string mark;
    if (largest.meets && largest.index == i)
      mark += "L";
    if (on_c == i)
      mark += "C";
    if (on_o == i)
      mark += "O";
    compare(statics[i], mark);
  }
  compare(deadline_run, "");
  compare(m, "");
  std::printf("marks: L = largest static G meeting epsilon (max mean U under the constraint, "
              "sagc's own objective); C = most U-roll/s among static G meeting epsilon; O = "
              "most U-roll/s among all static G\n");
  auto verdict = [&](const char* what, const sim_summary& x) {
    std::printf("sagc vs %s (%s, strag/st %.3f): U-roll/s x%.3f, rollouts/s x%.3f, mean U "
                "x%.3f, mean step time x%.3f\n",
                what, x.label.c_str(), x.straggler_rate,
                m.weighted_rollouts_per_s / x.weighted_rollouts_per_s,
                m.rollouts_per_s / x.rollouts_per_s, m.mean_utility / x.mean_utility,
                m.mean_step_s / x.mean_step_s);
  };
  if (largest.meets)
    verdict("L, the largest static G meeting epsilon", statics[largest.index]);
  if (on_c)
    verdict("C, the best static G on U-roll/s meeting epsilon", statics[*on_c]);
  else
    std::printf("no static G in [g_min, g_max] meets epsilon\n");
  verdict("O, the best static G on U-roll/s, constraint ignored", statics[*on_o]);
  std::printf("sagc: final Q = %.2f, straggler rate %.4f vs epsilon %.3f\n",
              sagc.virtual_queue(), m.straggler_rate, base.target_rate);
  if (phases.empty())
    return;
  std::vector<size_t> shown;
  if (on_c)
    shown.push_back(*on_c);
  if (!on_c || *on_c != *on_o)
    shown.push_back(*on_o);
  std::printf("per phase (mean G, strag/st, U-roll/s):\n");
  sorl::bench::record_table& per_phase =
    rec.add_table(name + "-phases", "per phase, sagc and the best static G: " + title,
                  {{"phase", "phase"},
                   {"policy", "policy"},
                   {"mean_g", "mean G", "", 2},
                   {"straggler_rate", "steps with a straggler", "share", 3},
                   {"u_rollouts_per_s", "U-roll/s", "1/s", 3}});
  for (const auto& ph : phases) {
    const sim_summary a = summarize_phase(sagc_run.steps, ph);
    per_phase.add_row({ph.name, "sagc", a.mean_g, a.straggler_rate, a.weighted_rollouts_per_s});
    std::printf("  %-34s sagc %5.2f %6.3f %7.3f", ph.name.c_str(), a.mean_g, a.straggler_rate,
                a.weighted_rollouts_per_s);
    for (size_t i : shown) {
      const sim_summary c = summarize_phase(static_steps[i], ph);
      std::printf(" | %-9s %5.2f %6.3f %7.3f", statics[i].label.c_str(), c.mean_g,
                  c.straggler_rate, c.weighted_rollouts_per_s);
      per_phase.add_row({ph.name, statics[i].label, c.mean_g, c.straggler_rate,
                         c.weighted_rollouts_per_s});
    }
    std::printf("\n");
  }
}

/// The long-tailed and drifting scenarios' mixture, less its tail probability:
/// lognormal(median 20 s, sigma 0.3) + Pareto(x_m 60 s, alpha 1.5, cap 300 s).
void set_long_tailed_mixture(sim_durations& d) {
  d.median_s = 20;
  d.sigma = 0.3;
  d.tail_xm_s = 60;
  d.tail_alpha = 1.5;
  d.tail_cap_s = 300;
}

} // namespace

int main(int argc, char** argv) try {
  args a = parse(argc, argv);
  sorl::bench::bench_record rec("sagc-sim", argc, argv);
  rec.set_threads(1);
  const sim_options& o = a.sim;
  rec.set_parameter("steps", o.steps);
  rec.set_parameter("seed", static_cast<double>(o.seed));
  rec.set_parameter("prompts", o.prompts_per_step);
  rec.set_parameter("workers", o.workers);
  rec.set_parameter("g_min", a.policy.g_min);
  rec.set_parameter("g_max", a.policy.g_max);
  rec.set_parameter("epsilon", a.policy.target_rate);
  std::printf("sagc_sim: %lld steps per policy, seed %llu; B = %lld prompts, W = %lld workers x "
              "batch limit %lld, load slowdown beta = %g per concurrent rollout; tokens = %g x "
              "base seconds, learner %g tokens/s, overhead %g s per step\n",
              static_cast<long long>(o.steps), static_cast<unsigned long long>(o.seed),
              static_cast<long long>(o.prompts_per_step), static_cast<long long>(o.workers),
              static_cast<long long>(o.batch_limit), o.load_slowdown, o.decode_tokens_per_s,
              o.learner_tokens_per_s, o.overhead_s);
  std::printf("straggler rule: %s, kappa %g x %s (window %zu, min %zu); "
              "sagc: G in [%lld, %lld], initial %lld, epsilon %g, V %g, tail prior %g; "
              "deadline: G %lld, %g x median, cut after >= %lld finished per group\n",
              o.rule.kind == sorl::straggler_rule_kind::group_tokens ? "group_tokens"
                                                                      : "wall_clock",
              o.rule.kappa,
              o.rule.kind == sorl::straggler_rule_kind::group_tokens
                ? "the group's median tokens"
                : "the median of the window's durations",
              o.rule.window, o.rule.min_samples,
              static_cast<long long>(a.policy.g_min), static_cast<long long>(a.policy.g_max),
              static_cast<long long>(a.policy.group_size), a.policy.target_rate, a.policy.v,
              a.policy.tail_prior, static_cast<long long>(a.policy.group_size),
              a.policy.deadline_kappa, static_cast<long long>(a.policy.g_min));
  std::printf("columns: strag/st = fraction of steps with a straggler event (group_tokens: "
              "mean share of groups with one); step times in s; "
              "rollouts/s counts trained (finished) rollouts; U = 1 - 1/(finished per group); "
              "cut %% = rollouts aborted by a deadline; len rat = mean tokens trained / "
              "sampled (< 1: biased short); U-roll/s = utility-weighted rollouts per s = "
              "sum over steps and prompts of n*U(n) / total time, n = finished rollouts of "
              "the prompt (= sum_t U(G_t)*B*G_t / total time without a cut)\n");

  auto wants = [&](const std::string& name) {
    return ("," + a.scenarios + ",").find("," + name + ",") != std::string::npos;
  };
  if (wants("long")) {
    sim_options heavy = o;
    std::string title;
    if (!a.trace.empty()) {
      heavy.durations.trace_s = read_duration_trace(a.trace);
      title = "trace " + a.trace + " (" + std::to_string(heavy.durations.trace_s.size())
              + " durations, resampled)";
    } else {
      set_long_tailed_mixture(heavy.durations);
      heavy.durations.tail_fraction = 0.002;
      title = "long-tailed: lognormal(median 20 s, sigma 0.3) + 0.2% Pareto(x_m 60 s, alpha 1.5, "
              "cap 300 s)";
    }
    run_scenario("long", title, heavy, a.policy, rec);
  }

  if (wants("light")) {
    sim_options light = o;
    light.durations.median_s = 20;
    light.durations.sigma = 0.25;
    light.durations.tail_fraction = 0;
    run_scenario("light", "light-tailed: lognormal(median 20 s, sigma 0.25), no long rollouts",
                 light, a.policy, rec);
  }

  const std::string record_path = sorl::bench::record_path("sagc-sim", a.record);
  auto write_record = [&] {
    if (rec.write(record_path))
      std::fprintf(stderr, "record: %s\n", record_path.c_str());
  };
  if (!wants("drift")) {
    write_record();
    return 0;
  }
  // Drifting tail (a modelling assumption, header comment): the long-tailed mixture with q
  // = 0 over the first third, a linear ramp to q_end over the middle third, q_end after.
  sim_options drift = o;
  set_long_tailed_mixture(drift.durations);
  const int64_t third = o.steps / 3;
  drift.durations.tail_schedule = {{third, 0.0}, {2 * third, a.drift_tail}};
  char q_end[32];
  std::snprintf(q_end, sizeof q_end, "%g%%", 100 * a.drift_tail);
  const std::vector<phase> phases = {
    {"light [0, " + std::to_string(third) + ") q=0", 0, third},
    {"ramp [" + std::to_string(third) + ", " + std::to_string(2 * third) + ") q=0.." + q_end,
     third, 2 * third},
    {"heavy [" + std::to_string(2 * third) + ", " + std::to_string(o.steps) + ") q=" + q_end,
     2 * third, o.steps},
  };
  run_scenario("drift",
               "drifting tail: lognormal(median 20 s, sigma 0.3) + Pareto(x_m 60 s, alpha 1.5, "
                 "cap 300 s) with q = 0 for the first third, linear to "
                 + std::string(q_end) + " over the middle third, then " + q_end,
               drift, a.policy, rec, phases);
  write_record();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sagc_sim: %s\n", e.what());
  return 1;
}
