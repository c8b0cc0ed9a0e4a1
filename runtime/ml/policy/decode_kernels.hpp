#pragma once

// CPU kernels of the rollout workers' decode loop, for a policy whose weights are held in
// bf16 (policy_model::clone(kBFloat16), a worker fed by the weight sync).
//
// Why sorl has its own: a decode step at small batch reads every weight once and does little
// arithmetic with it, so its time is the bytes it reads. libtorch's linear layers need fp32
// weights (an fp32 image of the bf16 copy: twice the bytes) and go through BLAS and oneDNN
// calls whose fixed costs dominate products of one to a few rows. Here the bf16 weights are
// widened to fp32 in registers as they are multiplied: the arithmetic is the fp32 arithmetic
// of the bf16 image (exact: widening bf16 is a shift), and the bytes read are half.
//
// Every output element is one dot product summed in a fixed order, whatever the batch size,
// the thread count or the instruction set (AVX-512, AVX2 or plain C++): a row's result does
// not depend on the other rows of the batch, and a run's rollouts do not depend on the machine.

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

namespace sorl::ml {

/// Threads an at::parallel_for of these kernels runs on now: at::get_num_threads() when they
/// are compiled with OpenMP and share libtorch's OpenMP runtime (a source compiled without
/// OpenMP runs its parallel_for on one thread; a libtorch on another OpenMP runtime than the
/// one they are built with would leave them a team sized by OMP_NUM_THREADS). For the benches
/// and a test.
int kernel_threads();

/// y = x · wᵀ + bias with bf16 weights, computed in fp32.
/// x: [M, K] fp32 (M >= 0, K >= 1; any strides: it is made contiguous), w: [N, K] bf16
/// contiguous, bias: undefined or [N] fp32 → [M, N] fp32, on the CPU.
/// Element (m, n) is the fixed-order sum bf16_dot_reference() describes, then + bias[n]; the
/// same bits for every M, N, row position, thread count and instruction set. It differs from
/// at::linear on the fp32 image of w only in the order of the K additions (|Δ| of a few fp32
/// ulps of the sum of |x_k w_k|).
/// Threads: at::parallel_for over blocks of output columns.
/// Throws c10::Error for other dtypes, devices, ranks or mismatched K / bias sizes.
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

/// One element of bf16_linear, in plain C++ (the definition the vector code keeps to):
/// sixteen partial sums p_l (l < 16), p_l = fma(x_k, w_k, p_l) for k = l, l + 16, l + 32, ...
/// in increasing k (the last, incomplete block adds fma(0, 0, p_l) for k >= K), then the tree
/// ((p_l + p_{l+8}) for l < 8, then + the lane 4 on, then 2 on, then 1 on). x: K fp32 values,
/// w: K bf16 bit patterns.
float bf16_dot_reference(const float* x, const std::uint16_t* w, std::int64_t K);

/// Which instruction set bf16_linear uses: "avx512" (AVX-512 F, BW and VL), "avx2" (AVX2 and
/// FMA) or "scalar".
std::string bf16_linear_isa();

/// Forces bf16_linear's instruction set ("avx512", "avx2", "scalar"), or "" for the best this
/// CPU has (the default). For tests and benches: the results are the same bits either way.
/// Throws std::invalid_argument for an unknown name or one this CPU cannot run.
void set_bf16_linear_isa(std::string_view isa);

/// Attention of one new token per sequence over a paged KV cache, for a decode step: sequence
/// b's query heads against the keys and values of its positions 0..lengths[b]-1, read in
/// place from the pool (no gathered copy), grouped-query heads as HF repeat_kv (query head h
/// reads kv head h / (H / KV)). Scores are q·k (8 fp32 partial sums, then a fixed tree) times
/// 1/sqrt(hd), softmax in fp32 (max, exp, sequential sum, divide), then Σ p_j v_j in position
/// order. Matches the padded matmul path (policy_model's attend) up to fp32 rounding.
/// q: [B, H, hd] fp32; keys, values: [slots, KV * hd] fp32, contiguous (one layer of a
/// kv_cache pool); slots: [B, S] int64, row b's first lengths[b] entries the pool rows of its
/// positions in order (the rest ignored); lengths: B values in [1, S].
/// Returns [B, H * hd] fp32. Threads: at::parallel_for over (sequence, kv head).
/// Throws c10::Error for other shapes or dtypes, a length outside [1, S] or a slot outside
/// the pool.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                  const at::Tensor& slots, const std::vector<std::int64_t>& lengths,
                                  std::int64_t n_kv_heads);

/// RMSNorm of every row in one pass, for the decode loop, where ATen's five kernels per call
/// (square, mean, add, rsqrt, two products) cost more than the arithmetic at a few rows:
/// y = (x · r) · weight with r = 1 / sqrt(mean(x²) + eps) in fp32, as rms_norm
/// (runtime/ml/policy/model.hpp) rounds each step, except the sum of squares: exact products summed
/// in fp64 over 8 fixed lanes, so a row's result depends neither on its batch mates nor on
/// the instruction set, and differs from ATen's fp32 sum by at most an ulp of the mean.
/// x: [N, d] fp32 contiguous; weight: [d] fp32 contiguous. Returns [N, d] fp32.
/// Threads: at::parallel_for over rows. Throws c10::Error for other shapes or dtypes.
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps);

/// RoPE in place, the same IEEE operations as apply_rope (runtime/ml/policy/model.hpp), so the same
/// bits: x1' = x1 c - x2 s, x2' = x2 c + x1 s, each product and difference rounded to fp32.
/// x: [N, heads, hd] fp32 contiguous; cos, sin: [N, hd / 2] fp32 contiguous.
/// Throws c10::Error for other shapes or dtypes.
void apply_rope_inplace(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace sorl::ml
