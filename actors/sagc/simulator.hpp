#pragma once

// Trace-driven simulator of synchronous RL steps for comparing group-size policies
// (ARCHITECTURE.md §6 SAGC; bench/sagc/sagc_sim.sh prints its table).
//
// Pure logic, no CAF and no clocks: each simulated step asks the policy for G_t, simulates
// the rollout phase, turns it into the rollout timing events a worker would send (start and
// finish or abort, stamped on each worker's own clock), feeds them to a `rollout_timing`,
// closes the step and hands `close_step`'s result and the straggler rule to
// `group_policy::observe`: the code path of the sagc_controller actor.
//
// ## Model
//
// Step t has B prompts × G_t rollouts. Rollout k of prompt j at step t needs a base duration
// d(t, j, k) (seconds at concurrency 1), drawn by hashing (seed, t, j, k): common random
// numbers, so every policy sees the same rollout for the same (t, j, k), and a G = 4 step's
// rollouts are the first four of each prompt of a G = 8 step's. Durations are i.i.d. (group
// siblings are not correlated). A base duration is either
//   - resampled uniformly from a trace (seconds), or
//   - drawn from a mixture: with probability 1 − q lognormal(median m, σ), with probability
//     q a Pareto(x_m, α) "long" rollout (many tool turns, a hung environment) capped at
//     `tail_cap_s` (the turn or token limit).
// q may drift over the run: with a `tail_schedule`, q(t) is piecewise linear in the step
// through its knots and constant before the first and after the last (a non-stationary
// workload: responses grow and agentic rollouts become common as the policy learns). The
// draw stays a function of (seed, t, j, k) and the schedule: one uniform decides body or
// tail (u < q(t)), so every policy still sees the same rollout for the same (t, j, k).
//
// W workers, rollout i of the step on worker i mod W. A worker runs up to `batch_limit`
// rollouts at once (the rest wait for a slot; the worker stamps a rollout's start when it
// gets one). Decoding is processor-shared: with c rollouts active each progresses at rate
// 1 / (1 + β·(c − 1)) base-seconds per second, so a rollout's duration stretches with its
// worker's load and shrinks again as its batch-mates finish (batched decoding: throughput
// c / (1 + β(c − 1)) grows with c).
//
// Rollout phase: until the last rollout finishes; with a deadline, until
// max(deadline, the time every group has min_finished finished), and no later than the last
// finish; rollouts unfinished at the cut are aborted (those still waiting for a slot never
// started and send nothing). Tokens = base duration × `decode_tokens_per_s`. Step time =
// rollout phase + trained tokens / `learner_tokens_per_s` + `overhead_s` (sync, rewards).
// Only finished rollouts are trained and counted in rollouts per second.
//
// Utility-weighted rollouts per second = Σ_t Σ_j n_tj · U(n_tj) / Σ_t step time, with n_tj
// the finished rollouts of prompt j at step t and U(n) = 1 − 1/n (without a cut:
// Σ_t U(G_t)·B·G_t / total time). A rollout's advantage against its group's mean keeps the
// fraction U(n) of its reward variance as signal, so this counts useful samples per second
// of wall clock; if progress towards a reward is proportional to that count (a modelling
// assumption, not a measurement), the time to reach a reward scales as its inverse.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/sagc/group_policy.hpp"
#include "actors/sagc/timing.hpp"

namespace sorl::sagc {

/// Base rollout durations (seconds at concurrency 1).
struct sim_durations {
  /// When non-empty, durations are resampled uniformly from these (seconds, finite, ≥ 0).
  std::vector<double> trace_s;
  double median_s = 20.0;     ///< lognormal body: median, s
  double sigma = 0.3;         ///< lognormal body: σ of the log
  double tail_fraction = 0.0; ///< q, probability of a long rollout, in [0, 1]
  double tail_xm_s = 60.0;    ///< Pareto scale x_m, s
  double tail_alpha = 1.5;    ///< Pareto shape α
  double tail_cap_s = 300.0;  ///< long rollouts are cut here, s
  /// A knot of the tail schedule: q at `step`.
  struct tail_knot {
    int64_t step = 0;
    double fraction = 0; ///< in [0, 1]
  };
  /// When non-empty, q(t) is piecewise linear through these knots (steps strictly
  /// increasing), constant outside them, and `tail_fraction` is ignored.
  std::vector<tail_knot> tail_schedule;
};

/// The simulated cluster and costs.
struct sim_options {
  sim_durations durations;
  int64_t prompts_per_step = 8;   ///< B
  int64_t workers = 4;            ///< W
  int64_t batch_limit = 64;       ///< concurrent rollouts per worker
  double load_slowdown = 0.01;    ///< β: per-rollout slowdown per extra concurrent rollout
  double decode_tokens_per_s = 40;     ///< tokens per base second of a rollout
  double learner_tokens_per_s = 20000; ///< learner cost: trained tokens per second
  double overhead_s = 1.0;        ///< fixed per-step cost (sync, rewards), s
  int64_t steps = 2000;
  uint64_t seed = 1;
  straggler_rule_options rule;    ///< the straggler rule the timing uses
};

/// One simulated step.
struct sim_step {
  group_decision decision;
  int64_t rollouts = 0;       ///< B·G
  int64_t finished = 0;       ///< trained rollouts
  int64_t aborted = 0;        ///< cut by a deadline (started or not)
  bool straggler_event = false; ///< from close_step
  /// s_t, what the constraint counts: 1 or 0 for the event (wall_clock), the share of
  /// judged groups with an event (group_tokens; actors/sagc/group_policy.hpp).
  double event_share = 0;
  double rollout_phase_s = 0;
  double step_s = 0;
  double utility = 0;         ///< mean over prompts of U(finished rollouts of the prompt)
  double weighted_rollouts = 0; ///< Σ over prompts of n·U(n), n = finished rollouts
  double trained_tokens = 0;
  double sampled_tokens = 0;  ///< tokens of every rollout had it run to the end
};

/// Summary of one policy's run.
struct sim_summary {
  std::string label;
  int64_t steps = 0;
  double mean_g = 0;
  /// Mean of the steps' event_share: the fraction of steps with a straggler event under
  /// wall_clock, the mean share of groups with one under group_tokens.
  double straggler_rate = 0;
  double mean_step_s = 0;
  double p99_step_s = 0;       ///< nearest-rank
  double rollouts_per_s = 0;   ///< finished rollouts / total time
  double mean_utility = 0;
  /// Σ_t Σ_j n_tj·U(n_tj) / total time (header comment): utility-weighted rollouts per s.
  double weighted_rollouts_per_s = 0;
  double cut_fraction = 0;     ///< aborted / sampled rollouts
  /// Mean tokens of trained rollouts / mean tokens of all sampled rollouts: 1 without a cut,
  /// < 1 when a deadline drops the long ones (the length bias).
  double length_ratio = 1;
};

/// A run: every step and its summary.
struct sim_result {
  std::vector<sim_step> steps;
  sim_summary summary;
};

/// Simulates `options.steps` steps driven by `policy`. Raises std::invalid_argument for
/// options out of range (names the field). Deterministic in (options, policy).
sim_result simulate(group_policy& policy, const sim_options& options, std::string label = "");

/// Summarises steps (used by simulate; exposed for tests).
sim_summary summarize(const std::vector<sim_step>& steps, std::string label);

/// The best static policy among `statics` (runs of static G, any order) for the constraint
/// "straggler-event rate ≤ ε": the one with the largest mean G (so the largest U) whose rate
/// meets ε (meets_straggler_target: one binomial standard error over a run of `steps` steps
/// of slack, so that a G whose measured rate is ε up to sampling noise is not ruled out by
/// the noise); `meets` is then true. When none meets ε, the one with the lowest rate (ties: the
/// larger G) and `meets` false. Pass a run of every G the adaptive policy may pick
/// ([g_min, g_max]): a coarser grid flatters it. Raises std::invalid_argument when `statics`
/// is empty.
/// Whether a run of `steps` steps with straggler-event rate `rate` meets ε = `target_rate`
/// up to sampling noise: rate ≤ ε + sqrt(ε(1 − ε)/steps) (best_static).
bool meets_straggler_target(double rate, double target_rate, int64_t steps);

struct best_static_choice {
  size_t index = 0;   ///< into `statics`
  bool meets = false; ///< its rate meets ε (within the slack above)
};
best_static_choice best_static(const std::vector<sim_summary>& statics, double target_rate,
                               int64_t steps);

/// The static run with the most utility-weighted rollouts per second (the objective the
/// bench reports, sim_summary::weighted_rollouts_per_s), among all of `statics` when
/// `constrained` is false, else among those whose straggler-event rate meets ε =
/// `target_rate` over `steps` steps (meets_straggler_target). Ties: the lower straggler-event
/// rate, then the smaller mean G. nullopt when `constrained` and none meets ε, or when
/// `statics` is empty. Unlike best_static (the largest G under the constraint, what sagc's
/// own objective, the mean of U(G), prefers), this is the static G a user tuning G by hand
/// for throughput of useful samples would pick.
std::optional<size_t> best_static_on_objective(const std::vector<sim_summary>& statics,
                                               bool constrained, double target_rate,
                                               int64_t steps);

/// q(t), the probability that a rollout of step t is a long one (the tail schedule, else
/// tail_fraction).
double sim_tail_fraction(const sim_durations& durations, int64_t step);

/// The base duration of rollout k of prompt j at step t (seconds), as simulate draws it.
double sim_base_duration(const sim_options& options, int64_t step, int64_t prompt, int64_t k);

/// Reads a trace of rollout durations in seconds: one per line, or the first field of a CSV
/// line; blank lines, lines starting with '#', and a non-numeric first line (a header) are
/// skipped. Raises std::runtime_error naming the line for a value that is not a finite
/// number ≥ 0, and when the file cannot be read or holds no durations.
std::vector<double> read_duration_trace(const std::string& path);

} // namespace sorl::sagc
