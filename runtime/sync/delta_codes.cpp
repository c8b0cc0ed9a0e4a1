// The sparse codes of the delta codec (runtime/sync/delta_codec.hpp): the encoder's exact cost
// and parameter choice, and the bit writer that emits Rice-coded gaps and step codes. The code
// definitions themselves are in runtime/sync/bit_codes.hpp, shared with gpu/.

#include "runtime/sync/delta_internal.hpp"

#include <algorithm>
#include <limits>

namespace sorl::sync {

using namespace detail;

namespace {

/// LSB-first bit writer into a buffer of exactly the final size.
class bit_writer {
public:
  explicit bit_writer(uint8_t* out) : out_(out) {}

  /// Appends the n ≤ 32 low bits of v.
  void put(uint64_t v, uint32_t n) {
    acc_ |= v << fill_;
    fill_ += n;
    if (fill_ >= 32) {
      store(out_, static_cast<uint32_t>(acc_));
      out_ += 4;
      acc_ >>= 32;
      fill_ -= 32;
    }
  }

  /// Appends n zero bits followed by a 1 bit.
  void unary(uint64_t n) {
    while (n >= 32) {
      put(0, 32);
      n -= 32;
    }
    put(uint64_t{1} << n, static_cast<uint32_t>(n) + 1);
  }

  /// Writes the last partial bytes.
  void finish() {
    while (fill_ > 0) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      fill_ = fill_ > 8 ? fill_ - 8 : 0;
    }
  }

private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  uint32_t fill_ = 0;
};

inline void write_step(bit_writer& w, uint16_t s, const delta_sparse_params& p) {
  const uint16_t first = first_step(p.minus_first);
  const uint16_t second = second_step(p.minus_first);
  if ((s == first) | (s == second)) {
    // ±1 steps are a coin flip: "0" or "1 0" without a branch.
    const uint32_t is_second = s == second;
    w.put(is_second, 1 + is_second);
  } else {
    w.put(3, 2);
    const exp_golomb_code c = exp_golomb_encode(escape_value(s), p.escape_k);
    w.unary(c.zeros);
    w.put(c.low, c.low_bits);
  }
}

/// From this many escaped steps on, plan_sparse prices the escape orders from a histogram
/// instead of 16 code lengths per escape (both exact).
constexpr uint64_t escape_histogram_from = 64;

/// esc_cost[k] = Σ over the escaped steps (neither +1 nor −1) of the bits of
/// ExpGolomb_k(zigzag(s) − 3), k = 0..delta_max_escape_k, from one histogram pass. With
/// x = zigzag(s) − 3 < 2^16, b = floor(log2 x) and c the number of one bits right below x's top
/// bit: floor(log2(x + 2^k)) is k for k > b, b + 1 for b − c ≤ k ≤ b (the carry of adding 2^k
/// reaches the top bit exactly then) and b for k < b − c; for x = 0 it is k. So the histogram
/// over (b, c) prices every k exactly.
void escape_costs(const uint16_t* steps, size_t changed, uint64_t* esc_cost) {
  constexpr uint32_t bins = 17; // b + 1 for x ≥ 1 (b ≤ 15), 0 for x = 0; c ≤ 15
  uint32_t hist[bins][bins] = {};
  for (size_t i = 0; i < changed; ++i) {
    const uint16_t st = steps[i];
    if ((st == step_plus) | (st == step_minus))
      continue;
    const uint32_t x = escape_value(st);
    if (x == 0) {
      ++hist[0][0];
      continue;
    }
    const uint32_t b = floor_log2_u64(x);
    // x's top bit moved to bit 31: the ones right below it become leading zeros of ~y.
    const uint32_t y = x << (31 - b);
    const auto c = static_cast<uint32_t>(__builtin_clz(~y)) - 1;
    ++hist[b + 1][c];
  }
  for (uint32_t i = 0; i < bins; ++i) {
    for (uint32_t c = 0; c < bins; ++c) {
      const uint64_t h = hist[i][c];
      if (h == 0)
        continue;
      for (uint32_t k = 0; k <= delta_max_escape_k; ++k) {
        uint32_t top; // floor(log2(x + 2^k))
        if (i == 0) {
          top = k;
        } else {
          const uint32_t b = i - 1;
          top = k > b ? k : (k + c >= b ? b + 1 : b);
        }
        esc_cost[k] += h * (2 * top - k + 1);
      }
    }
  }
}

} // namespace

namespace detail {

sparse_plan plan_sparse(const uint32_t* positions, const uint16_t* steps, size_t changed) {
  sparse_plan p;
  if (changed == 0)
    return p;
  // Σ g = p_last + 1 − changed (the gaps telescope), so the window needs no extra pass.
  const uint64_t sum = uint64_t{positions[changed - 1]} + 1 - changed;
  const uint64_t mean = std::max<uint64_t>(1, sum / changed);
  const auto k0 = static_cast<int32_t>(floor_log2_u64(mean));
  const int32_t k_lo = std::max(0, k0 - 2);
  const int32_t k_hi = std::min(static_cast<int32_t>(delta_max_rice_k), k0 + 1);
  const auto sh = static_cast<uint32_t>(k_lo);
  const uint32_t sh3 = std::min(sh + 3, 31u);
  // Gap costs: g_0 = p_0, g_i = p_i − p_{i−1} − 1 (< 2^32). Separate loops over plain arrays
  // so that GCC vectorises them.
  uint64_t c0 = positions[0] >> sh, c1 = positions[0] >> (sh + 1), c2 = positions[0] >> (sh + 2),
           c3 = positions[0] >> sh3;
  for (size_t i = 1; i < changed; ++i) {
    const uint32_t g = positions[i] - positions[i - 1] - 1;
    c0 += g >> sh;
    c1 += g >> (sh + 1);
    c2 += g >> (sh + 2);
    c3 += g >> sh3;
  }
  if (sh + 3 > 31)
    c3 = 0; // k_lo + 3 ≥ 32: every g < 2^32 shifts to 0
  uint64_t plus = 0, minus = 0;
  for (size_t i = 0; i < changed; ++i) {
    plus += steps[i] == step_plus;
    minus += steps[i] == step_minus;
  }
  const uint64_t escapes = changed - plus - minus;
  uint64_t esc_cost[delta_max_escape_k + 1] = {};
  if (escapes != 0 && escapes < escape_histogram_from) {
    for (size_t i = 0; i < changed; ++i) {
      const uint16_t st = steps[i];
      if ((st != step_plus) & (st != step_minus)) {
        const uint32_t x = escape_value(st);
        for (uint32_t k = 0; k <= delta_max_escape_k; ++k)
          esc_cost[k] += exp_golomb_bits(x, k);
      }
    }
  } else if (escapes != 0) {
    escape_costs(steps, changed, esc_cost);
  }
  const uint64_t cost[4] = {c0, c1, c2, c3};
  uint64_t best = std::numeric_limits<uint64_t>::max();
  for (int32_t k = k_lo; k <= k_hi; ++k) {
    const uint64_t c = cost[k - k_lo] + changed * (1 + static_cast<uint64_t>(k));
    if (c < best) {
      best = c;
      p.params.rice_k = static_cast<uint32_t>(k);
    }
  }
  p.bits = best;
  p.params.minus_first = minus > plus;
  p.bits += p.params.minus_first ? minus + 2 * plus : plus + 2 * minus;
  if (escapes != 0) {
    best = std::numeric_limits<uint64_t>::max();
    for (uint32_t k = 0; k <= delta_max_escape_k; ++k) {
      if (esc_cost[k] < best) {
        best = esc_cost[k];
        p.params.escape_k = k;
      }
    }
    p.bits += 2 * escapes + best;
  }
  return p;
}

} // namespace detail

uint32_t delta_step_bits(uint16_t s, const delta_sparse_params& params) {
  return step_code_bits(s, params.minus_first, params.escape_k);
}

delta_sparse_params choose_delta_params(const uint32_t* positions, const uint16_t* steps,
                                        size_t changed) {
  return plan_sparse(positions, steps, changed).params;
}

uint64_t delta_sparse_bits(const uint32_t* positions, const uint16_t* steps, size_t changed,
                           const delta_sparse_params& params) {
  uint64_t bits = 0;
  uint64_t prev_end = 0;
  for (size_t i = 0; i < changed; ++i) {
    bits += delta_gap_bits(positions[i] - prev_end, params.rice_k) +
            delta_step_bits(steps[i], params);
    prev_end = uint64_t{positions[i]} + 1;
  }
  return bits;
}

void write_delta_sparse_payload(const uint32_t* positions, const uint16_t* steps,
                                size_t changed, const delta_sparse_params& params,
                                uint8_t* out) {
  bit_writer w(out);
  const uint32_t k = params.rice_k;
  uint64_t prev_end = 0;
  for (size_t i = 0; i < changed; ++i) {
    const uint64_t g = positions[i] - prev_end;
    prev_end = uint64_t{positions[i]} + 1;
    const rice_code c = rice_encode(g, k);
    if (c.zeros + 1 + k <= 32) {
      w.put((uint64_t{1} << c.zeros) | (c.low << (c.zeros + 1)),
            static_cast<uint32_t>(c.zeros) + 1 + k);
    } else {
      w.unary(c.zeros);
      if (k != 0)
        w.put(c.low, k);
    }
    write_step(w, steps[i], params);
  }
  w.finish();
}

} // namespace sorl::sync
