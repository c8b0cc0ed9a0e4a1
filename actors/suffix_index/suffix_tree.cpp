#include "actors/suffix_index/suffix_tree.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace sorl::suffix_index {

// Open addressing with linear probing and backward-shift deletion (no tombstones, so lookups
// stay short however many children come and go). Key: parent node in the high 32 bits, token
// in the low 32.
class suffix_tree::edge_table {
  struct slot {
    std::uint64_t key;
    node_id value;
  };

 public:
  static constexpr std::size_t slot_bytes = sizeof(slot);

  edge_table() : slots_(16, slot{empty, no_node}), mask_(15) {}

  node_id find(std::uint64_t key) const {
    for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == empty) return no_node;
    }
  }
  void insert(std::uint64_t key, node_id value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(key, value);
    ++size_;
  }
  void erase(std::uint64_t key) {
    std::size_t i = hash(key) & mask_;
    while (slots_[i].key != key) {
      if (slots_[i].key == empty) return;
      i = (i + 1) & mask_;
    }
    for (std::size_t j = i;;) {
      j = (j + 1) & mask_;
      if (slots_[j].key == empty) break;
      const std::size_t home = hash(slots_[j].key) & mask_;
      // Slot j may move back to i only when its home is not cyclically in (i, j].
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i] = slot{empty, no_node};
    --size_;
  }

  static std::uint64_t key(node_id parent, std::int32_t token) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(parent)) << 32) |
           static_cast<std::uint32_t>(token);
  }

 private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};
  static std::uint64_t hash(std::uint64_t k) noexcept {  // murmur3's finaliser
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
  }
  void place(std::uint64_t key, node_id value) {
    std::size_t i = hash(key) & mask_;
    while (slots_[i].key != empty) i = (i + 1) & mask_;
    slots_[i] = slot{key, value};
  }
  void grow() {
    std::vector<slot> old(slots_.size() * 2, slot{empty, no_node});
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const slot& s : old)
      if (s.key != empty) place(s.key, s.value);
  }

  std::vector<slot> slots_;
  std::size_t mask_;
  std::size_t size_ = 0;
};

suffix_tree::suffix_tree(std::int32_t max_depth) : max_depth_(max_depth), edges_(new edge_table) {
  if (max_depth < 1 || max_depth > 4096)
    throw std::invalid_argument(fmt::format("suffix_tree: max_depth {} outside [1, 4096]", max_depth));
  nodes_.push_back(node{});  // the root: the empty string, which occurs everywhere
  live_nodes_ = 1;
}

suffix_tree::suffix_tree(suffix_tree&&) noexcept = default;
suffix_tree& suffix_tree::operator=(suffix_tree&&) noexcept = default;
suffix_tree::~suffix_tree() = default;

suffix_tree::sequence& suffix_tree::seq(seq_id id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) throw std::invalid_argument(fmt::format("suffix_tree: unknown sequence {}", id));
  return it->second;
}
const suffix_tree::sequence& suffix_tree::seq(seq_id id) const {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) throw std::invalid_argument(fmt::format("suffix_tree: unknown sequence {}", id));
  return it->second;
}

void suffix_tree::begin_sequence(seq_id id, const seq_id* after) {
  if (seqs_.count(id) != 0)
    throw std::invalid_argument(fmt::format("suffix_tree: sequence {} already present", id));
  sequence s;
  if (after != nullptr) {
    sequence& base = seq(*after);
    s.tail = base.tail;
    s.removable = false;
    base.removable = false;
    // The first continuation extends the base's own occurrences. Each later one is another
    // copy of the base's last max_depth - 1 tokens (the start positions its suffixes can
    // span from), so every prefix of those positions' suffixes occurs once more: without
    // this, G siblings extending the same suffix would count G occurrences under a parent
    // counted once, and path probabilities would exceed 1.
    if (base.continued) {
      for (node_id v = base.tail; v != root && v != no_node; v = nodes_[static_cast<std::size_t>(v)].link)
        for (node_id u = v; u != root;) {
          const node_id parent = nodes_[static_cast<std::size_t>(u)].parent;
          bump(parent, u);
          u = parent;
        }
    }
    base.continued = true;
  }
  seqs_.emplace(id, std::move(s));
}

std::size_t suffix_tree::sequence_length(seq_id id) const { return seq(id).tokens.size(); }
node_id suffix_tree::tail(seq_id id) const { return seq(id).tail; }

node_id suffix_tree::child(node_id v, std::int32_t token) const {
  return edges_->find(edge_table::key(v, token));
}

node_id suffix_tree::new_node(node_id parent, std::int32_t token) {
  node_id v;
  if (!free_.empty()) {
    v = free_.back();
    free_.pop_back();
  } else {
    v = static_cast<node_id>(nodes_.size());
    nodes_.emplace_back();
  }
  node& n = nodes_[static_cast<std::size_t>(v)];
  node& p = nodes_[static_cast<std::size_t>(parent)];
  n = node{};
  n.token = token;
  n.depth = p.depth + 1;
  n.parent = parent;
  n.next_sibling = p.first_child;
  p.first_child = v;
  edges_->insert(edge_table::key(parent, token), v);
  ++live_nodes_;
  return v;
}

void suffix_tree::free_node(node_id v) {
  node& n = nodes_[static_cast<std::size_t>(v)];
  node& p = nodes_[static_cast<std::size_t>(n.parent)];
  edges_->erase(edge_table::key(n.parent, n.token));
  if (p.first_child == v) {
    p.first_child = n.next_sibling;
  } else {
    node_id c = p.first_child;
    while (nodes_[static_cast<std::size_t>(c)].next_sibling != v) c = nodes_[static_cast<std::size_t>(c)].next_sibling;
    nodes_[static_cast<std::size_t>(c)].next_sibling = n.next_sibling;
  }
  n = node{};
  free_.push_back(v);
  --live_nodes_;
}

void suffix_tree::bump(node_id parent, node_id c) {
  const std::int32_t k = ++nodes_[static_cast<std::size_t>(c)].count;
  node& p = nodes_[static_cast<std::size_t>(parent)];
  // Ties go to the child that reached the count last (recency), except that a new child (count
  // 1) never displaces an older one.
  if (p.head == no_node || p.head == c) {
    p.head = c;
    return;
  }
  const std::int32_t best = nodes_[static_cast<std::size_t>(p.head)].count;
  if (k > best || (k == best && k > 1)) p.head = c;
}

void suffix_tree::recompute_head(node_id v) {
  node_id best = no_node;
  std::int32_t most = 0;
  for (node_id c = nodes_[static_cast<std::size_t>(v)].first_child; c != no_node;
       c = nodes_[static_cast<std::size_t>(c)].next_sibling) {
    const std::int32_t k = nodes_[static_cast<std::size_t>(c)].count;
    if (best == no_node || k > most) {
      best = c;
      most = k;
    }
  }
  nodes_[static_cast<std::size_t>(v)].head = best;
}

void suffix_tree::append(seq_id id, std::int32_t token) {
  if (token < 0) throw std::invalid_argument(fmt::format("suffix_tree: negative token {}", token));
  sequence& s = seq(id);
  // The active suffixes are the tail and its links; extend them shortest first, so that the
  // child of link(v) exists when the child of v needs it as its link.
  chain_.clear();
  for (node_id v = s.tail; v != no_node; v = nodes_[static_cast<std::size_t>(v)].link) chain_.push_back(v);
  node_id shorter = no_node;
  for (std::size_t i = chain_.size(); i-- > 0;) {
    const node_id v = chain_[i];
    node_id c = child(v, token);
    if (c == no_node) {
      c = new_node(v, token);
      nodes_[static_cast<std::size_t>(c)].link = v == root ? root : shorter;
    }
    bump(v, c);
    shorter = c;
  }
  s.tail = nodes_[static_cast<std::size_t>(shorter)].depth >= max_depth_
               ? nodes_[static_cast<std::size_t>(shorter)].link
               : shorter;
  s.tokens.push_back(token);
  ++seq_tokens_;
}

void suffix_tree::add_sequence(seq_id id, const std::int32_t* tokens, std::size_t n) {
  begin_sequence(id);
  for (std::size_t i = 0; i < n; ++i) append(id, tokens[i]);
}

void suffix_tree::close_sequence(seq_id id) {
  seq_tokens_ -= seq(id).tokens.size();
  seqs_.erase(id);
}

void suffix_tree::remove_sequence(seq_id id) {
  const sequence& s = seq(id);
  if (!s.removable)
    throw std::logic_error(fmt::format(
        "suffix_tree: sequence {} shares text with another sequence and cannot be removed alone", id));
  const std::vector<std::int32_t>& t = s.tokens;
  const std::size_t n = t.size();
  std::vector<node_id> path;
  bool freed = false;
  for (std::size_t i = 0; i < n; ++i) {
    path.clear();
    node_id v = root;
    const std::size_t end = std::min(n, i + static_cast<std::size_t>(max_depth_));
    for (std::size_t j = i; j < end; ++j) {
      const node_id c = child(v, t[j]);
      if (c == no_node) throw std::logic_error("suffix_tree: index corrupt (an occurrence has no node)");
      --nodes_[static_cast<std::size_t>(c)].count;
      path.push_back(c);
      v = c;
    }
    // Deepest first: a node reaching 0 has no children left by then (theirs are <= its count).
    for (std::size_t k = path.size(); k-- > 0;) {
      const node_id c = path[k];
      const node_id parent = nodes_[static_cast<std::size_t>(c)].parent;
      const bool was_head = nodes_[static_cast<std::size_t>(parent)].head == c;
      if (nodes_[static_cast<std::size_t>(c)].count == 0) {
        free_node(c);
        freed = true;
      }
      if (was_head) recompute_head(parent);
    }
  }
  seq_tokens_ -= n;
  seqs_.erase(id);
  if (freed) ++removal_epoch_;
}

node_id suffix_tree::advance(node_id cursor, std::int32_t token) const {
  node_id v = cursor;
  if (nodes_[static_cast<std::size_t>(v)].depth >= max_depth_) v = nodes_[static_cast<std::size_t>(v)].link;
  for (;;) {
    const node_id c = child(v, token);
    if (c != no_node) return c;
    if (v == root) return root;
    v = nodes_[static_cast<std::size_t>(v)].link;
  }
}

node_id suffix_tree::find(const std::int32_t* tokens, std::size_t n) const {
  node_id v = root;
  for (std::size_t i = 0; i < n && v != no_node; ++i) v = child(v, tokens[i]);
  return v;
}

void suffix_tree::best_draft(node_id cursor, const draft_params& p, draft& out) const {
  out.tokens.clear();
  out.score = 0.0;
  out.match_len = 0;
  std::int32_t cand[64];
  std::vector<std::int32_t> big;  // drafts longer than 64 tokens (unusual settings)
  for (node_id v = cursor; v != no_node && nodes_[static_cast<std::size_t>(v)].depth >= 1;
       v = nodes_[static_cast<std::size_t>(v)].link) {
    const std::int32_t m = nodes_[static_cast<std::size_t>(v)].depth;
    const double allowed = std::floor(m * p.spec_factor + p.spec_offset + 1e-6);
    const auto cap = static_cast<std::int32_t>(std::clamp(allowed, 0.0, static_cast<double>(p.max_tokens)));
    // Caps only shrink with the match length, and a shorter match must score strictly more.
    if (cap <= out.score) break;
    std::int32_t* buf = cand;
    if (cap > 64) {
      big.resize(static_cast<std::size_t>(cap));
      buf = big.data();
    }
    std::int32_t len = 0;
    double prob = 1.0, score = 0.0;
    for (node_id u = v; len < cap;) {
      const node& un = nodes_[static_cast<std::size_t>(u)];
      if (un.head == no_node) break;
      const node& h = nodes_[static_cast<std::size_t>(un.head)];
      prob *= static_cast<double>(h.count) / static_cast<double>(un.count);
      if (prob < p.min_token_prob) break;
      buf[len++] = h.token;
      score += prob;
      u = un.head;
    }
    if (score > out.score) {
      out.tokens.assign(buf, buf + len);
      out.score = score;
      out.match_len = m;
    }
  }
}

std::size_t suffix_tree::live_bytes() const noexcept {
  // O(1): the drafter checks it after every finished response.
  return (live_nodes_ - 1) * (sizeof(node) + 2 * edge_table::slot_bytes) + seq_tokens_ * sizeof(std::int32_t) +
         seqs_.size() * sizeof(sequence);
}

}  // namespace sorl::suffix_index
