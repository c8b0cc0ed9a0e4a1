#pragma once

// Prefix KV cache: a radix tree over token ids whose nodes own whole KV blocks of a kv_cache,
// so a prompt that starts like one computed before (a group sibling arriving later, prompts
// sharing an instruction, the next turn of a chat whose earlier turns finished here) prefills
// only what follows the longest cached prefix. This is RadixAttention (Zheng et al. 2024,
// "SGLang: Efficient Execution of Structured Language Model Programs", §3) at the
// granularity of the cache's blocks, as in vLLM's automatic prefix caching: an edge is one
// block of `block_size` tokens, and a node holds one reference on the block whose KV those
// tokens wrote after the path above it. Partial blocks are never cached, so a cached block is
// full and never written again: a sequence that adopts cached blocks appends after them, and
// kv_cache's copy-on-write covers a truncation into one.
//
// Correctness. A block's KV depends on every token before it and on the weights, so an entry
// is keyed by the whole path from the root (a shared first token followed by different ones
// shares nothing past the first differing block) and by the weights' version: entries carry
// the version they were computed under, match() serves only the current one, and
// set_version() drops every other. A child is found by a 64-bit hash of its block's tokens
// and then compared token by token, so a hash collision is a miss, never a wrong hit.
// A hit changes which rows a forward pass computes, not what: the cached KV is what a full
// prefill writes for those positions, and the rows after it see the same keys. The logits
// agree in the last bits only, as for a change of batch composition
// (runtime/ml/policy/sampler.hpp): fp32 GEMMs over a different number of rows round
// differently (|Δ logit| ~ 2e-6 on the test model, tests/ml/prefix_cache_test.cpp), and a KV
// block written by one-token decode passes (a finished turn) rounds as parked KV does.
//
// Eviction. At most max_tokens / block_size blocks are held. Past that, the least recently
// used leaf goes first (matches and inserts mark their whole path used), as in SGLang's
// radix cache; a block that a live sequence still holds is only freed when that sequence
// releases it. Not thread-safe: one owner (the generator) at a time.

#include "runtime/ml/policy/kv_cache.hpp"

#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace sorl::ml {

/// Counters of a prefix_cache since construction (or take_stats).
struct prefix_cache_stats {
  std::int64_t lookups = 0;             ///< match() calls
  std::int64_t lookup_tokens = 0;       ///< tokens those calls could have served (their limits)
  std::int64_t hit_tokens = 0;          ///< of them, served from cached blocks
  std::int64_t inserted_blocks = 0;     ///< new nodes
  std::int64_t evicted_blocks = 0;      ///< nodes dropped to stay within the budget
  std::int64_t invalidated_blocks = 0;  ///< nodes dropped by a weight-version change or clear()
};

/// Radix tree of cached KV blocks over one kv_cache (see the file comment).
class prefix_cache {
 public:
  /// Holds at most max_tokens / block_size whole blocks of `cache` (0: holds nothing, every
  /// match misses). Entries are computed under weights `version`. `cache` must outlive the
  /// prefix_cache. Throws std::invalid_argument for max_tokens < 0.
  prefix_cache(kv_cache& cache, std::int64_t max_tokens, std::uint64_t version = 0);
  /// Drops every reference the tree holds.
  ~prefix_cache();
  prefix_cache(const prefix_cache&) = delete;
  prefix_cache& operator=(const prefix_cache&) = delete;

  /// The longest cached prefix of tokens[0, limit) under the current version, in whole blocks:
  /// its block ids are written to `out` (cleared first), its length in tokens, a multiple of
  /// block_size and at most `limit`, is returned. Marks the matched path most recently used.
  /// A caller that must still compute logits for the prompt's last token passes
  /// limit = size - 1. Throws std::invalid_argument for limit outside [0, tokens.size()].
  std::int64_t match(const std::vector<std::int32_t>& tokens, std::int64_t limit,
                     std::vector<std::int32_t>& out);

  /// Caches the whole blocks of tokens[0, n) from sequence `s`, whose first n positions must
  /// hold those tokens' KV computed under the current version. A block already cached for
  /// the same path keeps its node (the sequence's copy is not taken). Evicts least recently
  /// used leaves past the budget afterwards. Throws std::invalid_argument for n outside
  /// [0, min(tokens.size(), cache.length(s))], std::out_of_range for an unknown sequence.
  void insert(const std::vector<std::int32_t>& tokens, std::int64_t n, seq_id s);

  /// The weights are now `version`: every entry computed under another one is dropped (KV of
  /// version v is wrong under v + 1). A no-op when the version is unchanged.
  void set_version(std::uint64_t version);
  std::uint64_t version() const noexcept { return version_; }
  /// Drops every entry.
  void clear();

  std::int64_t cached_blocks() const noexcept { return blocks_; }
  std::int64_t cached_tokens() const noexcept { return blocks_ * block_size_; }
  /// The budget, whole blocks.
  std::int64_t max_blocks() const noexcept { return max_blocks_; }
  /// Whether every cached block's path and version agree with what the tree records, leaves
  /// are exactly the LRU set and each node holds a reference on its block (for tests).
  bool consistent() const;

  const prefix_cache_stats& stats() const noexcept { return stats_; }
  /// Reads and resets the counters.
  prefix_cache_stats take_stats() noexcept;

 private:
  struct node;
  node* child(node& parent, const std::int32_t* key) const;
  void touch(node& n);
  void remove_leaf(node* n);
  void evict_to(std::int64_t max_blocks);
  void drop_all(std::int64_t& counter);

  kv_cache& cache_;
  std::int64_t block_size_ = 0;
  std::int64_t max_blocks_ = 0;
  std::uint64_t version_ = 0;
  std::unique_ptr<node> root_;
  std::int64_t blocks_ = 0;
  std::uint64_t tick_ = 0;
  std::set<std::pair<std::uint64_t, node*>> leaves_;  ///< (last use, node): eviction order
  prefix_cache_stats stats_;
};

}  // namespace sorl::ml
