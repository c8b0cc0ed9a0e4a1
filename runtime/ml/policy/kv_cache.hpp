#pragma once

// Paged key/value cache for batched decoding. Keys and values live in one pool of fixed-size
// blocks (as in vLLM's PagedAttention, Kwon et al. 2023); each sequence owns a list of block
// ids. Blocks are reference-counted, so a fork shares its parent's whole KV (group siblings
// share their prompt) and a write into a shared, partly filled block copies that block first
// (copy-on-write). Sequences are ragged: each has its own length, can be truncated (rollback
// of rejected draft tokens) and released while others continue (continuous batching).
// Not thread-safe: one owner (a rollout worker) at a time.

#include "runtime/ml/policy/model.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace sorl::ml {

/// Sizing of a kv_cache.
struct kv_cache_options {
  std::int64_t block_size = 16;      ///< token positions per block
  std::int64_t initial_blocks = 64;  ///< pool capacity at construction, blocks
  std::int64_t max_blocks = 0;       ///< capacity limit, blocks; 0 = grow (doubling) unbounded
};

/// Index tensors for one batched append, built by kv_cache::plan_append and consumed by
/// policy_model::forward_cached. B = sequences in the call, N = sum of new tokens k_i,
/// K = max k_i, S = max length after the append. All tensors live on the cache's device.
struct kv_append_plan {
  std::int64_t batch = 0;      ///< B
  std::int64_t total_new = 0;  ///< N
  std::int64_t max_new = 0;    ///< K
  std::int64_t max_len = 0;    ///< S
  at::Tensor write_slots;      ///< [N] int64: pool slot of each new token, packed call order
  at::Tensor positions;        ///< [N] int64: absolute position of each new token
  at::Tensor gather_slots;     ///< [B * S] int64: slot of key j of sequence i (pad: a zero slot)
  at::Tensor masked;           ///< [B, K, S] bool: true where query t of i must not see key j
  at::Tensor pad_rows;         ///< [B * K] int64: packed row for padded query (i, t); K > 1 only
  at::Tensor unpad_rows;       ///< [N] int64: padded row (i * K + t) of each packed row; K > 1 only
  at::Tensor last_rows;        ///< [B] int64: packed row of each sequence's last new token
  std::vector<seq_id> seqs;                ///< the sequences, call order
  std::vector<std::int64_t> old_lengths;   ///< lengths before the append, for rollback
};

/// Block-paged, reference-counted KV cache for one policy_model's shape.
class kv_cache {
 public:
  /// Allocates a zeroed pool of `opts.initial_blocks` blocks (+1 reserved all-zero block that
  /// padding reads from) of [n_layers, 2, block_size, n_kv_heads * head_dim] `dtype` on
  /// `device`. Throws std::invalid_argument for non-positive sizes.
  explicit kv_cache(const model_dims& dims, kv_cache_options opts = {},
                    c10::Device device = c10::kCPU, c10::ScalarType dtype = c10::kFloat);

  /// A new, empty sequence.
  seq_id create();
  /// A new sequence sharing all of `parent`'s cached positions (no copy; copy-on-write on the
  /// first write into a shared partly filled block). Throws std::out_of_range if unknown.
  seq_id fork(seq_id parent);
  /// Keeps positions [0, length) of `s` and frees blocks no longer needed. Throws
  /// std::out_of_range for an unknown sequence or a length outside [0, length(s)].
  void truncate(seq_id s, std::int64_t length);
  /// Drops `s`; blocks shared with other sequences stay. Throws std::out_of_range if unknown.
  void release(seq_id s);

  /// A new sequence of `length` cached positions over `blocks` (each gains a reference; no
  /// copy), for KV kept outside any sequence (runtime/ml/policy/prefix_cache.hpp). Throws
  /// std::out_of_range for a block id that is not allocated, std::invalid_argument unless
  /// (blocks.size() - 1) * block_size < length <= blocks.size() * block_size.
  seq_id adopt(const std::vector<std::int32_t>& blocks, std::int64_t length);
  /// The block ids of `s`, position order (position p lives in block p / block_size). Throws
  /// std::out_of_range if unknown.
  const std::vector<std::int32_t>& blocks(seq_id s) const;
  /// Takes one reference on an allocated block for a holder other than a sequence, so the
  /// block outlives the sequences that wrote it. Throws std::out_of_range otherwise.
  void retain(std::int32_t block);
  /// Drops a reference taken with retain(); the block is freed with its last reference.
  /// Throws std::out_of_range for a block that is not allocated.
  void drop(std::int32_t block);
  /// References on `block` (sequences and retain() holders); 0 for a free block. Throws
  /// std::out_of_range for an id outside the pool.
  std::int32_t refcount(std::int32_t block) const;

  bool contains(seq_id s) const noexcept;
  /// Cached positions of `s`. Throws std::out_of_range if unknown.
  std::int64_t length(seq_id s) const;
  std::int64_t num_sequences() const noexcept { return static_cast<std::int64_t>(seqs_.size()); }
  /// Blocks referenced by at least one sequence (a block shared by forks counts once).
  std::int64_t blocks_in_use() const noexcept;
  /// Blocks in the pool now (used + free), excluding the reserved zero block.
  std::int64_t blocks_capacity() const noexcept { return capacity_ - 1; }
  std::int64_t block_size() const noexcept { return opts_.block_size; }
  const model_dims& dims() const noexcept { return dims_; }
  c10::Device device() const noexcept;
  c10::ScalarType dtype() const noexcept;

  /// Reserves positions for appending counts[i] tokens to seqs[i] (copy-on-write of shared
  /// partial blocks, new blocks, pool growth), advances the lengths and returns the indices a
  /// forward pass needs. Strong guarantee on error: throws c10::Error (unknown or repeated
  /// sequence, count < 1, length + count > max_seq, out of blocks under max_blocks) before
  /// changing anything.
  kv_append_plan plan_append(const std::vector<seq_id>& seqs,
                             const std::vector<std::int64_t>& counts);
  /// Undoes plan_append's length changes (after a failed forward pass).
  void rollback(const kv_append_plan& plan);

  /// Key pool of `layer`: [capacity * block_size, n_kv_heads * head_dim], a view into the pool.
  /// Invalidated by pool growth (plan_append); fetch it after planning.
  at::Tensor keys(std::int64_t layer) const;
  /// Value pool of `layer`, same shape and caveat as keys().
  at::Tensor values(std::int64_t layer) const;

 private:
  struct sequence {
    std::vector<std::int32_t> blocks;
    std::int64_t length = 0;
  };
  sequence& find(seq_id s);
  const sequence& find(seq_id s) const;
  std::int32_t allocate_block();
  void check_allocated(std::int32_t block, const char* what) const;
  void drop_block(std::int32_t block);
  void grow(std::int64_t min_capacity);

  model_dims dims_;
  kv_cache_options opts_;
  at::Tensor pool_;  // [n_layers, 2, capacity * block_size, n_kv_heads * head_dim]
  std::int64_t capacity_ = 0;            // blocks, including reserved block 0
  std::vector<std::int32_t> refcount_;   // per block
  std::vector<std::int32_t> free_;       // free block ids; back() is handed out next
  std::unordered_map<seq_id, sequence> seqs_;
  seq_id next_id_ = 0;
};

}  // namespace sorl::ml
