#pragma once

// Full weight synchronisation, free of CAF and libtorch: plan bounded buckets over a list of
// tensors, hash them, and reassemble them on the receiving side with every field validated
// before anything reaches the model (ARCHITECTURE.md §6, SparseRL-Sync; this file is the `full`
// payload that the sparse codec replaces).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sorl::sync {

/// Element type of a synced tensor.
enum class weight_dtype : uint8_t { bf16 = 0, fp32 = 1 };

/// Bytes per element: 2 for bf16, 4 for fp32.
size_t element_size(weight_dtype d);

/// XXH3-64 of `n` bytes; the per-tensor and per-bucket checksum.
uint64_t hash_bytes(const void* data, size_t n);

/// XXH3-64 over the per-tensor hashes in order: the whole-model hash of a version.
uint64_t model_hash(const std::vector<uint64_t>& tensor_hashes);

/// What one tensor is; shared by publisher and worker. `bytes()` = elements × element size.
struct tensor_meta {
  std::string name;
  std::vector<int64_t> shape;
  weight_dtype dtype = weight_dtype::bf16;
  uint64_t hash = 0;

  uint64_t elements() const;
  uint64_t bytes() const {
    return elements() * element_size(dtype);
  }
};

/// Checks that a version's `header` lists exactly the tensors of `expected` (names, shapes,
/// dtypes, in order; hashes ignored). Returns an error message naming the first difference,
/// or std::nullopt.
std::optional<std::string> match_header(uint64_t version, const std::vector<tensor_meta>& header,
                                        const std::vector<tensor_meta>& expected);

/// A contiguous element range of one tensor inside a bucket.
struct chunk_ref {
  uint32_t tensor = 0;  ///< index into the version's tensor list
  uint64_t offset = 0;  ///< first element
  uint64_t count = 0;   ///< elements
};

/// Splits tensors into buckets of at most `bucket_bytes` payload bytes each, in model order;
/// a tensor larger than a bucket is cut at element boundaries. Zero-element tensors produce
/// no chunk. Raises std::invalid_argument when bucket_bytes is smaller than one element.
std::vector<std::vector<chunk_ref>> plan_buckets(const std::vector<tensor_meta>& tensors,
                                                 uint64_t bucket_bytes);

/// One received chunk: where it goes and its bytes (borrowed from the message).
struct chunk_view {
  uint32_t tensor = 0;
  uint64_t offset = 0;   ///< first element
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

/// Reassembles a full version on a rollout worker. Every bucket is checked (version, index,
/// checksum, tensor ids, bounds, overlap) before its bytes are copied into staging buffers;
/// the model is only written by the caller after verify() succeeded, so a bad or missing
/// bucket never leaves a half-updated model. Called on one thread.
class weight_assembler {
public:
  /// Starts version `version`. `expected` lists what the worker's model holds (names, shapes,
  /// dtypes; hashes ignored); the header must match it exactly. `bucket_count` is at most the
  /// header's elements (each bucket carries one or more), so staging is sized by the local
  /// model, never by a claim. Returns an error message or std::nullopt.
  std::optional<std::string> begin(uint64_t version, const std::vector<tensor_meta>& header,
                                   uint64_t header_model_hash, uint32_t bucket_count,
                                   const std::vector<tensor_meta>& expected);

  /// Adds bucket `index` of the current version. `checksum` covers the chunks' bytes in
  /// order. Returns an error message (and leaves the staging untouched) or std::nullopt.
  std::optional<std::string> add_bucket(uint64_t version, uint32_t index,
                                        const std::vector<chunk_view>& chunks,
                                        uint64_t checksum);

  /// True when every bucket of the current version arrived.
  bool complete() const;

  /// Recomputes every tensor hash and the model hash and compares them with the header.
  /// Returns the computed model hash, or an error message naming the first bad tensor.
  std::optional<std::string> verify(uint64_t* computed_model_hash);

  /// Staged bytes of tensor `i` (valid after verify() succeeded).
  const std::vector<uint8_t>& staged(size_t i) const {
    return staging_[i];
  }
  uint64_t version() const {
    return version_;
  }
  bool active() const {
    return active_;
  }
  /// Drops the current version (e.g. after an error).
  void reset();

private:
  bool active_ = false;
  uint64_t version_ = 0;
  uint64_t model_hash_ = 0;
  std::vector<tensor_meta> header_;
  std::vector<std::vector<uint8_t>> staging_;
  std::vector<uint64_t> filled_;      ///< bytes received per tensor
  std::vector<bool> bucket_seen_;
  uint32_t buckets_left_ = 0;
};

} // namespace sorl::sync
