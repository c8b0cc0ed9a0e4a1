#pragma once

// Per-thread logic of the GPU sparse weight-sync codec (ARCHITECTURE.md §6, SparseRL-Sync), shared
// by the CUDA kernels (gpu/sparse_sync.cu) and their CPU twin (gpu/delta_twin.cpp). Everything
// here is a `SORL_HD` inline function over plain integers and pointers: compiled by nvcc it is
// `__host__ __device__`, compiled by a plain C++ compiler it is ordinary host code. The codes
// themselves (zigzag, Rice, Exp-Golomb) come from runtime/sync/bit_codes.hpp, which the CPU codec
// uses too. The CPU twin runs these same functions in an emulated launch (blocks, then
// threads, in order), so a CPU test pins the GPU algorithm to the CPU codec
// (runtime/sync/delta_codec.hpp) byte for byte.
//
// The encoder pipeline, per version (all segments of all tensors in one launch each):
//   K1 count     one block per tile of tile_elements elements of one segment; each thread
//                compares thread_elements elements (thread_changed_mask) → changed per tile.
//   scan         exclusive sum of the tile counts → where each tile's changes go.
//   K2 compact   the same tiles again; a block scan of the per-thread counts ranks each change;
//                thread_emit_changes writes segment-relative positions and steps, increasing.
//   K3 params    one block per segment reduces segment_sums (sums_add_element) over its
//                changes; params_from_sums / sparse_bits_from_sums reproduce
//                choose_delta_params and delta_sparse_bits exactly (same windows, tie rules).
//   K4 payload   one block per sparse segment: per-element code lengths (element_code_bits),
//                a running block scan → bit offsets, then emit_element_codes ORs each code's
//                one bits into the zeroed payload words (atomicOr on the device). The result is
//                byte-identical to write_delta_sparse_payload.
// The decoder: one thread per sparse entry runs decode_entry serially over its bit stream (the
// format has no restart points), writing destinations and steps; a second kernel scatters
// them (scatter_step), one thread per change.

#include "runtime/sync/bit_codes.hpp"

#include <cstdint>

namespace sorl::gpu {

/// Elements one thread of K1/K2 compares (one 16-byte load from each array when aligned).
constexpr uint32_t thread_elements = 8;
/// Threads per block of every kernel.
constexpr uint32_t block_threads = 256;
/// Elements per K1/K2 tile; divides delta_segment_elements (2^20).
constexpr uint32_t tile_elements = thread_elements * block_threads;
/// Consecutive changes per thread in one K4 chunk (fewer block scans per segment).
constexpr uint32_t payload_items = 4;
/// Rice parameter window of choose_delta_params: k0 − 2 .. k0 + 1.
constexpr uint32_t rice_window = 4;
/// Exp-Golomb orders 0..15 of escaped steps.
constexpr uint32_t escape_orders = 16;
/// Largest Rice parameter (delta_max_rice_k).
constexpr uint32_t max_rice_k = 32;
/// Zero 32-bit words after a bucket copy, so that bit_window may read past its last code.
constexpr uint32_t decode_pad_words = 3;

// The format's codes, shared with the CPU codec.
using sync::ctz_u64;
using sync::escape_value;
using sync::escaped_step;
using sync::exp_golomb_bits;
using sync::exp_golomb_code;
using sync::exp_golomb_encode;
using sync::exp_golomb_value;
using sync::floor_log2_u64;
using sync::rice_bits;
using sync::rice_code;
using sync::rice_encode;
using sync::rice_value;
using sync::step_code_bits;
using sync::step_minus;
using sync::step_plus;

SORL_HD inline uint32_t popcount_u32(uint32_t v) {
#ifdef __CUDA_ARCH__
  return static_cast<uint32_t>(__popc(v));
#else
  return static_cast<uint32_t>(__builtin_popcount(v));
#endif
}

/// Code parameters of one sparse entry (mirror of sync::delta_sparse_params, kept POD and
/// free of the CPU codec's header so that device code needs nothing but this file).
struct code_params {
  uint32_t rice_k;
  uint32_t escape_k;
  uint32_t minus_first; ///< 1 when −1 (0xFFFF) is the 1-bit step
};

SORL_HD inline uint16_t first_step(const code_params& p) {
  return sync::first_step(p.minus_first != 0);
}
SORL_HD inline uint16_t second_step(const code_params& p) {
  return sync::second_step(p.minus_first != 0);
}

// ---- launch tables ----

/// One segment as the kernels see it (device or, in the twin, host pointers).
struct kernel_segment {
  const uint16_t* base; ///< the segment's first base element
  const uint16_t* next; ///< the segment's first next element
  uint64_t count;       ///< elements
  uint64_t tile_begin;  ///< first K1/K2 tile
  uint64_t tile_end;    ///< one past the last tile
};

/// Segment holding `tile`: binary search over the segments' tile_begin (increasing).
SORL_HD inline uint32_t segment_of_tile(const kernel_segment* segs, uint32_t count, uint64_t tile) {
  uint32_t lo = 0, hi = count; // segs[lo].tile_begin <= tile < segs[hi].tile_begin
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (segs[mid].tile_begin <= tile)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// ---- K1 / K2: changed-element scan and compaction ----

/// Bit j (j < thread_elements) set when base[i + j] != next[i + j] for i + j < n, with
/// i = begin. `base`/`next` point at the segment start. Uses one 16-byte load per array when
/// both addresses are aligned and the 8 elements are all inside the segment.
SORL_HD inline uint32_t thread_changed_mask(const uint16_t* base, const uint16_t* next, uint64_t n,
                                            uint64_t begin) {
  if (begin >= n)
    return 0;
  uint32_t mask = 0;
#ifdef __CUDA_ARCH__
  const uint16_t* pa = base + begin;
  const uint16_t* pb = next + begin;
  if (begin + thread_elements <= n &&
      ((reinterpret_cast<uintptr_t>(pa) | reinterpret_cast<uintptr_t>(pb)) & 15u) == 0) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(pa));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(pb));
    const uint32_t x[4] = {a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w};
#pragma unroll
    for (uint32_t w = 0; w < 4; ++w) {
      mask |= ((x[w] & 0xFFFFu) != 0 ? 1u : 0u) << (2 * w);
      mask |= ((x[w] >> 16) != 0 ? 1u : 0u) << (2 * w + 1);
    }
    return mask;
  }
#endif
  const uint64_t end = begin + thread_elements < n ? begin + thread_elements : n;
  for (uint64_t i = begin; i < end; ++i)
    mask |= (base[i] != next[i] ? 1u : 0u) << (i - begin);
  return mask;
}

/// Writes the changes marked in `mask` (from thread_changed_mask at `begin`) to
/// positions[rank...] / steps[rank...]: segment-relative positions, steps (next − base) mod 2^16.
SORL_HD inline void thread_emit_changes(const uint16_t* base, const uint16_t* next, uint64_t begin,
                                        uint32_t mask, uint32_t* positions, uint16_t* steps,
                                        uint64_t rank) {
  while (mask != 0) {
    const uint32_t j = ctz_u64(mask);
    mask &= mask - 1;
    const uint64_t i = begin + j;
    positions[rank] = static_cast<uint32_t>(i);
    steps[rank] = static_cast<uint16_t>(next[i] - base[i]);
    ++rank;
  }
}

// ---- K3: parameter choice from reduced sums ----

/// The sums choose_delta_params minimises, over a segment's changes, as one array (so that
/// reductions treat every field alike): Σ g >> (k_lo + j) for the Rice window j < 4, Σ ExpGolomb_k
/// bits of the escaped steps for every order k < 16, and the counts of +1 and −1 steps.
struct segment_sums {
  static constexpr uint32_t gap_at = 0;
  static constexpr uint32_t escape_at = gap_at + rice_window;
  static constexpr uint32_t plus_at = escape_at + escape_orders;
  static constexpr uint32_t minus_at = plus_at + 1;
  static constexpr uint32_t fields = minus_at + 1;
  uint64_t v[fields];
};

SORL_HD inline void sums_clear(segment_sums& s) {
  for (uint32_t i = 0; i < segment_sums::fields; ++i)
    s.v[i] = 0;
}

/// Lowest Rice parameter of the window for `changed` changes whose last range-relative
/// position is `last`: k0 = floor(log2(max(1, Σg / changed))) with Σg = last + 1 − changed.
SORL_HD inline uint32_t rice_window_low(uint64_t changed, uint64_t last) {
  const uint64_t sum = last + 1 - changed;
  const uint64_t mean_raw = sum / changed;
  const uint64_t mean = mean_raw > 0 ? mean_raw : 1;
  const uint32_t k0 = floor_log2_u64(mean);
  return k0 >= 2 ? k0 - 2 : 0;
}

/// Highest Rice parameter of the window.
SORL_HD inline uint32_t rice_window_high(uint64_t changed, uint64_t last) {
  const uint64_t sum = last + 1 - changed;
  const uint64_t mean_raw = sum / changed;
  const uint64_t mean = mean_raw > 0 ? mean_raw : 1;
  const uint32_t k0 = floor_log2_u64(mean);
  return k0 + 1 < max_rice_k ? k0 + 1 : max_rice_k;
}

/// Gap of change i: positions[i] − positions[i − 1] − 1 (positions[0] for i == 0).
SORL_HD inline uint64_t change_gap(const uint32_t* positions, uint64_t i) {
  return i == 0 ? uint64_t{positions[0]} : uint64_t{positions[i]} - positions[i - 1] - 1;
}

/// Adds one change's contribution (gap g, nonzero step s) for the window starting at k_lo.
SORL_HD inline void sums_add_element(segment_sums& acc, uint64_t g, uint16_t s, uint32_t k_lo) {
  for (uint32_t j = 0; j < rice_window; ++j)
    acc.v[segment_sums::gap_at + j] += g >> (k_lo + j); // k_lo + j ≤ 33
  if (s == step_plus) {
    ++acc.v[segment_sums::plus_at];
  } else if (s == step_minus) {
    ++acc.v[segment_sums::minus_at];
  } else {
    const uint32_t x = escape_value(s);
    for (uint32_t k = 0; k < escape_orders; ++k)
      acc.v[segment_sums::escape_at + k] += exp_golomb_bits(x, k);
  }
}

/// choose_delta_params from the reduced sums: the same windows, strict < (ties to the smaller
/// parameter), minus_first when −1 is strictly more frequent than +1.
SORL_HD inline code_params params_from_sums(const segment_sums& s, uint64_t changed,
                                            uint64_t last) {
  code_params p{0, 0, 0};
  if (changed == 0)
    return p;
  const uint32_t k_lo = rice_window_low(changed, last);
  const uint32_t k_hi = rice_window_high(changed, last);
  uint64_t best = ~uint64_t{0};
  for (uint32_t k = k_lo; k <= k_hi; ++k) {
    const uint64_t c = s.v[segment_sums::gap_at + k - k_lo] + changed * (1 + uint64_t{k});
    if (c < best) {
      best = c;
      p.rice_k = k;
    }
  }
  p.minus_first = s.v[segment_sums::minus_at] > s.v[segment_sums::plus_at] ? 1u : 0u;
  best = ~uint64_t{0};
  for (uint32_t k = 0; k < escape_orders; ++k) {
    if (s.v[segment_sums::escape_at + k] < best) {
      best = s.v[segment_sums::escape_at + k];
      p.escape_k = k;
    }
  }
  return p;
}

/// delta_sparse_bits from the reduced sums and the chosen parameters.
SORL_HD inline uint64_t sparse_bits_from_sums(const segment_sums& s, uint64_t changed,
                                              uint64_t last, const code_params& p) {
  const uint32_t k_lo = rice_window_low(changed, last);
  const uint64_t plus = s.v[segment_sums::plus_at];
  const uint64_t minus = s.v[segment_sums::minus_at];
  const uint64_t gap_bits =
    s.v[segment_sums::gap_at + p.rice_k - k_lo] + changed * (1 + uint64_t{p.rice_k});
  const uint64_t first = p.minus_first ? minus : plus;
  const uint64_t second = p.minus_first ? plus : minus;
  const uint64_t escaped = changed - plus - minus;
  return gap_bits + first + 2 * second + 2 * escaped + s.v[segment_sums::escape_at + p.escape_k];
}

// ---- K4: payload bits ----

/// Bits of one change's codes: Rice(g) then the step code.
SORL_HD inline uint64_t element_code_bits(uint64_t g, uint16_t s, const code_params& p) {
  return rice_bits(g, p.rice_k) + step_code_bits(s, p.minus_first != 0, p.escape_k);
}

/// ORs `value` (at most 33 bits) into the LSB-first bit stream `words` at bit `bit`. Touches a
/// word only where a bit is set, so a code ending at the stream's last bit never reaches past
/// its last word. On the device the OR is atomic: neighbouring codes share words.
SORL_HD inline void or_bits(uint32_t* words, uint64_t bit, uint64_t value) {
  const uint64_t w = bit >> 5;
  const uint64_t v = value << (bit & 31u);
  const auto lo = static_cast<uint32_t>(v);
  const auto hi = static_cast<uint32_t>(v >> 32);
#ifdef __CUDA_ARCH__
  if (lo != 0)
    atomicOr(words + w, lo);
  if (hi != 0)
    atomicOr(words + w + 1, hi);
#else
  if (lo != 0)
    words[w] |= lo;
  if (hi != 0)
    words[w + 1] |= hi;
#endif
}

/// Writes one change's codes at bit `bit` of the zeroed stream `words` (bucket format:
/// (g >> k) zeros, a 1, the k low bits of g; then 0 | 1 0 | 1 1 ExpGolomb). Only one bits are
/// written, so a long unary run costs nothing.
SORL_HD inline void emit_element_codes(uint32_t* words, uint64_t bit, uint64_t g, uint16_t s,
                                       const code_params& p) {
  const uint32_t k = p.rice_k; // ≤ 32
  const rice_code gap = rice_encode(g, k);
  or_bits(words, bit + gap.zeros, (gap.low << 1) | 1u);
  bit += gap.zeros + 1 + k;
  if (s == first_step(p))
    return;
  if (s == second_step(p)) {
    or_bits(words, bit, 1u);
    return;
  }
  or_bits(words, bit, 3u);
  const exp_golomb_code c = exp_golomb_encode(escape_value(s), p.escape_k);
  or_bits(words, bit + 2 + c.zeros, (uint64_t{c.low} << 1) | 1u);
}

// ---- decoding (apply) ----

/// 64 stream bits starting at absolute bit `bit` of `words`, which must be readable up to
/// word (bit >> 5) + 2 (a bucket copy carries decode_pad_words zero words at its end).
SORL_HD inline uint64_t bit_window(const uint32_t* words, uint64_t bit) {
  const uint64_t w = bit >> 5;
  const uint32_t sh = static_cast<uint32_t>(bit & 31u);
  const uint64_t low = uint64_t{words[w]} | (uint64_t{words[w + 1]} << 32);
  if (sh == 0)
    return low;
  return (low >> sh) | (uint64_t{words[w + 2]} << (64 - sh));
}

/// Counts zero bits up to the next 1 from `*bit`, consuming them and the 1. The stream must
/// hold the 1 (checked by sync::check_delta_bucket before any decode).
SORL_HD inline uint64_t read_unary(const uint32_t* words, uint64_t* bit) {
  uint64_t q = 0;
  for (;;) {
    const uint64_t w = bit_window(words, *bit);
    if (w != 0) {
      const uint32_t z = ctz_u64(w);
      *bit += z + 1;
      return q + z;
    }
    q += 64;
    *bit += 64;
  }
}

/// Decodes a checked sparse entry of `changed` codes starting at absolute bit `bit` of `words`;
/// for change j writes dst[j] = bits + position and steps_out[j]. Serial by format.
SORL_HD inline void decode_entry(const uint32_t* words, uint64_t bit, const code_params& p,
                                 uint64_t changed, uint16_t* bits, uint16_t** dst,
                                 uint16_t* steps_out) {
  const uint32_t k = p.rice_k;
  const uint32_t ek = p.escape_k;
  const uint16_t first = first_step(p);
  const uint16_t second = second_step(p);
  uint64_t next = 0;
  for (uint64_t j = 0; j < changed; ++j) {
    const uint64_t q = read_unary(words, &bit);
    const uint64_t g = k != 0 ? rice_value(q, k, bit_window(words, bit)) : q;
    bit += k;
    const uint64_t pos = next + g;
    const uint64_t w = bit_window(words, bit);
    uint16_t s;
    if ((w & 1u) == 0) {
      s = first;
      bit += 1;
    } else if ((w & 2u) == 0) {
      s = second;
      bit += 2;
    } else {
      bit += 2;
      const auto zeros = static_cast<uint32_t>(read_unary(words, &bit));
      s = escaped_step(exp_golomb_value(zeros, ek, bit_window(words, bit)));
      bit += zeros + ek;
    }
    dst[j] = bits + pos;
    steps_out[j] = s;
    next = pos + 1;
  }
}

/// Adds a step modulo 2^16 in place.
SORL_HD inline void scatter_step(uint16_t* dst, uint16_t s) {
  *dst = static_cast<uint16_t>(*dst + s);
}

} // namespace sorl::gpu
