#pragma once

// The weight-sync messages of messages/sync.capnp in decoded form, free of CAF and Cap'n
// Proto, so that the publisher's and the rollout worker's sync logic (publisher_core.hpp,
// weight_receiver.hpp) runs and is tested without an actor or a wire format. sync_wire.hpp
// translates field by field between these and the capnp structs of the same name.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/sync/weight_sync.hpp"

namespace sorl::sync {

/// A monotonic clock in nanoseconds (the shells pass steady_clock; tests pass a fake).
using clock_ns = std::function<int64_t()>;

/// msg::WeightVersion: the header of one version, what the worker must end up with.
struct version_header {
  uint64_t version = 0;
  std::vector<tensor_meta> tensors; ///< model order; index = tensor id in buckets
  uint64_t model_hash = 0;          ///< model_hash() over the tensors' hashes
  uint32_t bucket_count = 0;
  uint64_t total_bytes = 0;         ///< payload bytes over all buckets
  bool full = false;                ///< false: a sparse delta against base_version
  uint64_t base_version = 0;        ///< sparse only (0 for full)
  uint64_t changed_elements = 0;    ///< sparse only: bf16 elements that differ from the base
  int64_t encode_ns = 0;            ///< publisher encode time so far, ns
};

/// msg::WeightBucket as the publisher builds it. Full versions: `chunks` borrow the bytes of
/// the snapshot they were cut from, `checksum` is hash_bytes() over their bytes in order, and
/// `delta` is empty. Sparse versions: `delta` is one delta_codec bucket, `chunks` is empty
/// and `checksum` 0.
struct weight_bucket {
  uint64_t version = 0;
  uint32_t index = 0;
  std::vector<chunk_view> chunks;
  uint64_t checksum = 0;
  std::vector<uint8_t> delta;
};

/// msg::WeightBucket as the worker receives it: every pointer borrows the message.
struct bucket_view {
  uint64_t version = 0;
  uint32_t index = 0;
  std::vector<chunk_view> chunks;
  uint64_t checksum = 0;
  const uint8_t* delta = nullptr; ///< empty (size 0): a full bucket
  size_t delta_size = 0;
};

/// msg::WeightAck without the worker name (the sender's own).
struct weight_ack {
  uint64_t version = 0;
  bool ok = false;
  uint64_t model_hash = 0; ///< what the worker computed (0 when it computed none)
  std::string reason;      ///< why not ok; empty when ok
  int64_t apply_ns = 0;    ///< from the version header's arrival to this ack, ns
  bool full = false;       ///< the version came (or was announced) as a full sync
};

/// msg::VersionReady: every live worker holds `version` (see messages/sync.capnp for each
/// field's meaning).
struct version_ready {
  uint64_t version = 0;
  uint64_t model_hash = 0;
  uint32_t workers = 0;
  uint64_t bytes_sent = 0; ///< per worker: bytes sent over all workers / max(workers, 1)
  uint64_t dense_bytes = 0;
  int64_t publish_ns = 0;
  uint64_t changed_elements = 0;
  uint64_t elements = 0;
  int64_t encode_ns = 0;
  int64_t apply_ns_max = 0;
  uint32_t full_workers = 0;
  uint32_t sparse_workers = 0;
  uint32_t resyncs = 0;
  uint64_t sparse_bytes = 0;
  uint32_t verified_workers = 0;
  uint64_t recurring_elements = 0; ///< of changed_elements, those changed in an earlier delta
  /// The delta's order-0 bound in bits (delta_stats::bound_bits); 0 when no delta was encoded.
  double bound_bits = 0.0;
};

/// A log line a core asks its shell to write (the shell owns the logger).
struct log_line {
  enum class level { debug, warn, error };
  level lvl = level::debug;
  std::string text; ///< complete, prefixed with the actor's name
};

} // namespace sorl::sync
