#pragma once

// SALT: subspace-adaptive reweighting of the group-relative coefficients of one minibatch, from
// the Gram matrix of its rollouts' policy-gradient features (the learner's part of
// ARCHITECTURE.md §6, SALT). Pure math on a [N, N] matrix and a [N] vector: no model, no
// actors. actors/learner/grad_gram.hpp computes the Gram matrix; learner_core composes both.
//
// Source: "SALT: When More Rollouts Don't Help in Group-Based Policy Optimization and How to
// Make Them Matter" (arXiv 2606.05800). Under GRPO-style normalisation the per-rollout
// features g_i concentrate in a low-rank, signed geometry, so the update Σ a_i g_i cancels.
// The paper's exact estimators are not reproduced here; this is the formulation sorl
// implements, each choice stated:
//
//   K_ij = ⟨g_i, g_j⟩                       the minibatch Gram matrix (grad_gram.hpp)
//   K = U Λ Uᵀ, λ_1 ≥ λ_2 ≥ …               eigh; negative rounding noise counts as 0
//   r  = min{ k : Σ_{j≤k} λ_j ≥ η Σ_j λ_j }  the dominant ("shared") rank
//   a_s = U_r U_rᵀ a,  a_r = a − a_s          shared and residual channels
//   c  = aᵀ K a / Σ_i a_i² K_ii               signed cancellation: ‖Σ a_i g_i‖² over the
//                                            update's norm² without any cancellation; c = 1
//                                            for orthogonal features, c → 0 as they cancel
//   γ  = min(γ_max, 1 + β · clip((c₀ − c) / c₀, 0, 1))
//   a' = (a_s + γ a_r) · ‖a‖₂ / ‖a_s + γ a_r‖₂
//
// The rescale keeps ‖a'‖₂ = ‖a‖₂: the coefficients keep their magnitude, so the loss scale
// and what gradient clipping does stay comparable, and SALT changes the update's direction
// (the share of the residual channel) only. Under Adam a uniform scale of the gradient would
// change almost nothing anyway.
//
// Rollouts with K_ii = 0 (no trained token, or a zero gradient) carry no feature: they are
// left out of the split and keep their coefficient.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace sorl::learner {

/// SALT's hyper-parameters ([salt] in the experiment file, runtime/config.hpp).
struct salt_options {
  double eta = 0.9;        ///< energy share of the dominant subspace, in (0, 1]
  double beta = 1.0;       ///< amplification slope, ≥ 0 (0 = γ is always 1: a' = a exactly)
  double c0 = 0.5;         ///< cancellation below which the residual channel is amplified, > 0
  double gamma_max = 3.0;  ///< upper bound on γ, ≥ 1

  /// Throws std::invalid_argument naming the first field out of range (or not finite).
  void validate() const;
};

/// Why salt_coefficients left the coefficients as they were.
enum class salt_noop {
  none,         ///< applied (γ may still be 1 when c ≥ c₀: then a' = a exactly)
  too_few,      ///< fewer than two rollouts with a nonzero feature
  no_signal,    ///< every coefficient of a rollout with a feature is 0, or aᵀKa = 0 and Σ a_i² K_ii = 0
  nonfinite,    ///< K has a NaN or ±inf entry (then the step's own checks drop the update)
};

/// What salt_coefficients measured and returned.
struct salt_result {
  at::Tensor coefficients;  ///< [N] fp64: a', or a itself (same values) for a no-op
  /// [N] fp64: a_s and a_r, a = a_s + a_r and a_sᵀ a_r = 0 (up to rounding); a rollout without
  /// a feature has all of its coefficient in `residual`. For a no-op: shared 0, residual a.
  at::Tensor shared, residual;
  salt_noop noop = salt_noop::none;
  std::int64_t rank = 0;        ///< r (0 for a no-op)
  double cancellation = 0.0;    ///< c (0 when undefined)
  double gamma = 1.0;           ///< γ (1 for a no-op)
  double norm_before = 0.0;     ///< ‖Σ a_i g_i‖ = sqrt(aᵀKa)
  double norm_after = 0.0;      ///< ‖Σ a'_i g_i‖ = sqrt(a'ᵀKa')
  double shared_share = 0.0;    ///< ‖a_s‖² / ‖a‖² over the rollouts with a feature
};

/// SALT's coefficients for one minibatch (the formulation at the top of this header).
/// K: [N, N] symmetric positive semi-definite (up to rounding), any floating dtype; a: [N] the
/// group-relative advantages, any floating dtype. Computed in fp64 on the CPU.
/// With β = 0, or c ≥ c₀, or a no-op, the result equals a bit for bit (γ = 1 is not applied
/// through the split, which would round).
/// Throws std::invalid_argument for mismatched shapes, invalid options, or a non-finite a.
salt_result salt_coefficients(const at::Tensor& K, const at::Tensor& a, const salt_options& opt);

/// "none", "too_few", "no_signal", "nonfinite".
std::string to_string(salt_noop n);

}  // namespace sorl::learner
