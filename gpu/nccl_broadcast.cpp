#include "gpu/nccl_broadcast.hpp"

#include "gpu/check.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/nccl_check.hpp"

namespace sorl::gpu {

std::vector<std::vector<uint8_t>> broadcast_buckets_nccl(
  ncclComm_t comm, int root, const std::vector<std::vector<uint8_t>>& buckets,
  cudaStream_t stream) {
  int rank = 0;
  SORL_NCCL_CHECK(ncclCommUserRank(comm, &rank));
  const bool is_root = rank == root;

  // Round 1: how many buckets. Round 2: their sizes. Small, so one staging buffer each.
  device_buffer d_count;
  uint64_t count = is_root ? buckets.size() : 0;
  auto* dc = d_count.reserve_as<uint64_t>(1);
  SORL_CUDA_CHECK(cudaMemcpyAsync(dc, &count, sizeof count, cudaMemcpyHostToDevice, stream));
  SORL_NCCL_CHECK(ncclBroadcast(dc, dc, 1, ncclUint64, root, comm, stream));
  SORL_CUDA_CHECK(cudaMemcpyAsync(&count, dc, sizeof count, cudaMemcpyDeviceToHost, stream));
  SORL_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (count == 0)
    return {};

  std::vector<uint64_t> sizes(count, 0);
  if (is_root)
    for (size_t i = 0; i < count; ++i)
      sizes[i] = buckets[i].size();
  device_buffer d_sizes;
  auto* ds = d_sizes.reserve_as<uint64_t>(count);
  SORL_CUDA_CHECK(cudaMemcpyAsync(ds, sizes.data(), count * sizeof(uint64_t),
                                  cudaMemcpyHostToDevice, stream));
  SORL_NCCL_CHECK(ncclBroadcast(ds, ds, count, ncclUint64, root, comm, stream));
  SORL_CUDA_CHECK(cudaMemcpyAsync(sizes.data(), ds, count * sizeof(uint64_t),
                                  cudaMemcpyDeviceToHost, stream));
  SORL_CUDA_CHECK(cudaStreamSynchronize(stream));

  // Round 3: all payloads through one staging buffer, one NCCL group.
  uint64_t total = 0;
  std::vector<uint64_t> at(count);
  for (size_t i = 0; i < count; ++i) {
    at[i] = total;
    total += sizes[i];
  }
  device_buffer d_staging;
  auto* stage = d_staging.reserve_as<uint8_t>(total);
  if (is_root)
    for (size_t i = 0; i < count; ++i)
      SORL_CUDA_CHECK(cudaMemcpyAsync(stage + at[i], buckets[i].data(), sizes[i],
                                      cudaMemcpyHostToDevice, stream));
  SORL_NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; i < count; ++i)
    SORL_NCCL_CHECK(ncclBroadcast(stage + at[i], stage + at[i], sizes[i], ncclUint8, root, comm,
                                  stream));
  SORL_NCCL_CHECK(ncclGroupEnd());
  std::vector<std::vector<uint8_t>> received;
  if (!is_root) {
    received.resize(count);
    for (size_t i = 0; i < count; ++i) {
      received[i].resize(sizes[i]);
      SORL_CUDA_CHECK(cudaMemcpyAsync(received[i].data(), stage + at[i], sizes[i],
                                      cudaMemcpyDeviceToHost, stream));
    }
  }
  SORL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return received;
}

} // namespace sorl::gpu
