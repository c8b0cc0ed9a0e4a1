#pragma once

// CPU twin of the GPU delta codec (gpu/sparse_sync.hpp): the same kernels, run on the CPU by
// an emulated launch that walks blocks and then threads in order, calling the same
// per-thread functions (gpu/sparse_sync_kernels.cuh); the block-wide scans and reductions that
// CUB does on the device are sequential sums here, which give the same integers. Slow (one
// core, no SIMD); it exists so that tests without a GPU pin the GPU algorithm to the CPU codec.

#include "runtime/sync/delta_codec.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sorl::gpu {

/// sync::encode_delta computed by the emulated GPU pipeline (K1..K4 and the host framing);
/// same contract and the same bytes.
std::vector<std::vector<uint8_t>> encode_delta_twin(uint64_t base_version, uint64_t version,
                                                    const std::vector<sync::delta_source>& sources,
                                                    const sync::delta_options& options,
                                                    sync::delta_stats* stats = nullptr);

/// sync::apply_delta_bucket computed by the emulated GPU decoder (host check, one thread per
/// sparse entry decoding, one per change scattering); same contract and the same result.
std::optional<std::string> apply_delta_bucket_twin(const uint8_t* data, size_t size,
                                                   uint64_t base_version, uint64_t version,
                                                   const std::vector<sync::delta_target>& targets);

} // namespace sorl::gpu
