#pragma once

// Translation between the weight-sync messages (messages/sync.capnp, WeightSnapshot of
// messages/train.capnp) and their decoded forms (sync_messages.hpp, publisher_core.hpp), for
// the sync publisher's and the rollout worker's shells, and the cores' log lines to the
// process log. The bytes on the wire are fixed: tests/actors/sync/sync_wire_test.cpp keeps
// reference encoders and compares every message byte for byte.
// Decoded forms borrow the message's bytes: keep the envelope alive while using them.

#include <string>
#include <vector>

#include "actors/sync/publisher_core.hpp"
#include "actors/sync/sync_messages.hpp"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/envelope.hpp"

namespace sorl::sync {

/// msg::WeightVersion of `h`.
envelope encode_version_header(const version_header& h);

/// msg::WeightBucket of `b`: its chunks (full) or its delta (sparse).
envelope encode_bucket(const weight_bucket& b);

/// msg::WeightAck of `a`, sent by `worker`.
envelope encode_ack(const weight_ack& a, const std::string& worker);

/// msg::VersionReady of `v`.
envelope encode_version_ready(const version_ready& v);

/// A VersionReady's fields.
version_ready decode_version_ready(msg::VersionReady::Reader r);

/// A WeightVersion's fields.
version_header decode_version_header(msg::WeightVersion::Reader v);

/// A WeightBucket's fields; chunks and delta borrow the message.
bucket_view decode_bucket(msg::WeightBucket::Reader b);

/// A WeightAck's fields (the worker name is the caller's to read).
weight_ack decode_ack(msg::WeightAck::Reader a);

/// msg::WeightSnapshot of `s`: version, dtype, then per tensor (model order) its name, shape
/// and bit patterns, copied from `s.data`. Raises std::invalid_argument when names, shapes and
/// data differ in count.
envelope encode_snapshot(const snapshot_view& s);

/// A WeightSnapshot's fields; `keep_alive` (the envelope's words) owns the borrowed bytes.
/// Reads each tensor blob once (every blob access counts its size against the reader's
/// traversal limit).
snapshot_view decode_snapshot(msg::WeightSnapshot::Reader s,
                              std::shared_ptr<const void> keep_alive);

/// Writes a core's log lines to the process log (spdlog) at their levels, in order.
void write_logs(const std::vector<log_line>& logs);

} // namespace sorl::sync
