@0xa01134071c33ac36;
# Weight synchronisation: learner → sync_publisher snapshots, publisher → rollout_worker
# versions in bounded buckets, worker → publisher acknowledgements. Values travel as exact
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
  full @5 :Bool;             # every element is sent (full sync)
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
  checksum @3 :UInt64;       # XXH3-64 over the chunks' data in order
}

# Worker → publisher, after applying every bucket of a version (or failing to).
struct WeightAck {
  version @0 :UInt64;
  worker @1 :Text;
  ok @2 :Bool;
  modelHash @3 :UInt64;      # what the worker computed
  reason @4 :Text;           # why not ok
}

# Publisher → trainer: every live worker holds `version` with the publisher's hash.
struct VersionReady {
  version @0 :UInt64;
  modelHash @1 :UInt64;
  workers @2 :UInt32;
  bytesSent @3 :UInt64;      # per worker
  denseBytes @4 :UInt64;     # a full bf16 copy, for comparison
  publishNs @5 :Int64;       # publisher clock, from snapshot to last ack
}
