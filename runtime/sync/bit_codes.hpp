#pragma once

// The bit codes of the sparse delta format (runtime/sync/delta_codec.hpp, "Bucket format"),
// written once for the CPU codec (runtime/sync/delta_codes.cpp, delta_internal.hpp) and for the
// CUDA kernels and their CPU twin (gpu/sparse_sync_kernels.cuh). Plain integer functions:
// `__host__ __device__` when nvcc compiles them, ordinary inline host code otherwise. Lengths
// are in bits; streams are LSB first (the first bit of a code is the lowest bit written).

#include <cstdint>

#ifdef __CUDACC__
#define SORL_HD __host__ __device__
#else
#define SORL_HD
#endif

namespace sorl::sync {

/// floor(log2(v)) for v > 0.
SORL_HD inline uint32_t floor_log2_u64(uint64_t v) {
#ifdef __CUDA_ARCH__
  return 63u - static_cast<uint32_t>(__clzll(static_cast<long long>(v)));
#else
  return 63u - static_cast<uint32_t>(__builtin_clzll(v));
#endif
}

/// Trailing zero bits of v > 0.
SORL_HD inline uint32_t ctz_u64(uint64_t v) {
#ifdef __CUDA_ARCH__
  return static_cast<uint32_t>(__ffsll(static_cast<long long>(v)) - 1);
#else
  return static_cast<uint32_t>(__builtin_ctzll(v));
#endif
}

// ---- steps ----

/// The +1 and −1 steps as 16-bit patterns: the 1-bit and 2-bit step codes.
inline constexpr uint16_t step_plus = 1;
inline constexpr uint16_t step_minus = 0xFFFF;

/// The step coded "0": −1 when the entry's minus_first flag is set, else +1.
SORL_HD inline uint16_t first_step(bool minus_first) {
  return minus_first ? step_minus : step_plus;
}

/// The step coded "1 0": the other of ±1.
SORL_HD inline uint16_t second_step(bool minus_first) {
  return minus_first ? step_plus : step_minus;
}

/// zigzag(s) = (s << 1) ^ (s >> 15) on s as int16, as a 16-bit pattern (0, −1, 1, −2, ... map to
/// 0, 1, 2, 3, ...).
SORL_HD inline uint32_t zigzag16(uint16_t s) {
  const auto v = static_cast<int16_t>(s);
  return static_cast<uint16_t>(static_cast<uint16_t>(s << 1) ^ static_cast<uint16_t>(v >> 15));
}

/// Inverse of zigzag16 on 16-bit values.
SORL_HD inline uint16_t unzigzag16(uint32_t z) {
  return static_cast<uint16_t>((z >> 1) ^ (0u - (z & 1u)));
}

/// The value an escaped step s (neither 0 nor ±1) is Exp-Golomb coded as: zigzag(s) − 3, in
/// 0..65532 (±1 take zigzag values 1 and 2, and 0 is never coded).
SORL_HD inline uint32_t escape_value(uint16_t s) {
  return zigzag16(s) - 3;
}

/// The step of escape value x ≤ 65532.
SORL_HD inline uint16_t escaped_step(uint64_t x) {
  return unzigzag16(static_cast<uint32_t>(x + 3) & 0xFFFFu);
}

// ---- Rice codes (position gaps) ----

/// Bits of Rice_k(g): (g >> k) zero bits, a 1, the k low bits of g.
SORL_HD inline uint64_t rice_bits(uint64_t g, uint32_t k) {
  return (g >> k) + 1 + k;
}

/// Rice_k(g) as a writer emits it: `zeros` zero bits, a 1, then the k bits `low`.
struct rice_code {
  uint64_t zeros;
  uint64_t low;
};

/// Rice_k(g) for k ≤ 32.
SORL_HD inline rice_code rice_encode(uint64_t g, uint32_t k) {
  return {g >> k, g & ((uint64_t{1} << k) - 1)};
}

/// The g of a Rice_k code (k ≤ 32) whose `zeros` zero bits and 1 were read; `after` holds the
/// stream bits that follow the 1, at least k of them.
SORL_HD inline uint64_t rice_value(uint64_t zeros, uint32_t k, uint64_t after) {
  return (zeros << k) | (after & ((uint64_t{1} << k) - 1));
}

// ---- order-k Exp-Golomb codes (escaped steps) ----

/// Bits of ExpGolomb_k(x): 2 floor(log2(x + 2^k)) − k + 1.
SORL_HD inline uint32_t exp_golomb_bits(uint32_t x, uint32_t k) {
  const uint32_t b = floor_log2_u64(uint64_t{x} + (uint64_t{1} << k));
  return 2 * b - k + 1;
}

/// ExpGolomb_k(x) as a writer emits it: `zeros` zero bits, a 1, then the `low_bits` bits `low`.
struct exp_golomb_code {
  uint32_t zeros;
  uint32_t low_bits;
  uint32_t low;
};

/// ExpGolomb_k(x) for x + 2^k < 2^32: y = x + 2^k, b = floor(log2 y); b − k zeros, a 1, the b
/// low bits of y.
SORL_HD inline exp_golomb_code exp_golomb_encode(uint32_t x, uint32_t k) {
  const uint32_t y = x + (1u << k);
  const uint32_t b = floor_log2_u64(y);
  return {b - k, b, y & ((1u << b) - 1)};
}

/// The x of an ExpGolomb_k code whose `zeros` zero bits and 1 were read (zeros + k < 64);
/// `after` holds the stream bits that follow the 1, at least zeros + k of them.
SORL_HD inline uint64_t exp_golomb_value(uint32_t zeros, uint32_t k, uint64_t after) {
  const uint32_t b = zeros + k;
  const uint64_t y = (uint64_t{1} << b) | (after & ((uint64_t{1} << b) - 1));
  return y - (uint64_t{1} << k);
}

/// Bits of the step code of a nonzero step s: 1 for first_step, 2 for second_step, else 2 plus
/// ExpGolomb_{escape_k}(escape_value(s)).
SORL_HD inline uint32_t step_code_bits(uint16_t s, bool minus_first, uint32_t escape_k) {
  if (s == first_step(minus_first))
    return 1;
  if (s == second_step(minus_first))
    return 2;
  return 2 + exp_golomb_bits(escape_value(s), escape_k);
}

} // namespace sorl::sync
