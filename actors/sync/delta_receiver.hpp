#pragma once

// The rollout worker's side of a sparse version (ARCHITECTURE.md §6 SparseRL-Sync): collect
// the delta buckets of one version, validate each as it arrives, and apply them all at once
// when the last one is in, then prove the result bit for bit against the published hashes.
// Free of CAF and libtorch: weight_receiver.hpp passes the worker's bf16 parameters as
// delta_targets.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sync/delta_codec.hpp"
#include "actors/sync/weight_sync.hpp"

namespace sorl::sync {

/// Collects and applies the buckets of one sparse version. Every bucket is fully checked on
/// arrival (framing, checksum, versions, tensor ids, ranges, positions) and copied, so nothing
/// reaches the weights before the whole version is in; the apply itself then cannot fail
/// half-way. What can still fail is the final hash check (the worker's base was not the
/// publisher's): the caller then holds modified weights of unknown version and must ask for
/// a full sync. Called on one thread.
class delta_receiver {
public:
  /// Starts sparse `version`, a delta against `base_version`. `held` is the version the worker
  /// holds now (nullopt: none or unknown); it must equal `base_version`. `header` lists the
  /// published tensors with their hashes and must match `expected` (names, shapes, bf16)
  /// exactly. 1 ≤ `bucket_count` ≤ max(1, the header's elements): every bucket but the one
  /// of a version without changes carries a changed element, and nothing is allocated per
  /// announced bucket, so a hostile count costs no memory. Returns an error message or
  /// std::nullopt.
  std::optional<std::string> begin(uint64_t version, uint64_t base_version,
                                   std::optional<uint64_t> held,
                                   const std::vector<tensor_meta>& header,
                                   uint64_t header_model_hash, uint32_t bucket_count,
                                   const std::vector<tensor_meta>& expected);

  /// Checks one delta bucket (`size` bytes) of the current version against `targets` (their
  /// ids and element counts; nothing is written) and keeps a copy. `index` is the bucket
  /// index the message carries; it must match the bucket's own header. Returns an error
  /// message (the receiver is then unchanged) or std::nullopt.
  std::optional<std::string> add_bucket(uint64_t version, uint32_t index, const uint8_t* data,
                                        size_t size, const std::vector<delta_target>& targets);

  /// True when every bucket of the current version arrived.
  bool complete() const;

  /// Scatters every bucket into `targets` (the same targets the buckets were checked
  /// against; apply_checked_delta_bucket, so the codes are not validated a second time), then
  /// hashes each target (XXH3-64 of its bf16 bytes) and compares with the
  /// header. Returns std::nullopt when every tensor hash and the model hash match (the
  /// computed model hash is stored in `computed_model_hash` either way), else an error naming
  /// the first mismatching tensor. Raises std::logic_error when not complete().
  std::optional<std::string> apply(const std::vector<delta_target>& targets,
                                   uint64_t* computed_model_hash);

  /// Changed elements carried by the buckets received so far.
  uint64_t changed() const {
    return changed_;
  }
  uint64_t version() const {
    return version_;
  }
  bool active() const {
    return active_;
  }
  /// Drops the current version.
  void reset();

private:
  bool active_ = false;
  uint64_t version_ = 0;
  uint64_t base_version_ = 0;
  uint64_t model_hash_ = 0;
  std::vector<tensor_meta> header_;
  std::map<uint32_t, std::vector<uint8_t>> buckets_; ///< received so far, by index
  uint32_t count_ = 0;                               ///< buckets the version announced
  uint32_t left_ = 0;
  uint64_t changed_ = 0;
};

} // namespace sorl::sync
