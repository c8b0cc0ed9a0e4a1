// The changed-element scan of the delta codec (runtime/sync/delta_codec.hpp): find_changed
// (AVX2, SSE2 or scalar, chosen at run time) and the L2-sized pieces the encoder scans.

#include "runtime/sync/delta_internal.hpp"

#include <algorithm>
#include <stdexcept>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SORL_DELTA_X86 1
#endif

namespace sorl::sync {

namespace {

size_t find_changed_scalar(const uint16_t* a, const uint16_t* b, uint64_t begin, uint64_t n,
                           uint32_t* out, size_t k) {
  for (uint64_t i = begin; i < n; ++i) {
    out[k] = static_cast<uint32_t>(i);
    k += a[i] != b[i];
  }
  return k;
}

#ifdef SORL_DELTA_X86

/// Appends the elements marked in a 2-bits-per-element byte mask (both bits set per element).
inline size_t emit_pairs(uint32_t m, uint32_t first, uint32_t* out, size_t k) {
  while (m != 0) {
    out[k++] = first + (static_cast<uint32_t>(__builtin_ctz(m)) >> 1);
    m &= m - 1;
    m &= m - 1;
  }
  return k;
}

size_t find_changed_sse2(const uint16_t* a, const uint16_t* b, uint64_t n, uint32_t* out) {
  size_t k = 0;
  uint64_t i = 0;
  const __m128i zero = _mm_setzero_si128();
  for (; i + 32 <= n; i += 32) {
    const auto* pa = reinterpret_cast<const __m128i*>(a + i);
    const auto* pb = reinterpret_cast<const __m128i*>(b + i);
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128(pa + 0), _mm_loadu_si128(pb + 0));
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128(pa + 1), _mm_loadu_si128(pb + 1));
    __m128i x2 = _mm_xor_si128(_mm_loadu_si128(pa + 2), _mm_loadu_si128(pb + 2));
    __m128i x3 = _mm_xor_si128(_mm_loadu_si128(pa + 3), _mm_loadu_si128(pb + 3));
    __m128i any = _mm_or_si128(_mm_or_si128(x0, x1), _mm_or_si128(x2, x3));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(any, zero)) == 0xFFFF)
      continue;
    const __m128i xs[4] = {x0, x1, x2, x3};
    for (uint32_t q = 0; q < 4; ++q) {
      uint32_t m = ~static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi16(xs[q], zero))) &
                   0xFFFFu;
      k = emit_pairs(m, static_cast<uint32_t>(i) + q * 8, out, k);
    }
  }
  return find_changed_scalar(a, b, i, n, out, k);
}

/// Appends the set bits of a 64-bit mask as positions first + bit. Writes 4 slots
/// unconditionally (as simdjson's flatten_bits), so that blocks with up to 4 changes (all but
/// 4e-5 of them at 1 % changed) take no data-dependent branch; the caller guarantees 4 writable
/// slots past k (k ≤ block start and the block is 64 elements inside an array of n ≥ block
/// start + 64 slots).
__attribute__((target("avx2,bmi,popcnt"))) inline size_t emit_mask64(uint64_t m, uint32_t first,
                                                                     uint32_t* out, size_t k) {
  const auto cnt = static_cast<size_t>(_mm_popcnt_u64(m));
  uint32_t* o = out + k;
  for (int j = 0; j < 4; ++j) {
    o[j] = first + static_cast<uint32_t>(_tzcnt_u64(m));
    m = _blsr_u64(m);
  }
  if (cnt > 4) {
    for (size_t j = 4; j < cnt; ++j) {
      o[j] = first + static_cast<uint32_t>(_tzcnt_u64(m));
      m = _blsr_u64(m);
    }
  }
  return k + cnt;
}

__attribute__((target("avx2,bmi,popcnt"))) size_t find_changed_avx2(const uint16_t* a,
                                                                   const uint16_t* b,
                                                                   uint64_t n, uint32_t* out) {
  size_t k = 0;
  uint64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const auto* pa = reinterpret_cast<const __m256i*>(a + i);
    const auto* pb = reinterpret_cast<const __m256i*>(b + i);
    // Equal-element masks (0xFFFF per equal element), narrowed to bytes in element order.
    const __m256i e0 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 0), _mm256_loadu_si256(pb + 0));
    const __m256i e1 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 1), _mm256_loadu_si256(pb + 1));
    const __m256i e2 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 2), _mm256_loadu_si256(pb + 2));
    const __m256i e3 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 3), _mm256_loadu_si256(pb + 3));
    const __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);
    const __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi16(e2, e3), 0xD8);
    const uint64_t equal = static_cast<uint32_t>(_mm256_movemask_epi8(p01)) |
                           uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(p23))} << 32;
    k = emit_mask64(~equal, static_cast<uint32_t>(i), out, k);
  }
  return find_changed_scalar(a, b, i, n, out, k);
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("popcnt");
  }();
  return has;
}

#endif // SORL_DELTA_X86

} // namespace

size_t find_changed(const uint16_t* a, const uint16_t* b, uint64_t n, uint32_t* positions_out) {
  if (n > (uint64_t{1} << 32))
    throw std::invalid_argument(
      fmt::format("find_changed: {} elements exceed 32-bit positions", n));
#ifdef SORL_DELTA_X86
  if (cpu_has_avx2())
    return find_changed_avx2(a, b, n, positions_out);
  return find_changed_sse2(a, b, n, positions_out);
#else
  return find_changed_scalar(a, b, 0, n, positions_out, 0);
#endif
}

namespace detail {

void scan_changes(const uint16_t* base, const uint16_t* next, uint64_t n, uint32_t* scan,
                  std::vector<uint32_t>& positions, std::vector<uint16_t>& steps) {
  // Scan in L2-sized pieces and read the steps while both pieces are still cached.
  for (uint64_t sub = 0; sub < n; sub += scan_elements) {
    const uint64_t len = std::min(scan_elements, n - sub);
    const uint16_t* b = base + sub;
    const uint16_t* x = next + sub;
    const size_t m = find_changed(b, x, len, scan);
    const size_t at = positions.size();
    positions.resize(at + m);
    steps.resize(at + m);
    for (size_t i = 0; i < m; ++i) {
      const uint32_t p = scan[i];
      positions[at + i] = p + static_cast<uint32_t>(sub);
      steps[at + i] = delta_step(b[p], x[p]);
    }
  }
}

} // namespace detail

} // namespace sorl::sync
