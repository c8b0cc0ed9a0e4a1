#include "actors/scheduler/prefix_index.hpp"

#include <stdexcept>
#include <string>

namespace sorl::scheduler {

std::vector<uint64_t> block_chain(const std::vector<int32_t>& tokens, int64_t block_size) {
  if (block_size < 1)
    throw std::invalid_argument("block_chain: block_size must be >= 1, got "
                                + std::to_string(block_size));
  std::vector<uint64_t> chain;
  const auto blocks = static_cast<int64_t>(tokens.size()) / block_size;
  chain.reserve(static_cast<size_t>(blocks));
  uint64_t h = 0x243F6A8885A308D3ull;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t i = b * block_size; i < (b + 1) * block_size; ++i) {
      h = (h ^ static_cast<uint32_t>(tokens[static_cast<size_t>(i)])) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    // A block boundary is mixed in, so [a b | c] and [a | b c] never share a chain.
    h = (h ^ 0x94D049BB133111EBull) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    chain.push_back(h);
  }
  return chain;
}

prefix_index::prefix_index(int64_t capacity) : capacity_(capacity) {
  if (capacity < 0)
    throw std::invalid_argument("prefix_index: capacity must be >= 0, got "
                                + std::to_string(capacity));
}

int64_t prefix_index::match(const std::vector<uint64_t>& chain) const {
  int64_t n = 0;
  for (uint64_t h : chain) {
    if (where_.count(h) == 0)
      break;
    ++n;
  }
  return n;
}

void prefix_index::insert(const std::vector<uint64_t>& chain) {
  if (capacity_ == 0)
    return;
  // Deepest first, so the path's first block ends up most recent and is evicted last.
  for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
    const uint64_t h = *c;
    if (auto it = where_.find(h); it != where_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    lru_.push_front(h);
    where_.emplace(h, lru_.begin());
  }
  while (static_cast<int64_t>(where_.size()) > capacity_) {
    where_.erase(lru_.back());
    lru_.pop_back();
  }
}

void prefix_index::clear() {
  lru_.clear();
  where_.clear();
}

} // namespace sorl::scheduler
