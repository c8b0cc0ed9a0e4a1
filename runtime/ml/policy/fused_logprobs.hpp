#pragma once

// Log-probabilities of chosen tokens under an LM head without materialising the logits of every
// row at once: the LM head's [rows, vocab] product is computed a chunk of rows at a time, reduced
// to each row's target log-prob (and entropy), and recomputed chunk by chunk in the backward
// pass, where the gradient of log softmax(z)[y] is onehot(y) − softmax(z). The same idea as the
// fused linear cross-entropy of Liger Kernel (Hsu et al. 2024, "Liger Kernel: Efficient Triton
// Kernels for LLM Training"), here on plain ATen ops: peak memory is one chunk's logits
// instead of all of them (a vocabulary of 49152 makes them 192 KiB per row in fp32), for one
// extra LM-head matmul in the backward pass.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace sorl::ml {

/// What token_logprobs_fused and token_logprobs_plain return.
struct token_logprob_result {
  at::Tensor logprobs;  ///< [R] fp32, log softmax(z)[target] per row; differentiable
  at::Tensor entropy;   ///< [R] fp32, −Σ softmax(z) log softmax(z); undefined unless asked; no grad
};

/// The plain reference: z = hidden · weightᵀ, [R, vocab] fp32, materialised whole. With
/// temperature ≠ 1 the logits are divided in double (so that the temperature counts at full
/// precision) and rounded once to fp32: z = fp32(fp64(logits) / temperature). Then
/// log_softmax(z) in fp32, the target's entry, and with `want_entropy` the entropy.
/// hidden: [R, d] fp32; weight: [vocab, d] fp32; targets: [R] int64 in [0, vocab).
/// Throws c10::Error for mismatched shapes or dtypes.
token_logprob_result token_logprobs_plain(const at::Tensor& hidden, const at::Tensor& weight,
                                          const at::Tensor& targets, double temperature, bool want_entropy);

/// token_logprobs_plain computed `chunk_rows` rows at a time (0: as many rows as make about
/// 2^23 logits, 32 MiB of fp32), never holding more than one chunk's logits, in the forward
/// and in the backward pass (a torch::autograd::Function whose backward recomputes each chunk's
/// logits). Gradients flow to hidden and weight when they require grad: for ℓ = Σ_r g_r ·
/// logprobs_r, ∂ℓ/∂z_r = g_r (onehot(target_r) − softmax(z_r)), divided by the temperature
/// in double as autograd divides it in the plain path. Each chunk runs the plain path's own
/// operations on its rows, so values agree with token_logprobs_plain up to the fp32 rounding
/// of the LM-head matmul over other row counts; the weight's gradient is a sum over chunks.
/// Throws c10::Error for mismatched shapes or dtypes, or chunk_rows < 0.
token_logprob_result token_logprobs_fused(const at::Tensor& hidden, const at::Tensor& weight,
                                          const at::Tensor& targets, double temperature, bool want_entropy,
                                          std::int64_t chunk_rows = 0);

}  // namespace sorl::ml
