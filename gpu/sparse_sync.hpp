#pragma once

// CUDA backend of the sparse bf16 weight-delta codec (ARCHITECTURE.md §6, SparseRL-Sync): encode on
// the publisher's device, apply on a worker's device. The buckets are byte-identical to
// sync::encode_delta (runtime/sync/delta_codec.hpp, which specifies the format); the kernels'
// per-thread logic lives in gpu/sparse_sync_kernels.cuh and has a CPU twin (gpu/delta_twin.hpp)
// tested without a GPU. Publisher-to-worker transport over NCCL is in gpu/nccl_broadcast.hpp.
//
// Blocking: every call here synchronises its stream before returning; run it on a detached
// actor or the device's owning actor, never on the shared scheduler threads.

#include "runtime/sync/delta_codec.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sorl::gpu {

/// Where the time of the last call went (cudaEvent time on the workspace's stream, host wall
/// time around it).
struct delta_gpu_timing {
  /// encode: first kernel to the payload complete on the device (scan, compaction, parameter
  /// choice, payload bits, and the two small copies back that size the next steps); excludes
  /// copying the payload back, the host framing and the checksums.
  float encode_device_ms = 0;
  /// encode: the whole encode_delta_gpu call.
  double encode_total_ms = 0;
  /// apply: bucket upload, decode and scatter on the device; excludes the host check.
  float apply_device_ms = 0;
  /// apply: sync::check_delta_bucket on the host.
  double apply_check_ms = 0;
};

/// Device scratch buffers, a stream and timing events, reused across calls so that steady-state
/// encodes and applies allocate nothing. One per device and thread; the current device at
/// construction must stay current for its calls. Not thread-safe.
class delta_gpu_workspace {
public:
  /// Uses `stream` (not owned), or a stream of its own when null.
  explicit delta_gpu_workspace(cudaStream_t stream = nullptr);
  ~delta_gpu_workspace();
  delta_gpu_workspace(const delta_gpu_workspace&) = delete;
  delta_gpu_workspace& operator=(const delta_gpu_workspace&) = delete;

  cudaStream_t stream() const;
  /// Timing of the last encode and the last apply made with this workspace.
  const delta_gpu_timing& timing() const;

  struct state;
  state& impl() {
    return *impl_;
  }

private:
  std::unique_ptr<state> impl_;
};

/// sync::encode_delta with `base` and `next` of every source in device memory (bf16 bit
/// patterns, [elements] uint16 each, on the workspace's device). Same contract, same buckets,
/// same stats. Uses a temporary workspace when `ws` is null. Throws std::invalid_argument as
/// encode_delta does, std::runtime_error on a CUDA error.
std::vector<std::vector<uint8_t>> encode_delta_gpu(uint64_t base_version, uint64_t version,
                                                   const std::vector<sync::delta_source>& sources,
                                                   const sync::delta_options& options,
                                                   sync::delta_stats* stats = nullptr,
                                                   delta_gpu_workspace* ws = nullptr);

/// sync::apply_delta_bucket with the targets' `bits` in device memory: checks the host bucket
/// with sync::check_delta_bucket (returning its error, nothing written), uploads it, decodes
/// every sparse entry on the device (one thread per entry: the bit stream is sequential by
/// format), scatters the steps (added modulo 2^16) and copies dense entries. Returns when the
/// targets are written. Throws std::runtime_error on a CUDA error.
std::optional<std::string> apply_delta_bucket_gpu(const uint8_t* data, size_t size,
                                                  uint64_t base_version, uint64_t version,
                                                  const std::vector<sync::delta_target>& targets,
                                                  delta_gpu_workspace* ws = nullptr);

} // namespace sorl::gpu
