#pragma once

// The sync publisher's logic (ARCHITECTURE.md §3 step 6, §6 SparseRL-Sync), free of CAF and
// Cap'n Proto: a learner snapshot in, the version's payloads (a full one and, for workers
// that hold the acknowledged base, a sparse delta against it) built at most once each and
// shared by every worker that gets them; acknowledgements in, re-sends after a failed delta,
// and the statistics of msg::VersionReady out once every live worker holds the version.
// Who gets which payload and when a version is complete is sync_protocol's; this class adds
// the payloads, the per-worker acknowledged hashes and the statistics.
//
// Not thread-safe: owned by the sync_publisher actor.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/sync/sync_messages.hpp"
#include "actors/sync/sync_protocol.hpp"
#include "actors/sync/weight_sync.hpp"
#include "runtime/sync/delta_codec.hpp"

namespace sorl::sync {

/// Borrowed bytes.
struct byte_span {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

/// msg::WeightSnapshot in decoded form. `data` borrows the message's bytes; `keep_alive`
/// owns them (the shell passes the envelope's buffer) so that the core can keep the
/// snapshot as the delta base after its message is gone. The three lists are checked for
/// equal length by on_snapshot, not here.
struct snapshot_view {
  uint64_t version = 0;
  weight_dtype dtype = weight_dtype::bf16;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<byte_span> data;
  std::shared_ptr<const void> keep_alive;
};

/// The two payloads of a version.
enum class payload_kind { full, sparse };

/// One version's payload: its header and buckets, sent as they are to every worker of
/// its kind. Full buckets borrow the snapshot's bytes (valid while the core holds it).
struct payload {
  version_header header;
  std::vector<weight_bucket> buckets;
  uint64_t bytes = 0; ///< bucket payload bytes (full: the dense bytes; sparse: encoded bytes)
};

/// Options of the publisher (`[sync]` in the TOML).
struct publisher_options {
  sync_protocol_options protocol;
  uint64_t bucket_bytes = 64ull << 20; ///< `sync.bucket_bytes`, bytes per bucket at most
};

/// The publisher's options from `[sync]` (mode, full_every, bucket_bytes); the defaults above
/// equal the config's.
publisher_options publisher_options_from(const experiment_config& cfg);

/// The publisher's state machine.
class publisher_core {
public:
  /// Send payload(kind) to `worker`: its header, then its buckets in index order.
  struct send {
    std::string worker;
    payload_kind kind = payload_kind::full;
  };

  /// What one event asks the shell to do, in this order: write `logs`, do `sends`, send
  /// `ready` to the trainer, fail the job with `fail`.
  struct result {
    std::vector<log_line> logs;
    std::vector<send> sends;
    std::optional<version_ready> ready;
    std::optional<std::string> fail;
  };

  /// `name` prefixes the log lines; `now` times encoding and publishing (ns). Raises what
  /// sync_protocol's constructor raises.
  publisher_core(std::string name, publisher_options options, clock_ns now);

  /// A rollout worker of the roster. No-op for a known name.
  void add_worker(const std::string& name);

  /// A learner snapshot (msg::WeightSnapshot): starts its version, or fails the job when a
  /// version is still in flight, the snapshot is malformed (list lengths, a tensor's bytes
  /// vs its shape; a sparse delta whose tensors changed name, size or dtype) or there is no
  /// worker to publish to.
  result on_snapshot(snapshot_view snapshot);

  /// An acknowledgement (msg::WeightAck) from `worker`: ok only when `ack.ok` and its hash
  /// is the published one. Ignored when not for the version in flight, from an unknown
  /// worker, or a repeat; a failed delta re-sends the version in full; a failed full sync
  /// fails the job; the last missing acknowledgement completes the version (`ready`).
  result on_ack(const std::string& worker, const weight_ack& ack);

  /// A rollout worker is gone: fails the job when it was the last, completes the version in
  /// flight when every other live worker already acknowledged it.
  result on_worker_down(const std::string& name);

  /// The payload of `kind` of the version in flight; valid from the send that names it until
  /// the next on_snapshot or the version's completion. Raises std::logic_error when it was
  /// not built.
  const payload& payload_of(payload_kind kind) const;

  /// The shell spent `ns` putting payload(kind) into wire messages: counted as encode time
  /// (the publisher's time to encode the buckets), so that the header of `kind`, read after
  /// this call, and the version's VersionReady include it. Raises std::logic_error when that
  /// payload was not built.
  void add_encode_ns(payload_kind kind, int64_t ns);

  /// The version last begun and its published model hash.
  uint64_t version() const {
    return version_;
  }
  uint64_t model_hash() const {
    return model_hash_;
  }
  const sync_protocol& protocol() const {
    return protocol_;
  }

private:
  void begin(const snapshot_view& snapshot, result& r);
  void send_payload(result& r, const std::string& worker, payload_kind kind);
  const payload& full_payload();
  const payload& sparse_payload(uint64_t base_version);
  version_header header(bool full, uint64_t base_version, uint32_t bucket_count,
                        uint64_t total_bytes) const;
  void complete(result& r);

  std::string name_;
  uint64_t bucket_bytes_;
  clock_ns now_;
  sync_protocol protocol_;
  std::set<std::string> workers_; ///< live
  /// The snapshot every live worker acknowledged (the delta base) and the one in flight.
  std::optional<snapshot_view> base_;
  std::optional<snapshot_view> next_;
  // The version in flight.
  uint64_t version_ = 0;
  uint64_t model_hash_ = 0;
  std::vector<tensor_meta> metas_;
  std::optional<payload> full_; ///< built on first need
  std::optional<payload> sparse_;
  /// Every element a delta of this run changed: sync_recurring_fraction's reference.
  change_history history_;
  uint64_t changed_ = 0;
  uint64_t recurring_ = 0;
  double bound_bits_ = 0.0; ///< the delta's order-0 bound (delta_stats::bound_bits)
  uint64_t elements_ = 0;
  uint64_t dense_bytes_ = 0;
  uint64_t bytes_sent_ = 0; ///< over all workers
  uint32_t full_sends_ = 0;
  uint32_t sparse_sends_ = 0;
  int64_t encode_ns_ = 0;
  int64_t apply_ns_max_ = 0;
  int64_t started_ns_ = 0;
  /// The model hash of each worker's last ok acknowledgement of the version in flight.
  std::map<std::string, uint64_t> acked_hash_;
};

} // namespace sorl::sync
