#pragma once

// Request placement for the scheduler role (ARCHITECTURE.md §3 step 2): which rollout worker
// runs which generation request, by round robin, least load, or cache-aware: where the
// longest prefix of the prompt is estimated cached (prefix_index.hpp) unless that worker is
// too loaded (ARCHITECTURE.md §6 WAR, cache-aware scheduling).
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

#include "actors/scheduler/prefix_index.hpp"

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
  /// The worker whose estimated prefix cache holds the longest prefix of the prompt (ties to
  /// the less loaded, then the name), when that prefix covers at least `cache_threshold` of
  /// the prompt and the worker's load exceeds the least loaded worker's by at most
  /// `cache_imbalance_threshold` (past it, the least loaded). A prompt without such a prefix
  /// goes to the worker whose index holds the fewest blocks (the most cache room) among those
  /// within `cache_imbalance_threshold` of the least loaded, ties to the less loaded, then
  /// the name. Work-conserving: whichever of these chose the worker (a prefix or cache room),
  /// a worker with nothing in flight takes the request instead when the chosen one's load
  /// exceeds its own by more than `imbalance_threshold`. A group's later siblings follow its
  /// home (placement_options::group_affinity), so an idle worker takes the next group; they
  /// balance as under the other policies only where that re-prefills less of the prompt than
  /// a rollout generates (long episodes of a short prompt, not short answers to a long one).
  cache_aware,
  /// SGLang's router rule (sgl-router `cache_aware`, with its launcher's defaults), kept as a
  /// baseline for bench/: with loads = requests in flight, when max - min > 64 and max > 1.5 ×
  /// min the least loaded; otherwise the worker with the longest prefix match if it covers
  /// more than 0.3 of the prompt, else the worker whose index holds the fewest tokens. SGLang
  /// matches characters of the request text and picks an arbitrary worker among those holding
  /// the deepest match; here tokens in the workers' blocks, and ties go to the name that sorts
  /// first. Group affinity is not part of it (placement_options::group_affinity false).
  sglang_cache_aware,
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
  /// Under cache_aware the larger of it and cache_imbalance_threshold applies, unless moving
  /// the sibling is cheap: the least loaded worker misses no more of the prompt (tokens past
  /// its estimated cached prefix) than a rollout is expected to generate
  /// (`placement::generation_estimate`), so the prefill it adds is smaller than the decode it
  /// takes over.
  /// An absolute difference rather than a ratio, because a ratio is undefined when the least
  /// loaded worker is idle, which is exactly when balance matters most. Must be ≥ 0.
  double imbalance_threshold = 2.0;

  /// cache_aware: the least share of a prompt's tokens its longest estimated cached prefix must
  /// cover for the prefix to decide the worker, [0, 1]; below it the least loaded worker
  /// takes the request.
  double cache_threshold = 0.3;
  /// cache_aware: a cached prefix yields to the least loaded worker when its worker's load
  /// exceeds the least loaded one's by more than this, in load units (requests), >= 0. Looser
  /// than `imbalance_threshold`: a trainer submits a whole step at once, and a prefix that
  /// stays on one worker is prefilled once, where a prefix spread over all is prefilled on each
  /// and competes for every cache (bench/war/route_bench.cpp measures the trade).
  double cache_imbalance_threshold = 64.0;
  /// Tokens per block of the workers' prefix caches (runtime/ml/policy/kv_cache.hpp block_size): a
  /// prompt's blocks are what the index matches. >= 1.
  int64_t block_size = 16;
  /// Blocks each worker's estimated index keeps (the workers' prefix-cache budget in
  /// blocks); least recently used dropped past it. >= 0.
  int64_t index_blocks = int64_t{1} << 20;
};

/// The scheduler's placement from a loaded (validated) experiment: `[scheduler] policy`,
/// `imbalance_threshold`, `cache_threshold` and `cache_imbalance_threshold`, with group affinity
/// on (siblings kept together) except under sglang_cache_aware; `index_blocks` is `rollout.prefix_cache_bytes` in blocks of the
/// model's KV, which the caller passes as `prefix_cache_blocks`.
placement_options placement_options_from(const experiment_config& cfg, int64_t prefix_cache_blocks);

/// One request to place: its ids, prompt size and the chained hashes of its prompt's whole
/// blocks (block_chain; empty: nothing to match, as for round robin and least loaded).
struct placement_request {
  uint64_t request_id = 0;
  uint64_t group_id = 0;
  int64_t prompt_tokens = 0;  ///< tokens, >= 0
  std::vector<uint64_t> chain;
};

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
  int64_t cache_routed = 0;       ///< placed where their longest prefix was estimated cached
  int64_t cache_balanced = 0;     ///< a prefix decided, but imbalance sent them elsewhere
  int64_t matched_tokens = 0;     ///< estimated cached prompt tokens on the chosen workers
  int64_t prompt_tokens = 0;      ///< prompt tokens placed (`place` with a chain)
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
  /// As above for a request with its prompt's block chain: with a cache-aware policy the chain
  /// decides (see placement_policy) and then enters the chosen worker's index.
  place_result place(const placement_request& r);

  /// The workers' weights changed: they dropped their prefix caches, so every index is
  /// cleared.
  void weights_changed();

  /// A live worker's estimated prefix index. Raises std::invalid_argument for an unknown one.
  const prefix_index& index(const std::string& name) const;

  /// The request finished or was aborted; returns the worker it ran on and frees its slot.
  /// Raises std::invalid_argument naming the id when it is not in flight (never placed,
  /// already completed, or orphaned by a lost worker: the shell should drop late messages
  /// from a lost worker by checking `worker_of` first).
  std::string complete(uint64_t request_id);

  /// A rollout finished having added `tokens` tokens after its prompt (what it generated, and
  /// in a multi-turn episode its environment's replies: the worker's finish event). Feeds
  /// `generation_estimate`. Raises std::invalid_argument for `tokens` < 0.
  void observe_generation(int64_t tokens);
  /// Tokens a rollout is expected to add after its prompt: an exponential moving average of
  /// the observed ones with weight 1/16 for the newest (a step's worth of rollouts dominates,
  /// a single straggler does not), starting at the first; std::nullopt before any. Checkpointed
  /// with the round-robin position (save_placement_state).
  std::optional<double> generation_estimate() const {
    return generation_estimate_;
  }
  /// Restores a saved estimate. Raises std::invalid_argument for a negative or non-finite one.
  void restore_generation_estimate(std::optional<double> tokens);

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
  /// Whether the policy matches prompts' block chains (cache_aware, sglang_cache_aware).
  bool cache_policy() const;
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
    explicit worker_state(int64_t index_blocks) : index(index_blocks) {}
    prefix_index index; ///< what it is estimated to hold in its prefix cache
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
  /// The cache-aware rules (placement_policy::cache_aware / sglang_cache_aware).
  const std::string& choose_cache_aware(const placement_request& r);
  const std::string& choose_sglang(const placement_request& r);
  const std::string& choose_by_policy(const placement_request& r);
  /// cache_aware only: whether `least` (the least loaded worker) has nothing in flight while
  /// `chosen` runs more than imbalance_threshold load units beyond it, so `least` takes the
  /// request whatever the cache says.
  bool idle_relief(const worker_state& chosen, const std::string& least) const;
  /// cache_aware only: whether a sibling of `r`'s group placed on `to` instead of its home
  /// re-prefills at most generation_estimate() tokens of the prompt (see imbalance_threshold).
  bool cheap_to_move(const placement_request& r, const worker_state& to) const;
  worker_state& live_worker(const std::string& name, const char* what);
  const worker_state& live_worker(const std::string& name, const char* what) const;
  void release(const request_state& r);

  placement_options options_;
  // std::map everywhere: iteration in key order keeps every decision deterministic.
  std::map<std::string, worker_state> workers_;
  std::map<uint64_t, request_state> requests_;
  std::map<uint64_t, group_state> groups_;
  std::string rr_last_; ///< name last chosen by round robin ("" before the first)
  std::optional<double> generation_estimate_; ///< tokens; see generation_estimate()
  placement_stats stats_;
};

/// The placement's checkpointed state as JSON text:
/// {"format": "sorl.scheduler", "format_version": 1, "round_robin_last": "<worker>",
///  "generation_estimate": tokens} (the last key only once a rollout has finished).
std::string save_placement_state(const placement& p);

/// Restores a state written by save_placement_state (one without "generation_estimate"
/// leaves no estimate). Raises std::invalid_argument naming the key, changing nothing, for
/// text that is not such a state.
void restore_placement_state(std::string_view text, placement& p);

} // namespace sorl::scheduler
