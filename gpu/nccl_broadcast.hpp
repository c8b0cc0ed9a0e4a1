#pragma once

// Publisher-to-workers transport of a version's delta buckets over NCCL (ARCHITECTURE.md §6): the
// root rank broadcasts the bucket count, the bucket sizes, then every bucket's bytes through a
// device staging buffer; the other ranks receive them into host memory, where
// sync::check_delta_bucket validates them before any apply.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

namespace sorl::gpu {

/// Collective over every rank of `comm` (each calls it once per version, with the same `root`).
/// On `root`, `buckets` are sent and an empty vector is returned (the caller holds them); on
/// the other ranks `buckets` is ignored and the received buckets are returned in index order.
/// Runs on `stream` and synchronises it before returning (blocking: call it from the actor
/// that owns the device). Throws std::runtime_error on a CUDA or NCCL error.
std::vector<std::vector<uint8_t>> broadcast_buckets_nccl(
  ncclComm_t comm, int root, const std::vector<std::vector<uint8_t>>& buckets,
  cudaStream_t stream);

} // namespace sorl::gpu
