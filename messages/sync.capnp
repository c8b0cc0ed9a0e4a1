@0xa01134071c33ac36;
# Weight synchronisation: publisher → rollout_worker versions in bounded buckets, worker →
# publisher acknowledgements, publisher → trainer VersionReady (the learner's WeightSnapshot
# is in train.capnp). Values travel as exact
# bf16 (or fp32) bit patterns. Ids are stable; evolve by adding fields only.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("sorl::msg");

enum WeightDtype {
  bf16 @0;
  fp32 @1;
}

struct TensorMeta {
  name @0 :Text;             # Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  shape @1 :List(Int64);
  dtype @2 :WeightDtype;
  hash @3 :UInt64;           # XXH3-64 of the tensor's bytes
}

# Header of version `version`: what the worker must end up with.
struct WeightVersion {
  version @0 :UInt64;
  tensors @1 :List(TensorMeta);  # in model order; index = tensor id in buckets
  modelHash @2 :UInt64;      # XXH3-64 over the per-tensor hashes in order
  bucketCount @3 :UInt32;
  totalBytes @4 :UInt64;     # payload bytes over all buckets
  full @5 :Bool;             # every element is sent (full sync); false: a sparse delta
  baseVersion @6 :UInt64;    # sparse: the version the delta applies to (the worker's current)
  changedElements @7 :UInt64; # sparse: elements whose bf16 bits differ from baseVersion
  encodeNs @8 :Int64;        # publisher time to encode the buckets, ns
}

# A contiguous range of one tensor's elements.
struct TensorChunk {
  tensor @0 :UInt32;         # index into WeightVersion.tensors
  offset @1 :UInt64;         # first element
  data @2 :Data;             # raw little-endian element bytes
}

struct WeightBucket {
  version @0 :UInt64;
  index @1 :UInt32;          # 0 ≤ index < bucketCount
  chunks @2 :List(TensorChunk);
  checksum @3 :UInt64;       # XXH3-64 over the chunks' data in order (full versions)
  delta @4 :Data;            # sparse versions: one self-checking delta bucket
                             # (runtime/sync/delta_codec.hpp); `chunks` is then empty
}

# Worker → publisher, after applying every bucket of a version (or failing to).
struct WeightAck {
  version @0 :UInt64;
  worker @1 :Text;
  ok @2 :Bool;
  modelHash @3 :UInt64;      # what the worker computed
  reason @4 :Text;           # why not ok
  applyNs @5 :Int64;         # worker time to apply and hash the version, ns
  full @6 :Bool;             # the version arrived as a full sync
}

# Publisher → trainer: every live worker holds `version` with the publisher's hash.
struct VersionReady {
  version @0 :UInt64;
  modelHash @1 :UInt64;
  workers @2 :UInt32;
  bytesSent @3 :UInt64;      # payload bytes per worker, averaged over the workers
  denseBytes @4 :UInt64;     # a full bf16 copy, for comparison
  publishNs @5 :Int64;       # publisher clock, from snapshot to last ack
  changedElements @6 :UInt64; # bf16 elements that differ from the previous version
  elements @7 :UInt64;       # bf16 elements of the model
  encodeNs @8 :Int64;        # publisher encode time, ns (sparse and full payloads)
  applyNsMax @9 :Int64;      # slowest worker's apply + hash time, ns
  fullWorkers @10 :UInt32;   # workers that received this version as a full sync
  sparseWorkers @11 :UInt32; # workers that received it as a sparse delta
  resyncs @12 :UInt32;       # workers that failed the delta and were sent a full sync
  sparseBytes @13 :UInt64;   # bytes of the sparse payload (per worker that got it), 0 if none
  verifiedWorkers @14 :UInt32; # of `workers`, those whose last acknowledgement of `version`
                               # was ok and carried `modelHash` (the publisher compares)
  recurringElements @15 :UInt64; # of changedElements, those that changed in an earlier
                                 # version the publisher encoded as a delta (temporal locality)
  boundBits @16 :Float64;        # the delta's order-0 bound, bits (runtime/sync/delta_codec.hpp
                                 # delta_stats::bound_bits); 0 when no delta was encoded
}
