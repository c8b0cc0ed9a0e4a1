#pragma once

// The version protocol of weight synchronisation (ARCHITECTURE.md §6
// SparseRL-Sync), free of CAF: which payload each rollout worker gets for a version, what
// an acknowledgement means, and when the publisher may advance its base snapshot.
//
// Rules:
// - A sparse delta is only ever sent to a worker whose acknowledged version is the base the
//   delta was encoded against. Every other worker (new, recovered, stale after a failure, or
//   every worker when a full anchor is due) gets a full sync.
// - A worker that fails a delta (apply error, hash mismatch, wrong base) is marked stale and is
//   sent the same version in full; a failed full sync cannot be repaired and fails the job.
// - The base advances to version v only when every live worker acknowledged v with the
//   published hash, so the publisher's snapshot never runs ahead of what workers hold.
//
// Not thread-safe: owned by the sync_publisher actor.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace sorl {
struct experiment_config;
}

namespace sorl::sync {

/// Options of the protocol (`[sync]` in the TOML, built by `protocol_options_from`).
struct sync_protocol_options {
  bool sparse = true;     ///< `sync.mode = "sparse"`; false: every version is sent in full
  int64_t full_every = 0; ///< a full anchor for versions divisible by N; 0 = never forced
};

/// The protocol's options from a loaded (validated) experiment: `[sync] mode`, `full_every`.
sync_protocol_options protocol_options_from(const experiment_config& cfg);

/// What the publisher sends for one version.
struct sync_plan {
  uint64_t version = 0;
  std::optional<uint64_t> base_version; ///< set when any worker gets a delta
  std::vector<std::string> sparse;      ///< workers that get the delta against base_version
  std::vector<std::string> full;        ///< workers that get the full version
  std::string why_full;                 ///< why the full list is not empty, for the log
};

/// What the publisher does after an acknowledgement.
enum class ack_action {
  wait,      ///< accepted; other workers still owe their acknowledgement
  complete,  ///< accepted; every live worker holds the version (call commit())
  send_full, ///< the delta failed on this worker: send it the full version
  fail,      ///< a full sync failed: the job cannot continue
  ignore,    ///< not for the version in flight, from an unknown worker, or a repeat
};

/// "wait" | "complete" | "send_full" | "fail" | "ignore".
const char* to_string(ack_action a);

/// Per-worker bookkeeping of the version protocol.
class sync_protocol {
public:
  explicit sync_protocol(sync_protocol_options options = {});

  /// A rollout worker joined; it holds no version and gets a full sync next. Joining while a
  /// version is in flight does not make the version wait for it. No-op for a known name.
  void add_worker(const std::string& name);

  /// A worker is gone. Returns true when that completes the version in flight.
  bool remove_worker(const std::string& name);

  /// Starts `version` (strictly greater than the last one begun). Raises std::logic_error
  /// while a version is in flight and std::invalid_argument for a version not after the last.
  sync_plan begin(uint64_t version);

  /// An acknowledgement from `worker` for `version`: `ok` (applied, and the hash it computed
  /// equals the published one) or not. See ack_action.
  ack_action on_ack(const std::string& worker, uint64_t version, bool ok);

  /// True while a version is in flight.
  bool in_flight() const {
    return in_flight_;
  }

  /// Ends the version in flight once every live worker acknowledged it: it becomes the base.
  /// Raises std::logic_error when workers still owe acknowledgements.
  void commit();

  /// The version every live worker acknowledged last (the publisher's snapshot); nullopt
  /// before the first commit.
  std::optional<uint64_t> base_version() const {
    return base_;
  }

  /// Workers that still owe an acknowledgement of the version in flight.
  std::vector<std::string> waiting() const;

  /// The version a worker holds, as acknowledged; nullopt for a new or stale worker.
  std::optional<uint64_t> holds(const std::string& worker) const;

  /// Workers re-sent a full version after a failed delta, in the version in flight.
  uint32_t resyncs() const {
    return resyncs_;
  }

  size_t workers() const {
    return workers_.size();
  }

private:
  struct worker_state {
    std::optional<uint64_t> holds;
    bool waiting = false;
    bool full = false; ///< the payload in flight to it is a full version
  };

  sync_protocol_options options_;
  std::map<std::string, worker_state> workers_;
  std::optional<uint64_t> base_;
  std::optional<uint64_t> last_begun_;
  bool in_flight_ = false;
  uint64_t version_ = 0;
  uint32_t resyncs_ = 0;
};

} // namespace sorl::sync
