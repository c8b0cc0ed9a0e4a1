#pragma once

// Host side of the GPU delta codec, plain C++ (no CUDA): the segment plan that the kernels
// launch over, the adapter that hands per-segment results to sync::delta_bucket_framer (so
// that the buckets are sync::encode_delta's bytes by construction), and the entry table of a
// checked bucket for the decoder. Shared by the CUDA backend (gpu/sparse_sync.cu) and its CPU
// twin (gpu/delta_twin.cpp).

#include "gpu/sparse_sync_kernels.cuh"
#include "runtime/sync/delta_codec.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sorl::gpu {

/// One encoder segment: delta_segment_elements elements of one tensor (the last one shorter),
/// and its first K1/K2 tile in the launch.
struct segment_desc {
  uint32_t source = 0;     ///< index into the sorted sources
  uint64_t offset = 0;     ///< first element within the tensor
  uint64_t count = 0;      ///< elements, 1..delta_segment_elements
  uint64_t tile_begin = 0; ///< first tile; the segment has ceil(count / tile_elements) tiles
};

/// Cuts the sorted sources into segments; `tiles_out` receives the total tile count.
std::vector<segment_desc> plan_delta_segments(const std::vector<const sync::delta_source*>& sorted,
                                              uint64_t* tiles_out);

/// What the encoder's device pass computed for one segment.
struct segment_result {
  uint64_t changed = 0;      ///< elements whose bits differ
  code_params params{0, 0, 0}; ///< choose_delta_params of the whole segment's changes
  uint64_t sparse_bits = 0;  ///< delta_sparse_bits with those parameters
};

/// Sparse payload bytes of a segment result.
inline uint64_t sparse_payload_bytes(const segment_result& r) {
  return sync::delta_sparse_bytes(r.sparse_bits);
}

/// True when the encoder codes the whole segment dense (sync::delta_dense_wins).
inline bool segment_is_dense(const segment_desc& d, const segment_result& r) {
  return sync::delta_dense_wins(d.count, r.sparse_bits);
}

/// Bytes the framing reads from a backend besides the per-segment results. Called on the
/// framing thread only.
class segment_data {
public:
  virtual ~segment_data() = default;
  /// The whole segment's sparse payload, sparse_payload_bytes(result) bytes (only asked for
  /// segments with changes that are not dense).
  virtual const uint8_t* sparse_payload(size_t segment) = 0;
  /// next bits of elements [a, a + count) of the segment (segment-relative) into `out`,
  /// 2 × count bytes, not necessarily aligned.
  virtual void copy_next(size_t segment, uint64_t a, uint64_t count, uint8_t* out) = 0;
  /// The segment's changes: `changed` segment-relative positions (increasing) and steps. Only
  /// asked for an entry that does not fit the bucket it would start in.
  virtual void copy_changes(size_t segment, uint32_t* positions, uint16_t* steps) = 0;
};

/// Frames buckets exactly as sync::encode_delta does: feeds each segment's device result to
/// sync::delta_bucket_framer (the one implementation of the placement rules), which asks
/// `data` for the whole payload, for next bits, or, for an entry it has to cut, for the
/// segment's changes. Fills every field of `stats` when not null; `who` names the caller in
/// exceptions.
std::vector<std::vector<uint8_t>> frame_delta_buckets(
  uint64_t base_version, uint64_t version, const std::vector<const sync::delta_source*>& sorted,
  const std::vector<segment_desc>& segments, const std::vector<segment_result>& results,
  segment_data& data, const sync::delta_options& options, sync::delta_stats* stats,
  const char* who);

/// One entry record of a bucket that sync::check_delta_bucket accepted.
struct entry_record {
  uint32_t tensor = 0;
  sync::delta_entry_kind kind = sync::delta_entry_kind::sparse;
  code_params params{0, 0, 0};
  uint64_t offset = 0, count = 0, changed = 0, payload_bytes = 0;
  uint64_t payload_at = 0; ///< byte offset of the payload within the bucket
};

/// Reads the entry table of a checked bucket (no validation: check it first).
std::vector<entry_record> read_checked_entries(const uint8_t* data, size_t size);

} // namespace sorl::gpu
