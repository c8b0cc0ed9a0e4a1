#pragma once

// Rollout timing statistics for the sagc_controller (ARCHITECTURE.md §4 "Timing clocks",
// §6 SAGC, §7): durations per step, the straggler rule, and stragglers detected while they
// still run.
//
// Pure logic, free of CAF: the controller's shell decodes each rollout timing message into a
// `timing_event` (actors/sagc/sagc_wire.hpp) for its core (actors/sagc/controller_core.hpp),
// which calls `rollout_timing::observe` and closes each step with `close_step`.
//
// Clocks. Every timestamp is the worker's own steady clock (ARCHITECTURE.md §4). Clocks of
// different workers are never compared: a duration is end − start only when both were
// stamped by the same worker, and in-flight elapsed time is measured against a "now" on that
// worker's clock.
//
// Two straggler rules ([sagc].straggler_rule, `straggler_rule_options::kind`):
//   - wall_clock: a finished rollout whose duration exceeds κ × the median of the last
//     `window` durations, a window that runs across steps. A step has an event when any of
//     its rollouts is a straggler. Durations stretch with the load per worker and the window
//     mixes steps of different G, so the verdict depends on the machine as much as on the
//     policy.
//   - group_tokens: a rollout whose response tokens exceed κ × the median tokens of the
//     finished rollouts of its own group (floored at 1 token), judged in groups with at
//     least 2 finished rollouts. Tokens do not depend on load and a group is judged against
//     its own siblings, so the verdict is the policy's alone: the group-level max/median
//     statistic of the SAGC paper. Events are counted per group (group_events of
//     groups_judged), so their rate does not grow with the number of prompts B.
// Both verdicts are computed for every step; `stragglers` and `straggler_event` report the
// selected one, and the duration window is kept under either (the deadline policy reads it).
//
// Percentiles. Every percentile here, the median included, is the nearest-rank percentile:
// for n sorted values v_1 ≤ … ≤ v_n and 0 < p ≤ 100, P_p = v_k with k = ⌈p/100 · n⌉
// (P_0 = v_1). It is always one of the observed values (no interpolation), so the tests can
// be checked by hand; the median of an even count is the lower middle value.

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace sorl::sagc {

/// Nearest-rank percentile of `values` (see the header comment), p in [0, 100].
/// Raises std::invalid_argument for an empty vector or p outside [0, 100] / NaN.
int64_t nearest_rank_percentile(std::vector<int64_t> values, double p);
/// Same for real values; raises std::invalid_argument also when a value is not finite.
double nearest_rank_percentile(std::vector<double> values, double p);

/// Kind of a rollout timing message (ARCHITECTURE.md §3 step 3: every rollout start,
/// chunk and finish is a message carrying the worker's steady-clock timestamp).
enum class timing_kind {
  start,  ///< the worker began the rollout (prefill)
  chunk,  ///< a chunk of tokens was generated; `tokens` is the count so far
  finish, ///< the rollout ended normally (eos or length); `tokens` is the final count
  abort,  ///< the rollout was aborted (deadline mode, shutdown); `tokens` so far
};

/// "start" | "chunk" | "finish" | "abort".
const char* to_string(timing_kind kind);

/// One rollout timing message, as the controller's shell decodes it.
struct timing_event {
  uint64_t request_id = 0; ///< unique per rollout within a run
  int64_t step = 0;        ///< synchronous step the rollout belongs to, ≥ 0
  uint64_t group_id = 0;   ///< GRPO group (prompt) the rollout belongs to
  timing_kind kind = timing_kind::start;
  int64_t worker_ns = 0;   ///< worker-side steady-clock timestamp, ns
  int64_t tokens = 0;      ///< response tokens generated so far, tokens, ≥ 0
  std::string worker;      ///< name of the stamping worker (whose clock `worker_ns` is on)
};

/// Why an event, or a rollout, was left out of the statistics. Each is counted, never thrown:
/// timing messages come from other processes, and a bad one must not stop training.
enum class timing_issue {
  bad_step,            ///< step < 0
  no_worker,           ///< empty worker name: the clock is unknown
  negative_tokens,     ///< tokens < 0
  late_event,          ///< the event's step is already closed
  skipped_step,        ///< a rollout of a step discarded because a later step was closed first
  duplicate_start,     ///< a second start from the same worker (the earliest one is kept)
  duplicate_finish,    ///< a second finish (the first one is kept)
  duplicate_abort,     ///< a second abort (the first one is kept)
  event_after_end,     ///< chunk/finish/abort after the rollout already ended the other way
  missing_start,       ///< the rollout ended but its start never arrived (found at close)
  clock_mismatch,      ///< start and end stamped by different workers (found at close)
  negative_duration,   ///< end before start on the same clock (found at close)
  non_finite_duration, ///< a NaN or infinite duration offered to a straggler_rule
  count_,              ///< number of issues, not an issue
};

/// "bad_step", "duplicate_finish", ... (the names used in logs and JSONL).
const char* to_string(timing_issue issue);

/// Issue counters, indexed by timing_issue.
using timing_issue_counts = std::array<int64_t, static_cast<size_t>(timing_issue::count_)>;

/// The non-zero counters as { name: count }, for logs and metrics records.
std::map<std::string, int64_t> to_map(const timing_issue_counts& counts);

/// Parameters of the straggler rule (ARCHITECTURE.md §6 SAGC; `[sagc].kappa`, `[sagc].window`).
struct straggler_rule_options {
  /// A rollout is a straggler when duration > kappa × median of the window. Finite, > 0.
  double kappa = 3.0;
  /// Completed-rollout durations kept, most recent last; spans steps. ≥ 1.
  size_t window = 256;
  /// Below this many samples the median is too noisy to judge anyone: no threshold, nothing
  /// is flagged. With 8 samples the nearest-rank median is the 4th smallest, so up to 4 fast
  /// outliers cannot drag it down by themselves. In [1, window].
  size_t min_samples = 8;
  /// Which verdict `stragglers`, `straggler_event` and the in-flight flags use (header
  /// comment, "Two straggler rules").
  straggler_rule_kind kind = straggler_rule_kind::wall_clock;
};

/// The group_tokens verdict on one group (header comment): `tokens` are the final response
/// tokens of its finished rollouts. median = nearest-rank median of `tokens`, floored at 1
/// token (a group of empty responses would otherwise flag any rollout that says anything);
/// threshold = kappa × median; an entry is a straggler when tokens > threshold strictly.
/// Groups with fewer than 2 finished rollouts are not judged (`judged` false): one
/// rollout has no sibling to be slow against.
struct group_verdict {
  bool judged = false;
  int64_t median_tokens = 0;   ///< tokens; 0 when not judged
  double threshold_tokens = 0; ///< kappa × median_tokens, tokens
  std::vector<size_t> stragglers; ///< indices into `tokens`, ascending
};

/// Applies the group_tokens rule to one group. Raises std::invalid_argument for kappa not
/// finite or ≤ 0, or a negative token count.
group_verdict judge_group(const std::vector<int64_t>& tokens, double kappa);

/// The straggler rule (ARCHITECTURE.md §6 SAGC): κ × median of a recent window of completed rollout
/// durations, the window running across steps. Durations are ns on one worker's clock each.
class straggler_rule {
public:
  /// Raises std::invalid_argument for kappa not finite or ≤ 0, window = 0, or min_samples
  /// outside [1, window].
  explicit straggler_rule(straggler_rule_options options = {});

  /// Appends a completed rollout's duration (ns), evicting the oldest beyond the window.
  /// Returns false, and counts the reason, for a NaN / infinite (non_finite_duration) or
  /// negative (negative_duration) value, which is not added.
  bool add(double duration_ns);

  /// Nearest-rank median of the window, ns; std::nullopt when the window is empty.
  std::optional<double> median_ns() const;

  /// κ × median, ns; std::nullopt while the window holds fewer than min_samples durations.
  std::optional<double> threshold_ns() const;

  /// True when a threshold exists and duration_ns > threshold (strictly). NaN → false.
  bool is_straggler(double duration_ns) const;

  /// The window, oldest first (the empirical duration distribution the adaptive controller
  /// estimates its tail from, actors/sagc/group_policy.hpp).
  const std::deque<double>& durations() const {
    return window_;
  }
  size_t samples() const {
    return window_.size();
  }
  const straggler_rule_options& options() const {
    return options_;
  }
  /// Appends a finished rollout's length relative to its group's median (tokens /
  /// group_verdict::median_tokens, unitless), evicting the oldest beyond the window: the
  /// sample the group_tokens rule's tail probability is estimated from
  /// (actors/sagc/group_policy.hpp). Same rejections as `add`.
  bool add_relative(double ratio);
  /// The relative lengths, oldest first.
  const std::deque<double>& relative_lengths() const {
    return relative_;
  }

  /// Rejected `add` calls by reason (only the two duration issues are ever non-zero).
  const timing_issue_counts& rejected() const {
    return rejected_;
  }

private:
  /// Appends `value` to `window` (one of the two), evicting beyond options_.window; counts and
  /// refuses a non-finite or negative value.
  bool push(std::deque<double>& window, double value);

  straggler_rule_options options_;
  std::deque<double> window_;
  std::deque<double> relative_;
  timing_issue_counts rejected_{};
};

/// A rollout judged a straggler, finished or still running.
struct straggler_flag {
  uint64_t request_id = 0;
  uint64_t group_id = 0;
  std::string worker;
  int64_t elapsed_ns = 0; ///< duration (ended) or elapsed time so far (running), ns
  int64_t tokens = 0;     ///< tokens at the end, or at the latest chunk, tokens
  bool ended = false;     ///< finished or aborted (false: flagged in flight)
  bool aborted = false;
};

/// Timing statistics of one synchronous step.
struct step_timing {
  int64_t step = 0;

  int64_t started = 0;  ///< rollouts with a start event
  int64_t finished = 0; ///< rollouts with a finish event
  int64_t aborted = 0;  ///< rollouts with an abort event (no finish)
  int64_t running = 0;  ///< started and neither finished nor aborted

  /// Finished rollouts whose duration (finish − start, same worker) is valid.
  int64_t timed = 0;
  /// Nearest-rank percentiles of those durations, ns; 0 when timed == 0.
  int64_t duration_p50_ns = 0;
  int64_t duration_p90_ns = 0;
  int64_t duration_max_ns = 0;
  /// Nearest-rank percentiles of the final token counts of finished rollouts, tokens;
  /// 0 when finished == 0.
  int64_t tokens_p50 = 0;
  int64_t tokens_p99 = 0;
  int64_t tokens_max = 0;

  /// κ × window median used to judge this step, ns; std::nullopt (nothing flagged) while
  /// the window held fewer than min_samples durations. The window holds the durations of
  /// earlier closed steps only, so the verdict does not depend on arrival order within the
  /// step and equals the threshold the in-flight check used during the step.
  std::optional<double> threshold_ns;
  size_t window_samples = 0;

  /// The selected rule's stragglers among the ended rollouts, ordered by request id.
  /// wall_clock: over threshold_ns; aborted rollouts count when their elapsed time at the
  /// abort already passed it (deadline mode aborts stragglers). group_tokens: over κ × their
  /// group's median; an aborted rollout counts when its tokens at the abort already did.
  std::vector<straggler_flag> stragglers;
  /// ARCHITECTURE.md §6: the step has a straggler event when any of its rollouts is a
  /// straggler under the selected rule.
  bool straggler_event = false;

  /// The group_tokens verdict, whatever the selected rule: groups with ≥ 2 finished
  /// rollouts, and of those the ones with a token straggler.
  int64_t groups_judged = 0;
  int64_t group_events = 0;
  /// group_events / groups_judged; 0 when no group was judged.
  double group_event_rate() const {
    return groups_judged > 0 ? static_cast<double>(group_events) / static_cast<double>(groups_judged)
                             : 0.0;
  }

  /// Issues attributed to this step's rollouts.
  timing_issue_counts issues{};
};

/// Collects rollout timing events and turns them into per-step statistics and straggler
/// verdicts (ARCHITECTURE.md §6 SAGC).
///
/// Robust to what messages from many processes do: events of a rollout may arrive in any
/// order (a finish before its start is held until the start comes), duplicates are counted
/// and dropped, a rollout re-placed on another worker after a loss restarts its clock at the
/// new worker's start, and malformed values are counted under a `timing_issue`.
///
/// Not thread-safe: owned by the sagc_controller actor and called on its thread only.
class rollout_timing {
public:
  /// Raises std::invalid_argument for invalid rule options (see straggler_rule).
  explicit rollout_timing(straggler_rule_options options = {});

  /// Records one event. Returns true when it was used, false when it was ignored (the
  /// reason is counted in `issues()` and, when the step is open, in its `step_timing`).
  bool observe(const timing_event& event);

  /// Statistics of `step` from the events seen so far (a step still in progress shows its
  /// ended rollouts only). Does not change state; an unknown step gives an empty summary.
  step_timing summary(int64_t step) const;

  /// Final statistics of `step`: feeds its valid durations (ordered by request id) into the
  /// straggler window and the relative lengths of its judged groups' finished rollouts (by
  /// group id, then request id) into the relative window, forgets its events, and treats later events of any step ≤ `step` as
  /// late. Open steps before `step` are discarded (their rollouts counted as skipped_step).
  /// Raises std::invalid_argument when `step` is not after the last closed step.
  step_timing close_step(int64_t step);

  /// Rollouts of `step` still running that are already stragglers under the selected rule,
  /// ordered by request id (stragglers are flagged before they finish).
  ///
  /// group_tokens: a running rollout of a group of n started rollouts is flagged once
  /// k = ⌈n/2⌉ of them have finished and its tokens so far exceed κ × m, m the k-th smallest
  /// finished count (floored at 1). When every rollout of the group has started, the group's
  /// final median is at most m (adding values never raises the k-th smallest) and tokens only
  /// grow, so the close keeps the flag. The timing does not know G: a rollout still waiting
  /// for a worker's batch slot is not counted in n, and then the close may not confirm the
  /// flag. `now_ns` is not used.
  ///
  /// wall_clock: elapsed time already passes the threshold. For each one,
  /// elapsed = max(latest chunk timestamp, now_ns[worker] when given) − start, all on that
  /// worker's clock: `now_ns` maps a worker name to its current steady-clock time in ns
  /// (injected by the caller, e.g. its last timestamp plus the local time since, so tests
  /// never sleep). Empty while the window is below min_samples.
  std::vector<straggler_flag> in_flight_stragglers(
    int64_t step, const std::map<std::string, int64_t>& now_ns = {}) const;

  /// The straggler rule and its window.
  const straggler_rule& rule() const {
    return rule_;
  }

  /// Every issue counted so far over all steps (event-time issues at once, close-time
  /// issues when their step is closed, and the rule's rejected durations).
  timing_issue_counts issues() const;
  int64_t issues(timing_issue issue) const {
    return issues()[static_cast<size_t>(issue)];
  }

  /// Rollouts whose clock restarted because a start came from a different worker
  /// (re-placement after a worker loss).
  int64_t restarts() const {
    return restarts_;
  }

  std::optional<int64_t> last_closed_step() const {
    return last_closed_;
  }

  /// Replaces the straggler window with `durations_ns` and the relative window with
  /// `relative` (oldest first; beyond the rule's window only the most recent are kept) and
  /// the last closed step with `last_closed`, as a checkpoint saved them
  /// (actors/sagc/controller_state.hpp). Events of open steps are dropped. Issue counters are
  /// diagnostics that no decision reads; they are not part of it. Raises
  /// std::invalid_argument, changing nothing, for a negative or non-finite value or a
  /// negative step.
  void restore(const std::vector<double>& durations_ns, std::optional<int64_t> last_closed,
               const std::vector<double>& relative = {});

private:
  struct stamp {
    std::string worker;
    int64_t ns = 0;
    int64_t tokens = 0;
  };
  struct rollout_state {
    uint64_t group_id = 0;
    std::optional<stamp> start;
    std::optional<stamp> progress; ///< latest chunk
    std::optional<stamp> finish;
    std::optional<stamp> abort;
  };
  struct step_state {
    std::map<uint64_t, rollout_state> rollouts; ///< by request id
    timing_issue_counts issues{};
  };

  /// Builds a summary of `state` (nullptr: no events); the close-time issues it finds go
  /// into the summary's counters, and the valid durations (request-id order) into
  /// `timed_durations` when given.
  step_timing build(int64_t step, const step_state* state,
                    std::vector<int64_t>* timed_durations,
                    std::vector<double>* relative_lengths = nullptr) const;
  bool reject(timing_issue issue, step_state* state);
  /// in_flight_stragglers under group_tokens (its comment).
  std::vector<straggler_flag> in_flight_token_stragglers(int64_t step) const;

  straggler_rule rule_;
  std::map<int64_t, step_state> steps_;
  std::optional<int64_t> last_closed_;
  timing_issue_counts issues_{};
  int64_t restarts_ = 0;
};

} // namespace sorl::sagc
