#pragma once

// Gram matrix of per-rollout gradients, K_ij = ⟨g_i, g_j⟩, over the weights of linear layers,
// without autograd's per-sample gradients. A linear layer y = x Wᵀ + b sees, for rollout i,
// inputs X_i [S_i, in] and output gradients E_i [S_i, out] (one row per position); its weight
// gradient from rollout i alone is G_i = E_iᵀ X_i and its bias gradient Σ_s E_i[s]. Two ways to
// get ⟨G_i, G_j⟩_F, equal up to rounding:
//   ghost         Σ ((E_i E_jᵀ) ∘ (X_i X_jᵀ)), never forming G_i: cost S_i S_j (in + out)
//                 (the per-sample gradient-norm trick of Goodfellow 2015, "Efficient
//                 per-example gradient computations", and of ghost clipping, Li et al. 2022)
//   materialized  G_i per rollout, then the Gram of their flattened entries: cost
//                 S_i · in · out per rollout, plus N² · in · out
// `automatic` picks the cheaper per layer: ghost wins when the sequences are short against the
// layer's width (S ≲ in · out / (in + out)), materializing when they are long.
//
// Sums run in fp64 so that K is exact to ~1e-12 relative of what fp32 inputs define.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace sorl::learner {

enum class gram_method { automatic, ghost, materialized };

/// One linear layer's view of one forward pass (a micro-batch): row b of the batch is one
/// rollout. input: [B, S, in] (any floating dtype); grad_output: [B, S, out], the gradient of
/// the objective whose per-rollout terms define g_i with respect to the layer's output, zero at
/// positions that do not reach the objective (padding). has_bias adds the bias's gradient.
struct layer_pass {
  at::Tensor input;
  at::Tensor grad_output;
  bool has_bias = false;
};

/// The layer's contribution to K over the rollouts of several passes of the same layer (one
/// per micro-batch): [N, N] fp64 on the passes' device, N = Σ B, rows in pass order. Throws
/// std::invalid_argument for passes whose shapes disagree (batch sizes, positions, or the
/// layer's in / out between passes).
at::Tensor layer_gram(const std::vector<layer_pass>& passes, gram_method method = gram_method::automatic);

/// The method `automatic` takes for these passes (never `automatic`): the smaller of the two
/// costs in the header comment, in multiply-adds.
gram_method cheaper_gram_method(const std::vector<layer_pass>& passes);

}  // namespace sorl::learner
