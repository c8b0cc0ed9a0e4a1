#pragma once

// Request placement for the scheduler role (ARCHITECTURE.md §3 step 2): which rollout worker
// runs which generation request. Cache-aware scheduling is designed but not built yet
// (ARCHITECTURE.md §6); the config refuses it, so it has no policy here.
//
// Pure bookkeeping, free of CAF: the scheduler's core (scheduler_core.hpp) turns worker joins,
// placements, completions and lost workers (the shell's peer_down) into calls on one
// `placement` object; no caller sends load reports yet (report_load is tested alone). Every decision is a deterministic function of the calls made so far (no
// clock, no randomness, no hash-order iteration), so a run replays exactly and the
// single-process and multi-process topologies place requests the same way.

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sorl {
struct experiment_config;
}

namespace sorl::scheduler {

/// How `placement::place` picks a worker for a request with no group affinity in effect.
enum class placement_policy {
  /// Cycle through the live workers in name order, regardless of load.
  round_robin,
  /// The live worker with the smallest load (see `placement_options`); ties go to the
  /// worker whose name sorts first, so the choice never depends on join order.
  least_loaded,
};

/// Knobs of a `placement`, taken from `[scheduler]` by `placement_options_from`.
struct placement_options {
  placement_policy policy = placement_policy::round_robin;

  /// Load units per queued token. A worker's load is
  ///   in_flight_requests + queued_token_weight × queued_tokens
  /// (dimensionless, "requests"). 0 (default) counts requests only; e.g. 1/512 makes 512
  /// queued tokens weigh as much as one extra request. Must be finite and ≥ 0.
  double queued_token_weight = 0.0;

  /// Keep the siblings of one group (same `group_id`) on the worker that received the
  /// group's first request, so the worker prefills the shared prompt once (ARCHITECTURE.md §3
  /// steps 2 and 3).
  bool group_affinity = false;

  /// Affinity yields to balance: a sibling goes to the least loaded worker instead of the
  /// group's home when load(home) − load(least loaded) > imbalance_threshold, in load units.
  /// An absolute difference rather than a ratio, because a ratio is undefined when the least
  /// loaded worker is idle, which is exactly when balance matters most. Must be ≥ 0.
  double imbalance_threshold = 2.0;
};

/// The scheduler's placement from a loaded (validated) experiment: `[scheduler] policy` and
/// `imbalance_threshold`, with group affinity on (the shell always keeps siblings together).
placement_options placement_options_from(const experiment_config& cfg);

/// Latest load report of one worker (sent by the rollout worker, passed on by the shell).
struct worker_load_report {
  /// Tokens the worker still has queued: prompt tokens awaiting prefill plus tokens still
  /// budgeted for generation, tokens. Must be ≥ 0.
  int64_t queued_tokens = 0;
};

/// A request that was in flight on a worker that left or was lost; the caller places it
/// again (same id, group and prompt size) on the remaining workers.
struct orphaned_request {
  uint64_t request_id = 0;
  uint64_t group_id = 0;
  int64_t prompt_tokens = 0; ///< tokens
};

/// Outcome of `placement::place`. Having no live worker is an expected state (every worker
/// died, or none has joined yet) and comes back as a value; the caller keeps the request
/// and retries after the next join.
struct place_result {
  std::optional<std::string> worker; ///< the chosen worker; empty when none is live
  std::string error;                 ///< why there is no worker; empty on success

  explicit operator bool() const {
    return worker.has_value();
  }
};

/// Counters for the step's metrics record; they only grow.
struct placement_stats {
  int64_t placed = 0;             ///< successful `place` calls (re-placements included)
  int64_t affinity_hits = 0;      ///< siblings sent to their group's home worker
  int64_t affinity_overrides = 0; ///< siblings sent elsewhere because of imbalance
  int64_t orphaned = 0;           ///< requests returned by `leave` / `worker_lost`
};

/// Which live worker runs each generation request, and what each worker has in flight.
///
/// Not thread-safe: owned by the scheduler actor and called on its thread only.
class placement {
public:
  /// Raises std::invalid_argument for a negative or non-finite `queued_token_weight` or
  /// `imbalance_threshold`. Failing here, at startup, beats failing on the first request of the
  /// first step.
  explicit placement(placement_options options = {});

  /// Adds a live worker with no load. Raises std::invalid_argument when `name` is empty or
  /// already live. A worker that left or was lost may join again under the same name.
  void join(const std::string& name);

  /// A worker departs on purpose. Same bookkeeping as `worker_lost` (a draining worker
  /// normally has nothing in flight, so the list is usually empty).
  std::vector<orphaned_request> leave(const std::string& name);

  /// A worker died or disconnected (the scheduler shell's peer_down, ARCHITECTURE.md §5).
  /// Forgets it and returns exactly the requests that were in flight on it, ordered by
  /// request id, for the caller to place again on the remaining workers. Groups whose home
  /// it was lose their home; the next sibling placed picks a new one. Raises
  /// std::invalid_argument for an unknown name.
  std::vector<orphaned_request> worker_lost(const std::string& name);

  /// Stores a worker's load report (replaces the previous one). Tokens of prompts placed on
  /// the worker since its last report are added on top until the next report, so a burst of
  /// placements between reports still spreads out. Raises std::invalid_argument for an
  /// unknown worker or a negative token count.
  void report_load(const std::string& name, const worker_load_report& report);

  /// Picks the worker for request `request_id` of group `group_id` with a prompt of
  /// `prompt_tokens` tokens, and records it as in flight there.
  /// Order of rules: (1) with group affinity, the group's home worker unless the imbalance
  /// threshold is passed; (2) otherwise the policy. A request placed on its group's home
  /// adds no prompt tokens to the home's queue estimate (the prefill is shared).
  /// Returns a value without a worker (and an error naming the request) when no worker is
  /// live. Raises std::invalid_argument when `request_id` is already in flight or
  /// `prompt_tokens` < 0 (the caller's mistake).
  place_result place(uint64_t request_id, uint64_t group_id, int64_t prompt_tokens);

  /// The request finished or was aborted; returns the worker it ran on and frees its slot.
  /// Raises std::invalid_argument naming the id when it is not in flight (never placed,
  /// already completed, or orphaned by a lost worker: the shell should drop late messages
  /// from a lost worker by checking `worker_of` first).
  std::string complete(uint64_t request_id);

  /// The worker `request_id` is in flight on, or std::nullopt.
  std::optional<std::string> worker_of(uint64_t request_id) const;

  /// Live workers in name order.
  std::vector<std::string> workers() const;
  bool is_live(const std::string& name) const;
  size_t live_workers() const {
    return workers_.size();
  }

  /// Current load of a live worker in load units (see placement_options::queued_token_weight).
  /// Raises std::invalid_argument for an unknown worker.
  double load(const std::string& name) const;

  /// Requests in flight on a live worker. Raises std::invalid_argument for an unknown worker.
  int64_t in_flight(const std::string& name) const;

  /// Requests in flight over all workers.
  size_t in_flight_total() const {
    return requests_.size();
  }

  /// The worker currently holding `group_id`'s shared prompt, if any (group affinity only).
  std::optional<std::string> group_home(uint64_t group_id) const;

  const placement_options& options() const {
    return options_;
  }
  const placement_stats& stats() const {
    return stats_;
  }

  /// The worker round robin chose last ("" before the first choice): besides the requests in
  /// flight, the only state later placements depend on. Checkpointed between steps.
  const std::string& round_robin_last() const {
    return rr_last_;
  }
  /// Restores a saved round-robin position. Any name is accepted: a worker that is not live
  /// is passed by, as one that left would be.
  void restore_round_robin(std::string last) {
    rr_last_ = std::move(last);
  }

private:
  struct worker_state {
    int64_t in_flight = 0;
    int64_t reported_tokens = 0; ///< last report
    int64_t placed_tokens = 0;   ///< prompt tokens placed since the last report
  };
  struct request_state {
    std::string worker;
    uint64_t group_id = 0;
    int64_t prompt_tokens = 0;
  };
  struct group_state {
    std::string home;      ///< empty when the home worker is gone
    int64_t in_flight = 0; ///< the group is forgotten when this reaches 0
  };

  double load_of(const worker_state& w) const;
  const std::string& choose_round_robin();
  const std::string& choose_least_loaded() const;
  /// The cache-aware hook (ARCHITECTURE.md §6, not built yet); raises
  /// placement_not_implemented until cache-aware routing is implemented. Unreachable today
  /// because the constructor rejects the policy, kept so the dispatch in `place` already
  /// has its final shape.
  const std::string& choose_by_policy();
  worker_state& live_worker(const std::string& name, const char* what);
  const worker_state& live_worker(const std::string& name, const char* what) const;
  void release(const request_state& r);

  placement_options options_;
  // std::map everywhere: iteration in key order keeps every decision deterministic.
  std::map<std::string, worker_state> workers_;
  std::map<uint64_t, request_state> requests_;
  std::map<uint64_t, group_state> groups_;
  std::string rr_last_; ///< name last chosen by round robin ("" before the first)
  placement_stats stats_;
};

/// The placement's checkpointed state as JSON text:
/// {"format": "sorl.scheduler", "format_version": 1, "round_robin_last": "<worker>"}.
std::string save_placement_state(const placement& p);

/// Restores a state written by save_placement_state. Raises std::invalid_argument naming the
/// key, changing nothing, for text that is not such a state.
void restore_placement_state(std::string_view text, placement& p);

} // namespace sorl::scheduler
