#pragma once

// Internal to the task sources: a portable random stream and hashing. The standard
// <random> distributions differ between standard libraries, and task prompts must be
// the same on every machine of a run, so the tasks use these instead.

#include "runtime/ml/tasks/tasks.hpp"

#include <cstdint>
#include <string_view>

namespace sorl::ml::detail {

/// The splitmix64 finaliser: a bijection on 64-bit values with good avalanche.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// splitmix64: a small, fast, portable generator; plenty for prompt sampling.
class split_mix {
public:
  explicit split_mix(std::uint64_t seed) noexcept : state_(seed) {}

  std::uint64_t next() noexcept {
    state_ += 0x9E3779B97F4A7C15ULL;
    return mix64(state_);
  }

  /// Uniform in [0, n) for n >= 1, unbiased (rejects the short top range).
  std::uint64_t below(std::uint64_t n) noexcept {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t x = next();
    while (x >= limit)
      x = next();
    return x % n;
  }

  /// Uniform in [lo, hi] for lo <= hi, hi - lo < 2^63.
  std::int64_t between(std::int64_t lo, std::int64_t hi) noexcept {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::int64_t>(below(span));
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

private:
  std::uint64_t state_;
};

/// A plausible wrong integer answer: `reference` moved by an offset of 1..10 in a random
/// direction. When that direction would leave int64 (a reference within 10 of either end, as
/// a JSONL answer may be) the offset goes the other way, so the result is always a
/// representable integer different from `reference`; otherwise the draw is unchanged.
inline std::int64_t wrong_integer_near(std::int64_t reference, split_mix& rng) noexcept {
  std::int64_t offset = rng.between(1, 10);
  if (rng.below(2) == 0)
    offset = -offset;
  std::int64_t out = 0;
  if (__builtin_add_overflow(reference, offset, &out))
    out = reference - offset;
  return out;
}

/// FNV-1a over bytes, then mixed: a portable content hash (std::hash isn't).
inline std::uint64_t hash_text(std::string_view text) noexcept {
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ULL;
  }
  return mix64(h);
}

/// The split a problem with content hash `h` belongs to: eval for a share
/// `eval_fraction` of hashes. A property of the problem, so the splits are disjoint.
inline task_split split_of(std::uint64_t h, double eval_fraction) noexcept {
  const double u = static_cast<double>(mix64(h ^ 0x5EED5EED5EED5EEDULL) >> 11) * 0x1.0p-53;
  return u < eval_fraction ? task_split::eval : task_split::train;
}

/// The seed of stream `index` of `split` under a task seed; a bijection of
/// (split, index) for index < 2^63, so splits never share a stream.
inline std::uint64_t stream_seed(std::uint64_t task_seed, task_split split,
                                 std::uint64_t index) noexcept {
  const std::uint64_t lane = (index << 1) | (split == task_split::eval ? 1U : 0U);
  return mix64(lane ^ mix64(task_seed));
}

} // namespace sorl::ml::detail
