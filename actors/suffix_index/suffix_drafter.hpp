#pragma once

// Drafts for suffix speculative decoding from two kinds of suffix tree (ARCHITECTURE.md §6
// WAR): one per group, holding the group's prompt and the running responses of its samples
// (siblings, and a sample's own earlier text, draft for each other), and one global tree of
// responses: every running response as it is generated (so concurrent rollouts of other
// groups draft from it too, and its statistics merge with earlier text) and the finished ones,
// its own and those other workers generated (add_response), until they are evicted, first in
// first out, past a byte bound. Prompts stay out of the global tree: they differ from rollout
// to rollout, and the group tree has them.
// Each call proposes the better-scoring of the group tree's and the global tree's drafts
// (suffix_tree.hpp; ties to the group tree), as the reference implementation does with its
// per-request and global trees.
//
// Every sample keeps its match state: in its group tree the tree's own tail of the sample's
// sequence, in the global tree a cursor advanced by each new token (re-derived from the last
// max_depth tokens when an eviction may have freed the node it points at, or a response
// added from another worker may allow a deeper match). A draft call is therefore O(draft
// tokens) plus the candidate match lengths it expands, whatever the context length. No CAF, no libtorch: the rollout worker drives it through the generator's
// draft hook (actors/rollout/worker_core.cpp).
//
// Exactness does not rest on this file: the generator's verification emits exactly the tokens
// plain sampling would (runtime/ml/policy/generate.hpp), so a draft only changes how many forward
// passes a sample takes.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "actors/suffix_index/suffix_tree.hpp"

namespace sorl::suffix_index {

/// Settings of a suffix_drafter.
struct drafter_options {
  std::int32_t max_depth = 32;         ///< longest indexed substring, tokens, [1, 4096]
  draft_params draft{};                ///< the draft rule (suffix_tree.hpp)
  /// Bound on the global tree's live_bytes(), bytes; the oldest responses are evicted past
  /// it. 0 = no global tree (group trees only).
  std::size_t global_bytes = std::size_t{64} << 20;
  bool group_trees = true;             ///< draft from the group's own tree
};

/// Counters since construction (or the last take_stats).
struct drafter_stats {
  std::int64_t calls = 0;              ///< propose() calls
  std::int64_t drafted_tokens = 0;     ///< tokens proposed
  std::int64_t from_global = 0;        ///< calls whose draft came from the global tree
  std::int64_t evicted_responses = 0;  ///< responses evicted from the global tree
  std::int64_t added_responses = 0;    ///< add_response() calls that inserted a response
  std::int64_t global_responses = 0;   ///< finished responses in the global tree now (not reset)
  std::size_t global_bytes = 0;        ///< the global tree's live_bytes() now (not reset)
};

/// Samples are named by (group, sample): any 64-bit group key (the generator's request id)
/// and a sample index within it. Called from one thread.
class suffix_drafter {
 public:
  /// Throws std::invalid_argument for max_depth outside [1, 4096], draft.max_tokens < 0,
  /// spec_factor < 0 or non-finite settings.
  explicit suffix_drafter(drafter_options opts = {});
  ~suffix_drafter();
  suffix_drafter(const suffix_drafter&) = delete;
  suffix_drafter& operator=(const suffix_drafter&) = delete;

  /// A sample starts decoding after `prompt` (n tokens >= 0, ids >= 0). The group's first
  /// sample inserts the prompt into the group tree; later ones must pass the same prompt
  /// (only its length is checked). The sample's response starts in the global tree.
  /// Throws std::invalid_argument for a sample already started or a negative token.
  void start(std::uint64_t group, std::int64_t sample, const std::int32_t* prompt, std::size_t n);
  /// Tokens the sample emitted, in order. Throws std::invalid_argument for an unknown sample.
  void extend(std::uint64_t group, std::int64_t sample, const std::int32_t* tokens, std::size_t n);
  /// The draft for the sample's next tokens, at most max_tokens (<= draft.max_tokens) long;
  /// valid until the next call on this drafter. Throws std::invalid_argument for an unknown
  /// sample.
  const draft& propose(std::uint64_t group, std::int64_t sample, std::int32_t max_tokens);
  /// The sample is done. With `keep`, its response stays in the global tree (a finished
  /// response, evicted oldest first past the byte bound, which this call enforces); without,
  /// it is removed (an aborted rollout's text). The group tree goes when its last started
  /// sample finishes. Unknown samples are ignored.
  void finish(std::uint64_t group, std::int64_t sample, bool keep);
  /// A finished response generated elsewhere (another worker's, through the suffix-index
  /// keeper): n tokens into the global tree as a finished response, evicted oldest first
  /// with the sample's own past the byte bound, which this call enforces. Running samples'
  /// matches stay valid. No-op without a global tree (global_bytes 0) or with n = 0.
  /// Throws std::invalid_argument for a negative token, before inserting anything.
  void add_response(const std::int32_t* tokens, std::size_t n);
  /// Drops every group tree and the global tree (the policy changed, say, and old text is
  /// no longer wanted). Samples in flight must be started again.
  void clear();

  /// Reads the counters and resets the per-call ones.
  drafter_stats take_stats();
  const drafter_options& options() const noexcept { return opts_; }
  /// Groups with a live tree.
  std::size_t groups() const noexcept { return groups_.size(); }
  const suffix_tree* global_tree() const noexcept { return global_.get(); }

 private:
  struct sample_state {
    std::vector<std::int32_t> recent;     // the last max_depth context tokens, for re-matching
    node_id cursor = suffix_tree::root;   // global tree match state
    std::uint64_t epoch = 0;              // global_epoch() the cursor is valid for
    suffix_tree::seq_id global_seq = -1;  // its response in the global tree, appended live
  };
  struct group_state {
    suffix_tree tree;
    std::size_t prompt_len = 0;
    std::int64_t open = 0;  // started, unfinished samples
    explicit group_state(std::int32_t depth) : tree(depth) {}
  };
  sample_state& find(std::uint64_t group, std::int64_t sample, group_state** g);
  void advance_global(sample_state& s, std::int32_t token);
  /// Re-derives a stale global cursor from the recent tokens; true when it did.
  bool rematch_if_stale(sample_state& s);
  void evict();
  // Changes whenever a cursor may be stale or too shallow: a node freed, or add_response.
  std::uint64_t global_epoch() const noexcept { return global_->removal_epoch() + added_; }

  drafter_options opts_;
  std::unordered_map<std::uint64_t, std::unique_ptr<group_state>> groups_;
  std::map<std::pair<std::uint64_t, std::int64_t>, sample_state> samples_;
  std::unique_ptr<suffix_tree> global_;
  std::deque<suffix_tree::seq_id> fifo_;
  suffix_tree::seq_id next_global_ = 0;
  std::uint64_t added_ = 0;  // add_response() insertions
  draft group_draft_, global_draft_;
  drafter_stats stats_;
};

}  // namespace sorl::suffix_index
