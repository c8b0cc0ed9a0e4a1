#include "runtime/ml/policy/decode_kernels.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build some results from _mm512_undefined_*(), which its own
// uninitialised-value analysis then reports inside every caller.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace sorl::ml {

namespace {

// The partial sums of one dot product: 16 lanes, one AVX-512 register or two AVX2 ones.
constexpr std::int64_t lanes = 16;

float widen(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The fixed reduction tree of the 16 partial sums (bf16_dot_reference).
float reduce_lanes(const float* p) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = p[l] + p[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  const float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
  return s2a + s2b;
}

enum class isa { scalar, avx2, avx512 };

isa best_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return isa::avx2;
#endif
  return isa::scalar;
}

std::atomic<isa>& current_isa() {
  static std::atomic<isa> chosen{best_isa()};
  return chosen;
}

// ---------------------------------------------------------------------------------------------
// Tiles: MR rows of x times NR rows of w, every dot product over all K, results (+ bias) into y.

template <int MR, int NR>
void tile_scalar(const float* x, std::int64_t ldx, const std::uint16_t* w, std::int64_t ldw,
                 std::int64_t K, const float* bias, float* y, std::int64_t ldy, bool /*prefetch*/) {
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const float v = bf16_dot_reference(x + i * ldx, w + j * ldw, K);
      y[i * ldy + j] = bias != nullptr ? v + bias[j] : v;
    }
}

#if defined(__x86_64__)

// A decode step streams every weight once, row after row (a tile's NR rows are adjacent), and
// at batch 1 the hardware prefetcher alone kept the read at about half the streaming rate: its
// streams restart at every short row (1,152 bytes for d = 576). Asking for the line 8 KiB ahead
// of each row's position keeps the next rows in flight: batch-1 decode of SmolLM2 went from
// 36-38 to 54-57 tokens/s on an AMD EPYC (AVX2; docs/decode-speed.md has the command). In each
// row block only the first tile of a column tile's rows prefetches: the tiles after it find the
// weights in L1.
constexpr std::int64_t prefetch_bytes = 8192;

// Through an integer: the line ahead may lie past the tensor (a prefetch never faults there).
inline void prefetch_ahead(const std::uint16_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + prefetch_bytes),
               _MM_HINT_T0);
}

__attribute__((target("avx2,fma"))) inline __m256 widen8(const std::uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// lanes 0-7 in lo, 8-15 in hi
__attribute__((target("avx2,fma"))) inline float reduce_avx2(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

template <int MR, int NR>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, std::int64_t ldx,
                                                   const std::uint16_t* w, std::int64_t ldw,
                                                   std::int64_t K, const float* bias, float* y,
                                                   std::int64_t ldy, bool prefetch) {
  __m256 lo[MR][NR], hi[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  std::int64_t k = 0;
  for (; k + lanes <= K; k += lanes) {
    if (prefetch)
      for (int j = 0; j < NR; ++j) prefetch_ahead(w + j * ldw + k);
    __m256 wl[NR], wh[NR];
    for (int j = 0; j < NR; ++j) {
      wl[j] = widen8(w + j * ldw + k);
      wh[j] = widen8(w + j * ldw + k + 8);
    }
    for (int i = 0; i < MR; ++i) {
      const __m256 xl = _mm256_loadu_ps(x + i * ldx + k);
      const __m256 xh = _mm256_loadu_ps(x + i * ldx + k + 8);
      for (int j = 0; j < NR; ++j) {
        lo[i][j] = _mm256_fmadd_ps(xl, wl[j], lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(xh, wh[j], hi[i][j]);
      }
    }
  }
  if (k < K) {  // the last block, zero-padded as the reference pads it
    const std::int64_t r = K - k;
    alignas(32) float xb[MR][lanes] = {};
    alignas(32) std::uint16_t wb[NR][lanes] = {};
    for (int i = 0; i < MR; ++i) std::memcpy(xb[i], x + i * ldx + k, r * sizeof(float));
    for (int j = 0; j < NR; ++j) std::memcpy(wb[j], w + j * ldw + k, r * sizeof(std::uint16_t));
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        lo[i][j] = _mm256_fmadd_ps(_mm256_load_ps(xb[i]), widen8(wb[j]), lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(_mm256_load_ps(xb[i] + 8), widen8(wb[j] + 8), hi[i][j]);
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const float v = reduce_avx2(lo[i][j], hi[i][j]);
      y[i * ldy + j] = bias != nullptr ? v + bias[j] : v;
    }
}

#define SORL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

SORL_AVX512 inline __m512 widen16(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

SORL_AVX512 inline float reduce_avx512(__m512 p) {
  const __m256 lo = _mm512_castps512_ps256(p);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
  return reduce_avx2(lo, hi);
}

template <int MR, int NR>
SORL_AVX512 void tile_avx512(const float* x, std::int64_t ldx, const std::uint16_t* w,
                             std::int64_t ldw, std::int64_t K, const float* bias, float* y,
                             std::int64_t ldy, bool prefetch) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  std::int64_t k = 0;
  for (; k + lanes <= K; k += lanes) {
    if (prefetch)
      for (int j = 0; j < NR; ++j) prefetch_ahead(w + j * ldw + k);
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j)
      wv[j] = widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * ldw + k)));
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {  // masked loads read zeros past K, as the reference pads
    const auto m = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = widen16(_mm256_maskz_loadu_epi16(m, w + j * ldw + k));
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const float v = reduce_avx512(acc[i][j]);
      y[i * ldy + j] = bias != nullptr ? v + bias[j] : v;
    }
}

// tile_avx512 over weights already widened to fp32 (NR rows of ldw >= K floats, zero past K
// up to a whole 16-lane block): the same arithmetic, since widening is exact, without widening
// a weight again for every block of rows that reuses it.
template <int MR, int NR>
SORL_AVX512 void tile_avx512_wide(const float* x, std::int64_t ldx, const float* w, std::int64_t ldw,
                                  std::int64_t K, const float* bias, float* y, std::int64_t ldy) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  std::int64_t k = 0;
  for (; k + lanes <= K; k += lanes) {
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * ldw + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const auto m = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * ldw + k);  // zeros past K
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const float v = reduce_avx512(acc[i][j]);
      y[i * ldy + j] = bias != nullptr ? v + bias[j] : v;
    }
}

// Widens `rows` rows of K bf16 weights into `out` (rows x ldw floats, zero from K to ldw).
SORL_AVX512 void widen_rows(const std::uint16_t* w, std::int64_t K, std::int64_t rows, float* out, std::int64_t ldw) {
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t k = 0;
    for (; k + lanes <= K; k += lanes)
      _mm512_storeu_ps(out + r * ldw + k, widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * K + k))));
    if (k < ldw) {
      const auto m = static_cast<__mmask16>(k < K ? (1u << (K - k)) - 1u : 0u);
      _mm512_storeu_ps(out + r * ldw + k, widen16(_mm256_maskz_loadu_epi16(m, w + r * K + k)));
    }
  }
}

using wide_tile_fn = void (*)(const float*, std::int64_t, const float*, std::int64_t, std::int64_t, const float*,
                              float*, std::int64_t);

// t[mr - 1][nr - 1], as tile_table below, for the widened-weight tiles: 6 x 4 accumulators.
struct wide_tile_table {
  static constexpr int MR = 6, NR = 4;
  wide_tile_fn t[MR][NR];
  template <int M, int N>
  constexpr void fill() {
    t[M - 1][N - 1] = &tile_avx512_wide<M, N>;
    if constexpr (N < NR) fill<M, N + 1>();
    else if constexpr (M < MR) fill<M + 1, 1>();
  }
  constexpr wide_tile_table() : t{} { fill<1, 1>(); }
};

// run() for AVX-512 and at least `min_rows` rows: each column tile's weights are widened once
// into a per-thread buffer, then every row block reuses them from L1.
void run_wide(const float* x, std::int64_t M, std::int64_t K, const std::uint16_t* w, std::int64_t N,
              const float* bias, float* y) {
  static constexpr wide_tile_table table{};
  constexpr std::int64_t MR = wide_tile_table::MR, NR = wide_tile_table::NR;
  const std::int64_t ldw = (K + lanes - 1) / lanes * lanes;
  const std::int64_t col_tiles = (N + NR - 1) / NR;
  const std::int64_t row_block = std::max<std::int64_t>(MR, ((std::int64_t{1} << 20) / (4 * K)) / MR * MR);
  for (std::int64_t r0 = 0; r0 < M; r0 += row_block) {
    const std::int64_t rows = std::min(row_block, M - r0);
    const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / (NR * K * rows));
    at::parallel_for(0, col_tiles, grain, [&](std::int64_t begin, std::int64_t end) {
      std::vector<float> wide(static_cast<std::size_t>(NR * ldw));
      for (std::int64_t c = begin; c < end; ++c) {
        const std::int64_t n0 = c * NR, nr = std::min(NR, N - n0);
        widen_rows(w + n0 * K, K, nr, wide.data(), ldw);
        for (std::int64_t m0 = r0; m0 < r0 + rows; m0 += MR) {
          const std::int64_t mr = std::min(MR, r0 + rows - m0);
          table.t[mr - 1][nr - 1](x + m0 * K, K, wide.data(), ldw, K, bias != nullptr ? bias + n0 : nullptr,
                                  y + m0 * N + n0, N);
        }
      }
    });
  }
}

#endif  // __x86_64__

using tile_fn = void (*)(const float*, std::int64_t, const std::uint16_t*, std::int64_t, std::int64_t,
                         const float*, float*, std::int64_t, bool);

// Tile shapes per instruction set: as many accumulators as the registers hold with the loads.
template <isa I> struct shape;
template <> struct shape<isa::scalar> { static constexpr int mr = 4, nr = 4; };
template <> struct shape<isa::avx2> { static constexpr int mr = 2, nr = 2; };
template <> struct shape<isa::avx512> { static constexpr int mr = 4, nr = 4; };

template <isa I, int MR, int NR>
constexpr tile_fn tile_of() {
#if defined(__x86_64__)
  if constexpr (I == isa::avx512) return &tile_avx512<MR, NR>;
  if constexpr (I == isa::avx2) return &tile_avx2<MR, NR>;
#endif
  return &tile_scalar<MR, NR>;
}

// table[mr - 1][nr - 1]: the tile for a block of mr <= MR rows and nr <= NR columns.
template <isa I>
struct tile_table {
  static constexpr int MR = shape<I>::mr, NR = shape<I>::nr;
  tile_fn t[MR][NR];
  template <int M, int N>
  constexpr void fill() {
    t[M - 1][N - 1] = tile_of<I, M, N>();
    if constexpr (N < NR) fill<M, N + 1>();
    else if constexpr (M < MR) fill<M + 1, 1>();
  }
  constexpr tile_table() : t{} { fill<1, 1>(); }
};

template <isa I>
void run(const float* x, std::int64_t M, std::int64_t K, const std::uint16_t* w, std::int64_t N,
         const float* bias, float* y) {
  static constexpr tile_table<I> table{};
  constexpr std::int64_t MR = shape<I>::mr, NR = shape<I>::nr;
  const std::int64_t col_tiles = (N + NR - 1) / NR;
  // Rows in blocks whose x stays in a core's L2 while every column tile streams past it, so
  // that w is read once per block (once in all for a decode step).
  const std::int64_t row_block = std::max<std::int64_t>(MR, ((std::int64_t{1} << 20) / (4 * K)) / MR * MR);
  for (std::int64_t r0 = 0; r0 < M; r0 += row_block) {
    const std::int64_t rows = std::min(row_block, M - r0);
    // About 64K multiply-adds per task at least: below that the threads' start costs more.
    const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / (NR * K * rows));
    at::parallel_for(0, col_tiles, grain, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t c = begin; c < end; ++c) {
        const std::int64_t n0 = c * NR, nr = std::min(NR, N - n0);
        for (std::int64_t m0 = r0; m0 < r0 + rows; m0 += MR) {
          const std::int64_t mr = std::min(MR, r0 + rows - m0);
          table.t[mr - 1][nr - 1](x + m0 * K, K, w + n0 * K, K, K, bias != nullptr ? bias + n0 : nullptr,
                                  y + m0 * N + n0, N, m0 == r0);
        }
      }
    });
  }
}

}  // namespace

float bf16_dot_reference(const float* x, const std::uint16_t* w, std::int64_t K) {
  float p[lanes] = {};
  std::int64_t k = 0;
  for (; k + lanes <= K; k += lanes)
    for (std::int64_t l = 0; l < lanes; ++l) p[l] = std::fma(x[k + l], widen(w[k + l]), p[l]);
  if (k < K)
    for (std::int64_t l = 0; l < lanes; ++l)
      p[l] = k + l < K ? std::fma(x[k + l], widen(w[k + l]), p[l]) : std::fma(0.0f, 0.0f, p[l]);
  return reduce_lanes(p);
}

int kernel_threads() {
  // More tasks than any team has threads: each thread of the team gets a chunk. The team is
  // counted whatever its size, so that one larger than at::get_num_threads() shows too (a
  // libtorch on another OpenMP runtime than these kernels' would not size it).
  std::vector<int> seen(4096, 0);
  at::parallel_for(0, static_cast<std::int64_t>(seen.size()), 1, [&](std::int64_t, std::int64_t) {
    const int t = at::get_thread_num();
    if (t >= 0 && t < static_cast<int>(seen.size())) seen[static_cast<std::size_t>(t)] = 1;
  });
  int n = 0;
  for (const int s : seen) n += s;
  return n;
}

std::string bf16_linear_isa() {
  switch (current_isa().load()) {
    case isa::avx512: return "avx512";
    case isa::avx2: return "avx2";
    case isa::scalar: break;
  }
  return "scalar";
}

void set_bf16_linear_isa(std::string_view name) {
  const isa best = best_isa();
  isa want = best;
  if (name == "avx512") want = isa::avx512;
  else if (name == "avx2") want = isa::avx2;
  else if (name == "scalar") want = isa::scalar;
  else if (!name.empty())
    throw std::invalid_argument("set_bf16_linear_isa: unknown instruction set '" + std::string(name) +
                                "' (avx512, avx2, scalar)");
  if (static_cast<int>(want) > static_cast<int>(best))
    throw std::invalid_argument("set_bf16_linear_isa: this CPU cannot run " + std::string(name));
  current_isa().store(want);
}

at::Tensor bf16_linear(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& bias) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "bf16_linear: x must be [M, K] fp32 on the CPU, got ", x_in.sizes(), " ",
              x_in.scalar_type(), " on ", x_in.device());
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu() && w.is_contiguous(),
              "bf16_linear: w must be contiguous [N, K] bf16 on the CPU, got ", w.sizes(), " ",
              w.scalar_type());
  const std::int64_t M = x_in.size(0), K = x_in.size(1), N = w.size(0);
  TORCH_CHECK(K >= 1 && w.size(1) == K, "bf16_linear: x has K = ", K, " but w is ", w.sizes());
  if (bias.defined())
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == N && bias.scalar_type() == at::kFloat && bias.device().is_cpu(),
                "bf16_linear: bias must be [", N, "] fp32 on the CPU, got ", bias.sizes(), " ",
                bias.scalar_type());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const auto* wp = reinterpret_cast<const std::uint16_t*>(w.data_ptr<at::BFloat16>());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  switch (current_isa().load()) {
    case isa::avx512:
#if defined(__x86_64__)
      // From 8 rows on, a weight serves enough rows that widening it once pays (the tile then
      // holds 6 x 4 accumulators instead of 4 x 4).
      if (M >= 8) {
        run_wide(xp, M, K, wp, N, bp, yp);
        break;
      }
#endif
      run<isa::avx512>(xp, M, K, wp, N, bp, yp);
      break;
    case isa::avx2: run<isa::avx2>(xp, M, K, wp, N, bp, yp); break;
    case isa::scalar: run<isa::scalar>(xp, M, K, wp, N, bp, yp); break;
  }
  return y;
}

namespace {

// q · k over hd values: 8 partial sums p_l = fma(q_i, k_i, p_l) for i = l, l + 8, ... (zeros
// past hd), then (p_l + p_{l+4}), (+ 2 on), (+ 1 on).
float dot8_reference(const float* q, const float* k, std::int64_t n) {
  float p[8] = {};
  for (std::int64_t i = 0; i < n; i += 8)
    for (std::int64_t l = 0; l < 8; ++l) p[l] = i + l < n ? std::fma(q[i + l], k[i + l], p[l]) : std::fma(0.0f, 0.0f, p[l]);
  const float a = p[0] + p[4], b = p[1] + p[5], c = p[2] + p[6], d = p[3] + p[7];
  return (a + c) + (b + d);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float dot8_avx2(const float* q, const float* k, std::int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
  if (i < n) {
    alignas(32) float qb[8] = {}, kb[8] = {};
    std::memcpy(qb, q + i, static_cast<std::size_t>(n - i) * sizeof(float));
    std::memcpy(kb, k + i, static_cast<std::size_t>(n - i) * sizeof(float));
    acc = _mm256_fmadd_ps(_mm256_load_ps(qb), _mm256_load_ps(kb), acc);
  }
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// out[0..n) += p * v[0..n), one fma per element (the same bits as std::fma).
__attribute__((target("avx2,fma"))) void axpy_avx2(float p, const float* v, float* out, std::int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
  for (; i < n; ++i) out[i] = std::fma(p, v[i], out[i]);
}
#endif

void axpy_reference(float p, const float* v, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = std::fma(p, v[i], out[i]);
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values,
                                  const at::Tensor& slots_in, const std::vector<std::int64_t>& lengths,
                                  std::int64_t KV) {
  TORCH_CHECK(q_in.dim() == 3 && q_in.scalar_type() == at::kFloat && q_in.device().is_cpu(),
              "paged_decode_attention: q must be [B, H, hd] fp32 on the CPU, got ", q_in.sizes());
  const std::int64_t B = q_in.size(0), H = q_in.size(1), hd = q_in.size(2);
  TORCH_CHECK(KV >= 1 && H % KV == 0, "paged_decode_attention: ", H, " query heads for ", KV, " kv heads");
  TORCH_CHECK(keys.dim() == 2 && keys.sizes() == values.sizes() && keys.size(1) == KV * hd &&
                  keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat &&
                  keys.is_contiguous() && values.is_contiguous(),
              "paged_decode_attention: keys and values must be contiguous [slots, ", KV * hd, "] fp32, got ",
              keys.sizes(), " and ", values.sizes());
  TORCH_CHECK(slots_in.dim() == 2 && slots_in.size(0) == B && slots_in.scalar_type() == at::kLong,
              "paged_decode_attention: slots must be [", B, ", S] int64, got ", slots_in.sizes());
  TORCH_CHECK(static_cast<std::int64_t>(lengths.size()) == B, "paged_decode_attention: ", lengths.size(),
              " lengths for ", B, " sequences");
  const std::int64_t S = slots_in.size(1), pool = keys.size(0);
  const at::Tensor q = q_in.contiguous();
  const at::Tensor slots = slots_in.contiguous();
  const std::int64_t* sp = slots.data_ptr<std::int64_t>();
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = lengths[static_cast<std::size_t>(b)];
    TORCH_CHECK(len >= 1 && len <= S, "paged_decode_attention: length ", len, " of sequence ", b,
                " outside [1, ", S, "]");
    for (std::int64_t j = 0; j < len; ++j)
      TORCH_CHECK(sp[b * S + j] >= 0 && sp[b * S + j] < pool, "paged_decode_attention: slot ", sp[b * S + j],
                  " outside the pool of ", pool);
  }
  at::Tensor out = at::zeros({B, H * hd}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const std::int64_t rep = H / KV, row = KV * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const bool avx2 = current_isa().load() != isa::scalar;
  std::int64_t work = 0;
  for (const std::int64_t len : lengths) work += len;
  const std::int64_t grain = std::max<std::int64_t>(1, (B * KV) * 4096 / std::max<std::int64_t>(1, work * rep * hd * 2));
  at::parallel_for(0, B * KV, grain, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> score;
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t b = t / KV, g = t % KV, len = lengths[static_cast<std::size_t>(b)];
      score.resize(static_cast<std::size_t>(len));
      for (std::int64_t r = 0; r < rep; ++r) {
        const std::int64_t h = g * rep + r;
        const float* qh = qp + (b * H + h) * hd;
        float mx = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j < len; ++j) {
          const float* k = kp + sp[b * S + j] * row + g * hd;
#if defined(__x86_64__)
          const float dot = avx2 ? dot8_avx2(qh, k, hd) : dot8_reference(qh, k, hd);
#else
          const float dot = dot8_reference(qh, k, hd);
#endif
          score[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, score[static_cast<std::size_t>(j)]);
        }
        float sum = 0.0f;
        for (std::int64_t j = 0; j < len; ++j) {
          const float e = std::exp(score[static_cast<std::size_t>(j)] - mx);
          score[static_cast<std::size_t>(j)] = e;
          sum += e;
        }
        float* oh = op + b * H * hd + h * hd;
        for (std::int64_t j = 0; j < len; ++j) {
          const float p = score[static_cast<std::size_t>(j)] / sum;
          const float* v = vp + sp[b * S + j] * row + g * hd;
#if defined(__x86_64__)
          if (avx2) axpy_avx2(p, v, oh, hd);
          else axpy_reference(p, v, oh, hd);
#else
          axpy_reference(p, v, oh, hd);
#endif
        }
      }
    }
  });
  return out;
}

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "rms_norm_rows: x must be contiguous [N, d] fp32, got ", x.sizes(), " ", x.scalar_type());
  const std::int64_t N = x.size(0), d = x.size(1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "rms_norm_rows: weight must be contiguous [", d, "] fp32, got ", weight.sizes());
  at::Tensor out = at::empty({N, d}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  const auto epsf = static_cast<float>(eps);  // ATen adds a double scalar to fp32 in fp32
  constexpr std::int64_t L = 8;
  at::parallel_for(0, N, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(d, 1)), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n) {
      const float* row = xp + n * d;
      // A float times a float is exact in double, and 8 independent lanes vectorise without
      // reassociating, so the order of additions is this one on every instruction set.
      double acc[L] = {};
      std::int64_t i = 0;
      for (; i + L <= d; i += L)
        for (std::int64_t l = 0; l < L; ++l) acc[l] += static_cast<double>(row[i + l]) * row[i + l];
      for (std::int64_t l = 0; i + l < d; ++l) acc[l] += static_cast<double>(row[i + l]) * row[i + l];
      const double sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
      const float mean = static_cast<float>(sum / static_cast<double>(d));
      const float r = 1.0f / std::sqrt(mean + epsf);
      float* y = yp + n * d;
      for (std::int64_t j = 0; j < d; ++j) y[j] = (row[j] * r) * wp[j];
    }
  });
  return out;
}

void apply_rope_inplace(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(2) % 2 == 0,
              "apply_rope_inplace: x must be contiguous [N, heads, even hd] fp32, got ", x.sizes());
  const std::int64_t N = x.size(0), heads = x.size(1), hd = x.size(2), half = hd / 2;
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == N && cos.size(1) == half && sin.sizes() == cos.sizes() &&
                  cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous(),
              "apply_rope_inplace: cos and sin must be contiguous [", N, ", ", half, "] fp32, got ", cos.sizes());
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t h = 0; h < heads; ++h) {
      float* x1 = xp + (n * heads + h) * hd;
      float* x2 = x1 + half;
      const float* c = cp + n * half;
      const float* s = sp + n * half;
      for (std::int64_t i = 0; i < half; ++i) {
        // Each product rounded on its own, as ATen's separate mul and sub kernels round it;
        // volatile keeps the compiler from fusing them into an fma.
        const volatile float a = x1[i] * c[i], bq = x2[i] * s[i], cq = x2[i] * c[i], d = x1[i] * s[i];
        x1[i] = a - bq;
        x2[i] = cq + d;
      }
    }
}

}  // namespace sorl::ml
