#include "actors/suffix_index/suffix_drafter.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace sorl::suffix_index {

namespace {
// Sequence ids inside a group tree: the prompt, then sample i as i + 1.
constexpr suffix_tree::seq_id prompt_seq = 0;
}  // namespace

suffix_drafter::suffix_drafter(drafter_options opts) : opts_(opts) {
  const draft_params& d = opts.draft;
  if (opts.max_depth < 1 || opts.max_depth > 4096)
    throw std::invalid_argument(fmt::format("suffix_drafter: max_depth {} outside [1, 4096]", opts.max_depth));
  if (d.max_tokens < 0)
    throw std::invalid_argument(fmt::format("suffix_drafter: draft max_tokens {} < 0", d.max_tokens));
  if (!std::isfinite(d.spec_factor) || d.spec_factor < 0 || !std::isfinite(d.spec_offset) ||
      !std::isfinite(d.min_token_prob))
    throw std::invalid_argument(fmt::format(
        "suffix_drafter: spec_factor {} must be finite and >= 0; spec_offset {} and min_token_prob {} finite",
        d.spec_factor, d.spec_offset, d.min_token_prob));
  if (opts.global_bytes > 0) global_ = std::make_unique<suffix_tree>(opts.max_depth);
}

suffix_drafter::~suffix_drafter() = default;

suffix_drafter::sample_state& suffix_drafter::find(std::uint64_t group, std::int64_t sample, group_state** g) {
  const auto it = samples_.find({group, sample});
  if (it == samples_.end())
    throw std::invalid_argument(fmt::format("suffix_drafter: sample {} of group {} not started", sample, group));
  if (g != nullptr) *g = groups_.at(group).get();
  return it->second;
}

void suffix_drafter::advance_global(sample_state& s, std::int32_t token) {
  const auto depth = static_cast<std::size_t>(opts_.max_depth);
  if (s.recent.size() == depth) s.recent.erase(s.recent.begin());
  s.recent.push_back(token);
  if (!global_) return;
  if (!rematch_if_stale(s)) s.cursor = global_->advance(s.cursor, token);
}

bool suffix_drafter::rematch_if_stale(sample_state& s) {
  if (s.epoch == global_epoch()) return false;
  // An eviction may have freed the cursor's node, or an added response allows a deeper
  // match: match the recent tokens afresh.
  s.cursor = suffix_tree::root;
  for (const std::int32_t t : s.recent) s.cursor = global_->advance(s.cursor, t);
  s.epoch = global_epoch();
  return true;
}

void suffix_drafter::start(std::uint64_t group, std::int64_t sample, const std::int32_t* prompt, std::size_t n) {
  if (samples_.count({group, sample}) != 0)
    throw std::invalid_argument(fmt::format("suffix_drafter: sample {} of group {} already started", sample, group));
  for (std::size_t i = 0; i < n; ++i)
    if (prompt[i] < 0) throw std::invalid_argument(fmt::format("suffix_drafter: negative prompt token {}", prompt[i]));
  auto& slot = groups_[group];
  if (!slot) {
    slot = std::make_unique<group_state>(opts_.max_depth);
    slot->prompt_len = n;
    if (opts_.group_trees) slot->tree.add_sequence(prompt_seq, prompt, n);
  } else if (slot->prompt_len != n) {
    throw std::invalid_argument(fmt::format(
        "suffix_drafter: sample {} of group {} starts after {} prompt tokens, the group's prompt has {}", sample,
        group, n, slot->prompt_len));
  }
  if (opts_.group_trees) {
    const suffix_tree::seq_id base = prompt_seq;
    slot->tree.begin_sequence(sample + 1, &base);
  }
  ++slot->open;
  sample_state st;
  if (global_) {
    st.global_seq = next_global_++;
    global_->begin_sequence(st.global_seq);
  }
  st.epoch = global_ ? global_epoch() : 0;
  const std::size_t from = n > static_cast<std::size_t>(opts_.max_depth) ? n - static_cast<std::size_t>(opts_.max_depth) : 0;
  for (std::size_t i = from; i < n; ++i) advance_global(st, prompt[i]);
  samples_.emplace(std::make_pair(group, sample), std::move(st));
}

void suffix_drafter::extend(std::uint64_t group, std::int64_t sample, const std::int32_t* tokens, std::size_t n) {
  group_state* g = nullptr;
  sample_state& s = find(group, sample, &g);
  for (std::size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) throw std::invalid_argument(fmt::format("suffix_drafter: negative token {}", tokens[i]));
    if (opts_.group_trees) g->tree.append(sample + 1, tokens[i]);
    if (global_) global_->append(s.global_seq, tokens[i]);
    advance_global(s, tokens[i]);
  }
}

const draft& suffix_drafter::propose(std::uint64_t group, std::int64_t sample, std::int32_t max_tokens) {
  group_state* g = nullptr;
  sample_state& s = find(group, sample, &g);
  draft_params p = opts_.draft;
  p.max_tokens = std::max(0, std::min(max_tokens, p.max_tokens));
  ++stats_.calls;
  group_draft_.tokens.clear();
  group_draft_.score = 0;
  group_draft_.match_len = 0;
  if (opts_.group_trees) g->tree.best_draft(g->tree.tail(sample + 1), p, group_draft_);
  const draft* best = &group_draft_;
  if (global_) {
    rematch_if_stale(s);
    global_->best_draft(s.cursor, p, global_draft_);
    if (global_draft_.score > group_draft_.score) {
      best = &global_draft_;
      ++stats_.from_global;
    }
  }
  stats_.drafted_tokens += static_cast<std::int64_t>(best->tokens.size());
  return *best;
}

void suffix_drafter::finish(std::uint64_t group, std::int64_t sample, bool keep) {
  const auto it = samples_.find({group, sample});
  if (it == samples_.end()) return;
  if (global_) {
    if (keep && global_->sequence_length(it->second.global_seq) > 0) {
      fifo_.push_back(it->second.global_seq);
      evict();
    } else {
      global_->remove_sequence(it->second.global_seq);
    }
  }
  samples_.erase(it);
  auto& g = groups_.at(group);
  if (opts_.group_trees) g->tree.close_sequence(sample + 1);
  if (--g->open == 0) groups_.erase(group);
}

void suffix_drafter::add_response(const std::int32_t* tokens, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (tokens[i] < 0) throw std::invalid_argument(fmt::format("suffix_drafter: negative response token {}", tokens[i]));
  if (!global_ || n == 0) return;
  // A fresh sequence begun at the root, like a sample's response: removable on eviction.
  const suffix_tree::seq_id id = next_global_++;
  global_->add_sequence(id, tokens, n);
  fifo_.push_back(id);
  // Running samples' cursors still point at live nodes, but may now match shallower than the
  // tree allows (the new text was not there when they advanced): have them re-match, so a
  // response drafts from its next call on, not max_depth tokens later.
  ++added_;
  ++stats_.added_responses;
  evict();
}

void suffix_drafter::evict() {
  while (!fifo_.empty() && global_->live_bytes() > opts_.global_bytes) {
    global_->remove_sequence(fifo_.front());
    fifo_.pop_front();
    ++stats_.evicted_responses;
  }
}

void suffix_drafter::clear() {
  groups_.clear();
  samples_.clear();
  fifo_.clear();
  if (global_) global_ = std::make_unique<suffix_tree>(opts_.max_depth);
}

drafter_stats suffix_drafter::take_stats() {
  drafter_stats out = stats_;
  out.global_responses = static_cast<std::int64_t>(fifo_.size());
  out.global_bytes = global_ ? global_->live_bytes() : 0;
  stats_ = drafter_stats{};
  return out;
}

}  // namespace sorl::suffix_index
