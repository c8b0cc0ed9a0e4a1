#pragma once

// A depth-bounded suffix trie over token ids with occurrence counts, suffix links and
// incremental matching: the data structure of suffix speculative decoding (SuffixDecoding,
// Oliaro et al., arXiv 2411.04975; ARCHITECTURE.md §6 WAR). No CAF, no libtorch.
//
// Node v stands for one token string s(v) of length depth(v) <= max_depth; count(v) is the
// number of start positions, over every sequence in the tree, at which s(v) occurs (an
// occurrence that ends the sequence counts too, so children's counts can sum to less than
// the parent's). The trie holds every substring of length <= max_depth of every sequence.
// link(v) is the node of s(v) without its first token, which always exists, because a
// substring's suffixes are substrings; count(link(v)) >= count(v), so removing a sequence
// never leaves a link to a freed node.
//
// Why links instead of the reference implementation's re-walks: a matcher keeps the deepest
// node whose string is a suffix of its context and advances it by each new token in
// amortised O(1) (the Aho-Corasick step), and every shorter matching suffix is one link away.
// A draft then costs O(draft tokens x candidate match lengths actually expanded), not the
// O(L^2) of walking each of the L suffix lengths from the root at every call.
//
// Drafting follows the reference rule (anchor: ArcticInference `_speculate_path`): for each
// matched suffix of length m, expand from its node along the most frequent child, the
// running probability being the product of count(child) / count(parent), while it stays >=
// min_token_prob and the draft is shorter than min(max_tokens, floor(m * spec_factor +
// spec_offset)); score = the sum of the emitted tokens' probabilities (an estimate of the
// accepted length); the highest score wins, ties to the longer match. These frequencies
// choose drafts only: verification never reads them (runtime/ml/policy/generate.hpp).
//
// Memory: nodes are 32 bytes in an arena with a free list, edges live in one open-addressing
// hash table (16 bytes a slot, load <= 1/2), sequences keep their tokens (4 bytes each) so
// that remove_sequence can walk them. live_bytes() adds these up. Without path compression a
// novel token adds up to max_depth nodes, which is why max_depth stays small (32 by default;
// vLLM's default is 24) and the global index is bounded by bytes with eviction.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace sorl::suffix_index {

/// Node index in a suffix_tree; suffix_tree::root is the empty string, no_node is "none".
using node_id = std::int32_t;
inline constexpr node_id no_node = -1;

/// How drafts are chosen (the defaults are the reference implementation's, ArcticInference
/// `arctic_inference/vllm/config.py`, with its suffix-only draft length 16).
struct draft_params {
  std::int32_t max_tokens = 16;     ///< longest draft, tokens (>= 0)
  double spec_factor = 1.0;         ///< a match of m tokens allows floor(m * factor + offset)
  double spec_offset = 0.0;         ///< draft tokens (clamped to [0, max_tokens])
  double min_token_prob = 0.1;      ///< stop once the path probability falls below this
};

/// A proposed draft: tokens in order, the score (sum of path probabilities, in [0, tokens])
/// and the match length it was expanded from (0 = no draft).
struct draft {
  std::vector<std::int32_t> tokens;
  double score = 0.0;
  std::int32_t match_len = 0;
};

class suffix_tree {
 public:
  using seq_id = std::int64_t;
  static constexpr node_id root = 0;

  /// max_depth: the longest substring indexed, tokens, in [1, 4096]. Throws
  /// std::invalid_argument outside it.
  explicit suffix_tree(std::int32_t max_depth);
  suffix_tree(const suffix_tree&) = delete;
  suffix_tree& operator=(const suffix_tree&) = delete;
  suffix_tree(suffix_tree&&) noexcept;
  suffix_tree& operator=(suffix_tree&&) noexcept;
  ~suffix_tree();

  std::int32_t max_depth() const noexcept { return max_depth_; }

  /// Starts sequence `id` with no tokens. With `after` = another live sequence, the new one
  /// continues that sequence's text (its suffixes that span the boundary are indexed, as for
  /// a group sibling's response after the shared prompt): the first continuation extends it,
  /// each later one counts the base's last max_depth - 1 start positions once more
  /// (O(max_depth^2)). Neither can be removed later.
  /// Throws std::invalid_argument for an id already present or an unknown `after`.
  void begin_sequence(seq_id id, const seq_id* after = nullptr);
  /// Appends one token to a started sequence: O(max_depth). Tokens must be >= 0. Throws
  /// std::invalid_argument for an unknown id or a negative token.
  void append(seq_id id, std::int32_t token);
  /// begin_sequence(id) and append of each token.
  void add_sequence(seq_id id, const std::int32_t* tokens, std::size_t n);
  /// Removes a sequence's occurrences: counts fall, nodes reaching 0 are freed, and every
  /// node whose most frequent child changed recomputes it. O(tokens x max_depth). Bumps
  /// removal_epoch() when a node was freed (node ids held by matchers may then be stale).
  /// Throws std::invalid_argument for an unknown id, std::logic_error for a sequence begun
  /// after another or one that another sequence was begun after.
  void remove_sequence(seq_id id);
  /// Forgets a sequence's bookkeeping (tokens, state) but keeps its occurrences indexed:
  /// for trees dropped whole later (group trees).
  void close_sequence(seq_id id);
  bool contains(seq_id id) const { return seqs_.count(id) != 0; }
  std::size_t sequences() const noexcept { return seqs_.size(); }
  /// Tokens appended to a sequence. Throws std::invalid_argument for an unknown id.
  std::size_t sequence_length(seq_id id) const;

  /// The deepest node matching a suffix of the sequence's own text (the sequence is in the
  /// tree, so this is its last min(length, max_depth - 1) tokens). Throws
  /// std::invalid_argument for an unknown id.
  node_id tail(seq_id id) const;

  /// The incremental matcher's step: from `cursor` (the deepest node matching a suffix of
  /// some context; root for an empty one) to the deepest node matching a suffix of context +
  /// token. Amortised O(1) over a context.
  node_id advance(node_id cursor, std::int32_t token) const;
  /// The node of `tokens` (walked from the root), or no_node when it does not occur.
  node_id find(const std::int32_t* tokens, std::size_t n) const;

  /// The best draft over every matched suffix of length >= 1 of `cursor`'s string (cursor,
  /// link(cursor), ..., down to depth 1), by the rule in the file comment. `out` is
  /// overwritten; an empty draft (score 0, match_len 0) when nothing matches.
  void best_draft(node_id cursor, const draft_params& p, draft& out) const;

  std::int32_t depth(node_id v) const { return nodes_[static_cast<std::size_t>(v)].depth; }
  std::int64_t count(node_id v) const { return nodes_[static_cast<std::size_t>(v)].count; }
  node_id link(node_id v) const { return nodes_[static_cast<std::size_t>(v)].link; }
  /// The child with the highest count (the first to reach it among equals), or no_node.
  node_id head_child(node_id v) const { return nodes_[static_cast<std::size_t>(v)].head; }
  std::int32_t token(node_id v) const { return nodes_[static_cast<std::size_t>(v)].token; }
  /// The child of v along `token`, or no_node.
  node_id child(node_id v, std::int32_t token) const;

  /// Live nodes, the root included.
  std::size_t nodes() const noexcept { return live_nodes_; }
  /// Bytes the live index needs: live nodes (the root aside), their edges at the table's load bound (two
  /// slots each) and the sequences' tokens. Freed nodes are reused before the arena grows, so
  /// the allocation follows the peak of this figure (within the 2x of vector growth).
  std::size_t live_bytes() const noexcept;
  /// Increases whenever remove_sequence frees a node.
  std::uint64_t removal_epoch() const noexcept { return removal_epoch_; }

 private:
  struct node {
    std::int32_t token = -1;
    std::int32_t depth = 0;
    node_id parent = no_node;
    node_id link = no_node;
    node_id head = no_node;         // most frequent child
    node_id first_child = no_node;  // children as a singly linked list, for head recomputation
    node_id next_sibling = no_node;
    std::int32_t count = 0;
  };
  struct sequence {
    std::vector<std::int32_t> tokens;
    node_id tail = root;       // deepest active node, depth <= max_depth - 1
    bool removable = true;     // begun at the root and nobody begun after it
    bool continued = false;    // a sequence was begun after it
  };
  class edge_table;

  node_id new_node(node_id parent, std::int32_t token);
  void free_node(node_id v);
  void bump(node_id parent, node_id child);
  void recompute_head(node_id v);
  sequence& seq(seq_id id);
  const sequence& seq(seq_id id) const;

  std::int32_t max_depth_;
  std::vector<node> nodes_;
  std::vector<node_id> free_;
  std::size_t live_nodes_ = 0;
  std::unique_ptr<edge_table> edges_;
  std::unordered_map<seq_id, sequence> seqs_;
  std::vector<node_id> chain_;  // scratch of append
  std::size_t seq_tokens_ = 0;  // tokens held by seqs_, for live_bytes
  std::uint64_t removal_epoch_ = 0;
};

}  // namespace sorl::suffix_index
