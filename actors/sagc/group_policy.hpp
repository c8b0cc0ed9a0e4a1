#pragma once

// Group-size policies of the sagc_controller (ARCHITECTURE.md §6 SAGC): the static baseline, the
// deadline baseline and the adaptive policy, selectable by config so that all three run on
// the same code path.
//
// The trainer asks for G_t once per step (ARCHITECTURE.md §3 step 1); the controller's core
// (actors/sagc/controller_core.hpp) calls `decide(step)` on the configured policy, and feeds
// each closed step's timing back through `observe` together with the straggler rule whose
// window the step's durations just entered. Three policies share that interface:
//
// - `static`: a fixed G, the baseline.
// - `deadline`: a fixed G and a rollout-phase deadline, the timeout baseline.
// - `sagc`: the adaptive drift-plus-penalty controller (below).
//
// ## The sagc formulation (ARCHITECTURE.md §6)
//
// Maximise the long-run average of a concave utility U(G_t) subject to the long-run rate of
// straggler events being ≤ ε, solved online with Lyapunov drift-plus-penalty (M. J. Neely,
// "Stochastic Network Optimization with Application to Communication and Queueing Systems",
// Morgan & Claypool 2010, ch. 3-4):
//
//   s_t      ∈ {0, 1}, step_timing::straggler_event of step t (a rollout > κ × window median)
//   Q_{t+1}  = max(0, Q_t + s_t − ε_t)                            (virtual queue)
//   ε_t      = ε, or b_t + ε when b⁻_t > ε                        (target; below)
//   b_t      = 1 − (1 − k/n)^{B·g_min},  b⁻_t the same at the Wilson lower bound of k/n
//   G_t      = argmax_{G ∈ [g_min, g_max]}  V·U(G) − Q_t·P̂(G)     (ties: the smaller G)
//   U(G)     = 1 − 1/G
//   P̂(G)     = 1 − (1 − p̂)^{B·G}
//   p̂        = (k + a) / (n + 2a)
//
// with n the durations in the rule's window, k those above its threshold thr = κ × median
// (so 1 − k/n = F̂(thr), the empirical CDF at the threshold), a = `tail_prior`, B the
// prompts per step. P̂(G) is the probability that the max of B·G i.i.d. draws from the
// smoothed empirical distribution exceeds thr: the straggler event of a step of size G.
//
// Why U(G) = 1 − 1/G. The group-mean baseline of G rollouts has variance σ²/G, so 1 − 1/G
// is the fraction of the per-rollout reward variance the baseline removes (the variance
// reduction of the group baseline). It is concave, increasing, and bounded in
// [0, 1), which gives V a fixed scale against Q·P̂ ∈ [0, Q]; log G is unbounded and would
// make the right V depend on g_max.
//
// Why a prior a on the tail count. A window of n durations cannot resolve a per-rollout tail
// probability below ~1/n, yet the step's event probability is already large at p ≈ ε/(B·G)
// (for B = 32, G = 16 that is 2·10⁻⁴, against n = 256). With a = 0 a window without an
// exceedance gives P̂ ≡ 0, and the queue would have no lever however large it grows. With the
// Jeffreys prior a = 1/2, P̂ stays increasing in G, so a growing Q always pushes G down; the
// queue, not the estimate, then sets the level (Neely's feedback argument needs only that the
// action for large Q has an event rate below ε). `tail_prior = 0` gives the plain empirical
// CDF at the threshold.
//
// Why V = 10. U differences are < 1 and Q moves by at most 1 per step. Drift-plus-penalty
// keeps Q = O(V) and the utility within O(1/V) of the best policy that meets the constraint;
// since Q_T ≥ Q_0 + Σ_t (s_t − ε), the time-average event rate over T steps is at most
// ε + (Q_T − Q_0)/T. V = 10 puts Q in the tens: within a few dozen steps of the start the
// controller is near its operating point, and over 5000 steps the rate sits within ~0.005 of
// ε. A larger V trades a slower start and larger swings of Q for utility closer to optimal.
//
// Why ε_t. When the window shows that even the smallest group has a straggler event more
// often than ε, no G meets the constraint. "Shows" means with confidence: b⁻_t, the event
// probability of B·g_min draws at the lower end of the Wilson score interval (z = 2) of the
// window's k/n, exceeds ε; a light tail's window that happens to hold two long rollouts of 256
// does not switch (with the point estimate it would, and the long-tailed simulation's rate
// would end at 0.116 instead of ε). Taken literally, the queue
// then grows without bound and holds G at g_min forever, paying the whole utility cost for a
// rate that still misses ε. That happens when κ × median falls inside a wide body rather than
// a tail, as with multi-turn episodes whose lengths are bounded by a token budget: the long
// episodes are ordinary, and the maximum of a step's durations sits near the budget whatever
// G is. There the constraint bounds what it can still control, the events a larger group adds
// to those of the smallest, with b_t the point estimate: rate ≤ mean(ε_t). With b_t ≥ 1 − ε it
// is void and sagc runs g_max. Where ε is reachable nothing changes. The switch is a step
// (from ε to more than 2ε); the window moves b⁻_t slowly, and the reason names the target.
//
// Load. Durations stretch with the load per worker (more rollouts in flight → slower
// decoding), and P̂ does not rescale the window for it: under a multiplicative stretch the
// ratio duration / (κ × median) is unchanged, so the tail fraction measured at one G carries
// over to another. What does not carry over is the window just after G changes, which mixes
// loads; the result is a transient error in p̂ that the virtual queue corrects through s_t.
// Rollouts of one group share a prompt and their durations are correlated; the i.i.d.
// formula then overstates P̂, which errs on the side of smaller groups.
//
// Under the group_tokens straggler rule (actors/sagc/timing.hpp) the same controller runs on
// groups instead of steps:
//
//   s_t      = group_events / groups_judged of step t, the step's share of groups with an event
//   P̂(G)     = 1 − (1 − p̂)^G,   b_t = 1 − (1 − k/n)^{g_min}
//   p̂        = (k + a) / (n + 2a), n relative lengths in the window (tokens / group median),
//              k of them above κ
//
// so the constraint bounds the share of groups with a straggler, which does not grow with B,
// and p̂ is measured on lengths relative to each group's own median, which do not change
// with load or with G. P̂(G) treats a group's rollouts as i.i.d. around a fixed median; the
// median of a larger group is estimated better, so P̂ slightly overstates the event
// probability of small groups. A step none of whose groups could be judged (fewer than 2
// finished rollouts each) does not move the queue.
//
// Before the window holds min_samples values there is no threshold and the policy returns
// the configured initial G.
//
// ## The deadline baseline
//
// A fixed G and a rollout-phase budget of deadline_kappa × the window median (ns from the
// step's start), once the window has a threshold; the trainer then cuts the step at the
// deadline, aborting unfinished rollouts, but first waits until every group has at least
// g_min finished rollouts. Bias: the cut drops the longest rollouts, so the trained batch
// over-represents short responses; with group-relative advantages the surviving (shorter)
// responses of a group share its reward mass, which pushes response lengths down over
// training, a change of the objective, not only of the wall clock. The window only sees the
// durations that finished, so the median is measured on a censored sample; the censoring is
// at the top and moves the median little while the cut fraction is small.
//
// ## Robustness
//
// Timing comes from other processes. An empty step, a step whose rollouts all aborted, a
// repeated or backward step number, and steps with timing issues are recorded in the next
// decision's `reason` and never throw; every G is in [g_min, g_max] (static: the configured G).
// Decisions depend only on the observed inputs: same inputs, same decisions.

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "actors/sagc/timing.hpp"
#include "runtime/config.hpp"

namespace sorl::sagc {

/// One group-size decision, logged with its reason and inputs, so that every choice of G can
/// be explained from the log and metrics.jsonl (ARCHITECTURE.md §6, §7).
struct group_decision {
  int64_t step = 0;       ///< the step this G is for
  int64_t group_size = 0; ///< G_t, rollouts per prompt, ≥ 1
  std::string policy;     ///< "static" | "sagc" | "deadline"
  std::string reason;     ///< human-readable: the inputs and why this G
  double virtual_queue = 0; ///< Q_t used for this decision (sagc; 0 otherwise)
  /// P̂(straggler event | G_t) (sagc, once a threshold exists); NaN when not estimated.
  double p_straggler = std::numeric_limits<double>::quiet_NaN();
  double utility = 0; ///< U(G_t) = 1 − 1/G_t
  /// ε_t, the event rate the queue holds this step to (sagc): ε, or b_t + ε when ε is
  /// unreachable (header comment); 0 for the other policies.
  double target_rate = 0;
  /// Deadline mode: rollout-phase budget, ns from the step's start; nullopt = wait for all.
  std::optional<int64_t> deadline_ns;
  /// Deadline mode: finished rollouts per group required before cutting (g_min); 0 otherwise.
  int64_t min_finished = 0;
};

/// U(G) = 1 − 1/G, the fraction of reward variance removed by a group-mean baseline of G
/// rollouts; 0 for G < 1.
double group_utility(int64_t group_size);

/// 1 − (1 − p)^rollouts: the probability that at least one of `rollouts` independent
/// rollouts, each a straggler with probability p, is one. p is clamped to [0, 1] (NaN → 1,
/// the cautious reading); rollouts ≤ 0 gives 0.
double straggler_event_probability(double tail_probability, int64_t rollouts);

/// What the adaptive policy reads from a straggler rule's window. Values are durations in
/// ns under wall_clock, and lengths relative to their group's median (unitless) under
/// group_tokens.
struct window_tail {
  straggler_rule_kind kind = straggler_rule_kind::wall_clock;
  size_t samples = 0;              ///< n, values in the window
  size_t over = 0;                 ///< k, values strictly above the threshold
  /// wall_clock: κ × median, ns; group_tokens: κ. nullopt below min_samples.
  std::optional<double> threshold;
  std::optional<double> median;    ///< of the window's values; nullopt for an empty window
};

/// Counts the window's values above the threshold of `kind`'s rule (the rule's own kind
/// when not given). A non-finite threshold or median (impossible with a valid rule) is
/// treated as absent.
window_tail window_tail_of(const straggler_rule& rule);
window_tail window_tail_of(const straggler_rule& rule, straggler_rule_kind kind);

/// p̂ = (k + a) / (n + 2a), the per-rollout straggler probability; a = prior ≥ 0.
/// Returns NaN when n + 2a = 0.
double tail_estimate(const window_tail& tail, double prior);

/// What a policy's later decisions depend on besides the straggler window. A checkpoint
/// saves it with the window (actors/sagc/controller_state.hpp), so that a resumed run decides
/// as the uninterrupted one would.
struct policy_memory {
  std::string policy;        ///< "static" | "sagc" | "deadline"; "" for a policy without one
  double virtual_queue = 0;  ///< Q_t (sagc), finite, ≥ 0
  double truncated = 0;      ///< what max(0, ·) cut off the queue so far (sagc), finite, ≥ 0
  int64_t steps_counted = 0; ///< steps whose event entered the queue (sagc), ≥ 0
  int64_t events_counted = 0; ///< of those, steps with a straggler event, in [0, steps_counted]
  /// Σ s_t over the counted steps (sagc): events_counted under wall_clock, the sum of the
  /// steps' group-event shares under group_tokens; finite, in [0, steps_counted].
  double event_sum = 0;
  std::optional<int64_t> last_observed; ///< last step fed back through observe, ≥ 0
  std::optional<int64_t> last_decided;  ///< largest step decided, ≥ 0
  std::string notes; ///< what the last observe found odd, for the next decision's reason
};

/// Raises std::invalid_argument naming the field when `memory` holds values no run of a
/// policy can reach (the conditions listed at group_policy::restore).
void check_policy_memory(const policy_memory& memory);

/// Chooses the group size G_t for each synchronous step.
///
/// Called on the controller actor's thread only.
class group_policy {
public:
  virtual ~group_policy() = default;

  /// G for `step` (≥ 0), with its reason. Does not change the policy's estimates: asking
  /// twice for the same step gives the same decision. Raises std::invalid_argument for
  /// step < 0 (a caller's mistake; the step comes from the trainer, not from a message).
  virtual group_decision decide(int64_t step) = 0;

  /// Feeds back a closed step's timing (from rollout_timing::close_step) and the straggler
  /// rule after the step's durations entered its window (rollout_timing::rule()). Adaptive
  /// policies update their estimates here; the static policy ignores it. Never throws on odd
  /// timing data.
  virtual void observe(const step_timing& /*timing*/, const straggler_rule& /*rule*/) {
  }

  /// The policy's memory (only `policy` is set for a policy without state, e.g. static).
  virtual policy_memory memory() const {
    return {};
  }

  /// Replaces the memory with a saved one and recomputes the window statistics from `rule`,
  /// the restored straggler window (they are a function of it). Raises
  /// std::invalid_argument, changing nothing, for a memory no run can reach: a queue or
  /// truncation that is negative or not finite, negative counts, more events than steps, a
  /// negative step. A policy without state accepts anything.
  virtual void restore(const policy_memory& /*memory*/, const straggler_rule& /*rule*/) {
  }
};

/// A fixed G from `[sagc].group_size`: the baseline SAGC is compared against.
class static_group_policy final : public group_policy {
public:
  /// Raises std::invalid_argument when group_size < 1.
  explicit static_group_policy(int64_t group_size);

  /// Always the configured G. Raises std::invalid_argument for step < 0.
  group_decision decide(int64_t step) override;
  policy_memory memory() const override;

  int64_t group_size() const {
    return group_size_;
  }

private:
  int64_t group_size_;
};

/// Configuration of every policy, built by `group_policy_options_from` from `[sagc]` and
/// `[algorithm].prompts_per_step`; the defaults equal the config's.
struct group_policy_options {
  /// Which policy (the config's `[sagc] policy`; its spelling, to_string, names decisions).
  group_policy_kind policy = group_policy_kind::fixed;
  /// Static and deadline: G. Sagc: the initial G, used until the window has a threshold.
  /// ≥ 1; for sagc and deadline within [g_min, g_max].
  int64_t group_size = 8;
  int64_t g_min = 2;  ///< smallest G (sagc); finished rollouts per group before a cut (deadline)
  int64_t g_max = 16; ///< largest G (sagc), ≥ g_min
  double target_rate = 0.1;      ///< ε, long-run straggler-event rate, in [0, 1]
  int64_t prompts_per_step = 8;  ///< B, prompts per step (`[algorithm].prompts_per_step`), ≥ 1
  double v = 10.0;               ///< penalty weight V, finite, > 0 (see the header comment)
  double tail_prior = 0.5;       ///< a in p̂ = (k + a)/(n + 2a), finite, ≥ 0
  /// Deadline: budget = deadline_kappa × window median. Finite, > 0. The default equals the
  /// straggler rule's default κ: the cut falls where a rollout would become a straggler.
  double deadline_kappa = 3.0;
};

/// The adaptive drift-plus-penalty controller (header comment, ARCHITECTURE.md §6).
class sagc_group_policy final : public group_policy {
public:
  /// Raises std::invalid_argument naming the bad field (see make_group_policy).
  explicit sagc_group_policy(group_policy_options options);

  group_decision decide(int64_t step) override;
  void observe(const step_timing& timing, const straggler_rule& rule) override;
  policy_memory memory() const override;
  void restore(const policy_memory& memory, const straggler_rule& rule) override;

  /// Q_t, the virtual queue the next decision uses.
  double virtual_queue() const {
    return queue_;
  }
  /// Steps whose straggler event entered the queue, and how many had an event. Under
  /// wall_clock their ratio is the time-average event rate the constraint bounds; under
  /// group_tokens that rate is event_sum() / steps_counted().
  int64_t steps_counted() const {
    return steps_counted_;
  }
  int64_t events_counted() const {
    return events_counted_;
  }
  /// Σ s_t over the counted steps (policy_memory::event_sum).
  double event_sum() const {
    return event_sum_;
  }
  /// Σ_t max(0, −(Q_t + s_t − ε_t)): what the max(0, ·) of the queue update cut off. Then
  /// exactly Σ s_t − Σ ε_t = Q_T − Q_0 − truncated, i.e. rate = mean ε_t + (Q_T − truncated)/T
  /// (mean ε_t = ε while ε is reachable).
  double truncated() const {
    return truncated_;
  }
  /// The window statistics of the last observed step.
  const window_tail& tail() const {
    return tail_;
  }
  /// V·U(G) − Q·P̂(G) with the current estimates (NaN-free; needs a threshold to mean much).
  double score(int64_t group_size) const;
  /// b_t = 1 − (1 − k/n)^{B·g_min} (group_tokens: ^{g_min}): the straggler-event probability
  /// of the smallest group under the window's empirical CDF, in [0, 1]; 0 before the window
  /// has a threshold.
  double unavoidable_rate() const;
  /// b⁻_t: as unavoidable_rate, at the lower end of the Wilson score interval (z = 2) of k/n.
  double unavoidable_rate_lower() const;
  /// ε_t: ε, or b_t + ε when b⁻_t > ε (header comment, "Why ε_t").
  double step_target() const;
  const group_policy_options& options() const {
    return options_;
  }

private:
  /// Rollouts one event draws over: B·G under wall_clock (a step), G under group_tokens.
  int64_t event_rollouts(int64_t group_size) const;

  group_policy_options options_;
  double queue_ = 0;
  double truncated_ = 0;
  int64_t steps_counted_ = 0;
  int64_t events_counted_ = 0;
  double event_sum_ = 0;
  window_tail tail_;
  std::optional<int64_t> last_observed_;
  std::optional<int64_t> last_decided_;
  std::string notes_; ///< what the last observe found odd, for the next reason
};

/// The timeout baseline: fixed G plus a rollout-phase deadline (header comment).
class deadline_group_policy final : public group_policy {
public:
  /// Raises std::invalid_argument naming the bad field (see make_group_policy).
  explicit deadline_group_policy(group_policy_options options);

  group_decision decide(int64_t step) override;
  void observe(const step_timing& timing, const straggler_rule& rule) override;
  policy_memory memory() const override;
  void restore(const policy_memory& memory, const straggler_rule& rule) override;

  const group_policy_options& options() const {
    return options_;
  }

private:
  group_policy_options options_;
  window_tail tail_;
  std::optional<int64_t> last_observed_;
  std::optional<int64_t> last_decided_;
  std::string notes_;
};

/// The policy options from a loaded (validated) experiment. `tail_prior` keeps its default
/// (no key sets it).
group_policy_options group_policy_options_from(const experiment_config& cfg);

/// The straggler rule from `[sagc] kappa` and `window`; `min_samples` is its default, capped
/// at the window.
straggler_rule_options straggler_rule_from(const experiment_config& cfg);

/// Builds the configured policy. Raises std::invalid_argument naming the bad field:
/// group_size < 1, and for sagc / deadline also g_min < 1, g_max < g_min,
/// group_size outside [g_min, g_max], target_rate outside [0, 1], prompts_per_step < 1, v not
/// finite or ≤ 0, tail_prior not finite or < 0, deadline_kappa not finite or ≤ 0.
std::unique_ptr<group_policy> make_group_policy(const group_policy_options& options);

} // namespace sorl::sagc
