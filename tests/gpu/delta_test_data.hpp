#pragma once

// Synthetic bf16 weight deltas for the GPU codec tests: a base tensor of random bit patterns
// and a next tensor in which a given fraction of elements moved, mostly by ±1 ULP.

#include <cstdint>
#include <random>
#include <vector>

namespace sorl::gpu::test {

/// How changed elements move.
enum class step_mix {
  ulp,    ///< 96 % ±1 (slightly more +1), 4 % uniform nonzero patterns
  minus,  ///< 90 % −1, 6 % +1, 4 % uniform nonzero
  random, ///< uniform nonzero steps (drives segments to dense)
};

struct tensor_pair {
  std::vector<uint16_t> base, next;
};

/// `n` elements, each changed with probability `fraction` (1 changes all).
inline tensor_pair make_delta(uint64_t n, double fraction, step_mix mix, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  tensor_pair t;
  t.base.resize(n);
  t.next.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    t.base[i] = static_cast<uint16_t>(rng());
    uint16_t s = 0;
    if (fraction >= 1.0 || (fraction > 0.0 && u(rng) < fraction)) {
      const double r = u(rng);
      switch (mix) {
      case step_mix::ulp:
        s = r < 0.50 ? 1 : r < 0.96 ? 0xFFFF : 0;
        break;
      case step_mix::minus:
        s = r < 0.90 ? 0xFFFF : r < 0.96 ? 1 : 0;
        break;
      case step_mix::random:
        s = 0;
        break;
      }
      while (s == 0)
        s = static_cast<uint16_t>(rng());
    }
    t.next[i] = static_cast<uint16_t>(t.base[i] + s);
  }
  return t;
}

} // namespace sorl::gpu::test
