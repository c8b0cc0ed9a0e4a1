#pragma once

// The rollout worker's whole side of weight synchronisation (ARCHITECTURE.md §3 step 6, §6
// SparseRL-Sync), free of CAF and libtorch: version headers and buckets in, acknowledgements
// and log lines out. Full versions are reassembled by weight_assembler, sparse deltas by
// delta_receiver; a complete, checked version is written into the model only while the
// worker is idle (no rollout in flight), because a version can overtake the abort of the
// previous step's stragglers (they come from different actors), so a busy worker holds it
// until its last rollout ends instead of refusing it.
//
// The model is reached only through `delta_target`s (its contiguous bf16 parameters, in model
// order): a delta is scattered into them, a full version is copied into them byte for byte.
// Not thread-safe: owned by one rollout worker.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/sync/delta_receiver.hpp"
#include "actors/sync/sync_messages.hpp"
#include "actors/sync/weight_sync.hpp"

namespace sorl::sync {

/// Receives versions for one rollout worker and applies them to its model.
class weight_receiver {
public:
  /// The version held before the first version is applied, and after a delta failed its hash
  /// check (the weights are then of unknown version until a full sync).
  static constexpr uint64_t no_version = ~uint64_t{0};

  /// What one event asks the shell to do, in this order: call weights_changed() on the
  /// rollout core when `weights_changed` (the model's bits were written), write `logs`, send
  /// `ack` to the publisher.
  struct result {
    bool weights_changed = false;
    std::vector<log_line> logs;
    std::optional<weight_ack> ack;
  };

  /// `name` prefixes the log lines. `expected` lists the model's tensors (names, shapes,
  /// bf16; hashes ignored) and `targets` their bits, both in model order with
  /// targets[i].tensor == i and targets[i].elements == expected[i].elements(); the targets'
  /// memory must outlive the receiver. `now` stamps the acknowledgements' apply_ns. Raises
  /// std::invalid_argument when expected and targets disagree.
  weight_receiver(std::string name, std::vector<tensor_meta> expected,
                  std::vector<delta_target> targets, clock_ns now);

  /// A version header (msg::WeightVersion) arrived: drops whatever version was being received
  /// or waited to be applied (without acknowledging it) and starts this one. Acknowledges a
  /// failure at once when the header does not fit the model (or, for a delta, the version
  /// held is not its base).
  result on_header(const version_header& header);

  /// A bucket (msg::WeightBucket) arrived; `idle`: no rollout is in flight. A bucket with a
  /// non-empty delta belongs to a sparse version, any other to a full one. The last bucket of
  /// a version makes it pending; it is applied now when idle, else by a later on_idle().
  result on_bucket(const bucket_view& bucket, bool idle);

  /// The worker has no rollout in flight: applies the pending version, if any.
  result on_idle();

  /// The version the model holds, or no_version.
  uint64_t version() const {
    return version_;
  }

  /// True while a complete, checked version waits for the worker to be idle.
  bool pending() const {
    return pending_ != pending_apply::none;
  }

private:
  enum class pending_apply { none, full, delta };

  result on_delta_bucket(const bucket_view& bucket, bool idle);
  result maybe_apply(bool idle);
  void copy_full_version();
  void acknowledge(result& r, uint64_t version, bool ok, uint64_t hash, const std::string& reason,
                   bool full);

  std::string name_;
  std::vector<tensor_meta> expected_;
  std::vector<delta_target> targets_;
  clock_ns now_;
  weight_assembler assembler_;
  delta_receiver receiver_;
  int64_t version_started_ns_ = 0;
  pending_apply pending_ = pending_apply::none;
  uint64_t pending_hash_ = 0; ///< full versions: the hash verify() computed
  uint64_t version_ = no_version;
};

} // namespace sorl::sync
