#pragma once

// The trainer's side of the weight-sync protocol: the publisher's VersionReady, decoded by
// actors/sync/sync_wire.hpp, as the step driver's event (step_driver.hpp), so the trainer
// shell reads no field itself.

#include "actors/sync/sync_messages.hpp"
#include "actors/trainer/step_driver.hpp"

namespace sorl::trainer {

/// The driver's event of `v`: every field the driver reads (publish_ns is the publisher's
/// own timing and stays there).
inline ev::version_ready version_ready_of(const sync::version_ready& v) {
  ev::version_ready x;
  x.version = v.version;
  x.model_hash = v.model_hash;
  x.workers = v.workers;
  x.verified_workers = v.verified_workers;
  x.bytes_sent = v.bytes_sent;
  x.dense_bytes = v.dense_bytes;
  x.sparse_bytes = v.sparse_bytes;
  x.elements = v.elements;
  x.changed_elements = v.changed_elements;
  x.recurring_elements = v.recurring_elements;
  x.bound_bits = v.bound_bits;
  x.encode_ns = v.encode_ns;
  x.apply_ns_max = v.apply_ns_max;
  x.full_workers = v.full_workers;
  x.sparse_workers = v.sparse_workers;
  x.resyncs = v.resyncs;
  return x;
}

} // namespace sorl::trainer
