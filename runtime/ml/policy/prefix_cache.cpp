#include "runtime/ml/policy/prefix_cache.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace sorl::ml {

struct prefix_cache::node {
  std::vector<std::int32_t> key;  // block_size tokens (empty at the root)
  std::uint64_t hash = 0;         // of key, the parent's index into children
  std::int32_t block = -1;        // the kv_cache block holding key's KV (-1 at the root)
  std::uint64_t version = 0;      // weights the KV was computed under
  std::uint64_t last_use = 0;     // tick of the last match or insert through it
  node* parent = nullptr;
  std::unordered_map<std::uint64_t, std::unique_ptr<node>> children;
};

namespace {

std::uint64_t block_hash(const std::int32_t* key, std::int64_t n) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull;
  for (std::int64_t i = 0; i < n; ++i) {
    h = (h ^ static_cast<std::uint32_t>(key[i])) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

}  // namespace

prefix_cache::prefix_cache(kv_cache& cache, std::int64_t max_tokens, std::uint64_t version)
    : cache_(cache), block_size_(cache.block_size()), version_(version), root_(std::make_unique<node>()) {
  if (max_tokens < 0)
    throw std::invalid_argument(fmt::format("prefix_cache: max_tokens must be >= 0, got {}", max_tokens));
  max_blocks_ = max_tokens / block_size_;
}

prefix_cache::~prefix_cache() {
  std::int64_t dropped = 0;
  drop_all(dropped);
}

prefix_cache::node* prefix_cache::child(node& parent, const std::int32_t* key) const {
  const auto it = parent.children.find(block_hash(key, block_size_));
  if (it == parent.children.end()) return nullptr;
  node* c = it->second.get();
  return std::equal(c->key.begin(), c->key.end(), key) ? c : nullptr;
}

void prefix_cache::touch(node& n) {
  const bool leaf = n.children.empty();
  if (leaf) leaves_.erase({n.last_use, &n});
  n.last_use = ++tick_;
  if (leaf) leaves_.insert({n.last_use, &n});
}

std::int64_t prefix_cache::match(const std::vector<std::int32_t>& tokens, std::int64_t limit,
                                 std::vector<std::int32_t>& out) {
  if (limit < 0 || limit > static_cast<std::int64_t>(tokens.size()))
    throw std::invalid_argument(
        fmt::format("prefix_cache::match: limit {} outside [0, {}]", limit, tokens.size()));
  out.clear();
  ++stats_.lookups;
  stats_.lookup_tokens += limit;
  std::vector<node*> path;
  node* at = root_.get();
  std::int64_t m = 0;
  while (m + block_size_ <= limit) {
    node* c = child(*at, tokens.data() + m);
    if (c == nullptr || c->version != version_) break;
    out.push_back(c->block);
    path.push_back(c);
    at = c;
    m += block_size_;
  }
  for (node* n : path) touch(*n);
  stats_.hit_tokens += m;
  return m;
}

void prefix_cache::insert(const std::vector<std::int32_t>& tokens, std::int64_t n, seq_id s) {
  const std::vector<std::int32_t>& blocks = cache_.blocks(s);
  const std::int64_t have = std::min<std::int64_t>(static_cast<std::int64_t>(tokens.size()), cache_.length(s));
  if (n < 0 || n > have)
    throw std::invalid_argument(fmt::format(
        "prefix_cache::insert: {} tokens; sequence {} holds {} of the {} given", n, s, cache_.length(s),
        tokens.size()));
  std::vector<node*> path;
  node* at = root_.get();
  for (std::int64_t b = 0; (b + 1) * block_size_ <= n; ++b) {
    const std::int32_t* key = tokens.data() + b * block_size_;
    const std::uint64_t h = block_hash(key, block_size_);
    const auto it = at->children.find(h);
    if (it != at->children.end()) {
      node* c = it->second.get();
      // A colliding key cannot be stored under this parent; an entry of another version is
      // dropped by set_version before anything of the current one arrives.
      if (!std::equal(c->key.begin(), c->key.end(), key) || c->version != version_) break;
      path.push_back(c);
      at = c;
      continue;
    }
    if (max_blocks_ == 0) break;
    auto fresh = std::make_unique<node>();
    fresh->key.assign(key, key + block_size_);
    fresh->hash = h;
    fresh->block = blocks[static_cast<std::size_t>(b)];
    fresh->version = version_;
    fresh->parent = at;
    cache_.retain(fresh->block);
    if (at != root_.get() && at->children.empty()) leaves_.erase({at->last_use, at});
    node* c = fresh.get();
    at->children.emplace(h, std::move(fresh));
    c->last_use = ++tick_;
    leaves_.insert({c->last_use, c});
    ++blocks_;
    ++stats_.inserted_blocks;
    path.push_back(c);
    at = c;
  }
  for (node* p : path) touch(*p);
  evict_to(max_blocks_);
}

void prefix_cache::remove_leaf(node* n) {
  leaves_.erase({n->last_use, n});
  cache_.drop(n->block);
  node* p = n->parent;
  p->children.erase(n->hash);  // destroys n
  --blocks_;
  if (p != root_.get() && p->children.empty()) leaves_.insert({p->last_use, p});
}

void prefix_cache::evict_to(std::int64_t max_blocks) {
  while (blocks_ > max_blocks) {
    remove_leaf(leaves_.begin()->second);
    ++stats_.evicted_blocks;
  }
}

void prefix_cache::drop_all(std::int64_t& counter) {
  while (!leaves_.empty()) {
    remove_leaf(leaves_.begin()->second);
    ++counter;
  }
}

void prefix_cache::set_version(std::uint64_t version) {
  if (version == version_) return;
  drop_all(stats_.invalidated_blocks);
  version_ = version;
}

void prefix_cache::clear() { drop_all(stats_.invalidated_blocks); }

bool prefix_cache::consistent() const {
  std::int64_t count = 0, leaves = 0;
  std::vector<const node*> todo{root_.get()};
  while (!todo.empty()) {
    const node* n = todo.back();
    todo.pop_back();
    for (const auto& [h, c] : n->children) {
      if (c->parent != n || c->hash != h || static_cast<std::int64_t>(c->key.size()) != block_size_ ||
          block_hash(c->key.data(), block_size_) != h || c->version != version_ || cache_.refcount(c->block) < 1)
        return false;
      ++count;
      if (c->children.empty()) {
        if (leaves_.count({c->last_use, const_cast<node*>(c.get())}) == 0) return false;
        ++leaves;
      }
      todo.push_back(c.get());
    }
  }
  return count == blocks_ && leaves == static_cast<std::int64_t>(leaves_.size());
}

prefix_cache_stats prefix_cache::take_stats() noexcept {
  const prefix_cache_stats out = stats_;
  stats_ = prefix_cache_stats{};
  return out;
}

}  // namespace sorl::ml
