#pragma once

// The scheduler's approximate view of each rollout worker's prefix KV cache
// (runtime/ml/policy/prefix_cache.hpp), for cache-aware placement (placement.hpp). A prompt is cut
// into the workers' 16-token blocks and each whole block named by a chained hash,
// h_0 = H(block_0), h_i = H(h_{i-1}, block_i), so one hash stands for the whole path up to its
// block, as one node of the worker's radix tree does; the index of a worker is the set of
// chains it was sent, least recently used dropped past a block budget (the worker's own), the
// deepest blocks of a path before its first ones, as the worker's leaf-first eviction does. It
// is approximate, as the router tree of SGLang (Zheng et al. 2024) and Preble (Srivatsa et al.
// 2024, arXiv 2407.00023) are: built from what was routed, not from the worker's own
// evictions, and cleared when the weights change (the workers drop their caches then). No
// CAF, no libtorch; deterministic (no iteration over hash order decides anything).

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace sorl::scheduler {

/// Chained 64-bit hashes of the whole `block_size`-token blocks of `tokens` (a partial last
/// block has none): element i names tokens[0, (i + 1) * block_size). Raises
/// std::invalid_argument for block_size < 1.
std::vector<uint64_t> block_chain(const std::vector<int32_t>& tokens, int64_t block_size);

/// One worker's estimated cached blocks: an LRU set of chained block hashes.
class prefix_index {
public:
  /// Holds at most `capacity` blocks (0 holds nothing). Raises std::invalid_argument if < 0.
  explicit prefix_index(int64_t capacity);

  /// Leading blocks of `chain` held: the length in blocks of the longest cached prefix.
  int64_t match(const std::vector<uint64_t>& chain) const;
  /// Records every block of `chain` as cached and most recently used (the worker will hold
  /// the prompt's blocks after its prefill), dropping least recently used ones past capacity.
  void insert(const std::vector<uint64_t>& chain);
  void clear();
  int64_t size() const {
    return static_cast<int64_t>(where_.size());
  }
  int64_t capacity() const {
    return capacity_;
  }

private:
  int64_t capacity_ = 0;
  std::list<uint64_t> lru_; ///< front = most recent
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

} // namespace sorl::scheduler
