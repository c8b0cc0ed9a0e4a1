#pragma once

// GRPO / DAPO math on plain inputs: group-relative advantages, DAPO's overlong reward shaping
// and the clipped policy-gradient loss. No model, no optimizer, no actors: learner_core
// composes these, and the tests check them against hand-computed values.
//
// References:
//   GRPO      Shao et al. 2024, "DeepSeekMath", §4.1 (objective; outcome-supervision advantages)
//   Dr. GRPO  Liu et al. 2025, "Understanding R1-Zero-Like Training" (no std scaling)
//   DAPO      Yu et al. 2025, "DAPO": clip-higher (§3.1), dynamic sampling (§3.2), token-level
//             loss (§3.3), overlong filtering and soft overlong punishment (§3.4, eq. 13)
//   PPO       Schulman et al. 2017, clipped surrogate objective (eq. 7)
//   k3 KL     Schulman 2020, "Approximating KL Divergence" (blog note), estimator k3

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace sorl::learner {

/// Group-relative advantages of one group of G rollouts of the same prompt.
///
/// With `scale_by_std` (GRPO, Shao et al. 2024 §4.1.2): A_i = (r_i − mean r) / (std r + eps),
/// where std is the *population* standard deviation sqrt(Σ (r_i − mean)² / G). (TRL and veRL
/// use the Bessel-corrected std, divisor G − 1; their advantages are ours times
/// sqrt(G / (G − 1)) up to eps.) Without it (Dr. GRPO, Liu et al. 2025 §3.1): A_i = r_i − mean r.
/// Mean and std are accumulated in double and the result rounded to fp32.
///
/// A group whose rewards are all bitwise equal (including G = 1) carries no signal and gets
/// exactly 0 for every sample, never NaN. An empty group gives an empty vector.
/// Throws std::invalid_argument naming the first index whose reward is NaN or ±inf (the caller
/// sanitises rewards before this), or if eps is negative or not finite.
std::vector<float> group_advantages(const std::vector<float>& rewards, bool scale_by_std,
                                    double eps = 1e-6);

/// True when the group can produce a policy gradient: at least two rewards differ. False for
/// G ≤ 1 and for all-equal rewards. DAPO's dynamic sampling (Yu et al. 2025 §3.2)
/// drops and refills groups for which this is false; that is the trainer's job.
/// Throws std::invalid_argument naming the first NaN / ±inf reward.
bool has_signal(const std::vector<float>& rewards);

/// DAPO soft overlong punishment (Yu et al. 2025, eq. 13), added to the task reward:
///   0                                     if length ≤ max_len − cache_len
///   ((max_len − cache_len) − length) / cache_len   if max_len − cache_len < length ≤ max_len
///   −1                                    if length > max_len
/// `length`, `max_len` and `cache_len` are in tokens (the response length). With cache_len = 0
/// the ramp vanishes: 0 up to max_len, −1 beyond. Throws std::invalid_argument unless
/// length ≥ 0, max_len > 0 and 0 ≤ cache_len ≤ max_len.
float overlong_penalty(std::int64_t length, std::int64_t max_len, std::int64_t cache_len);

/// How the per-token losses of a (mini)batch are averaged into one scalar.
enum class loss_norm {
  /// DAPO (Yu et al. 2025 §3.3): Σ over every trained token of the batch / number of trained
  /// tokens, so long responses weigh in proportion to their length.
  token,
  /// GRPO (Shao et al. 2024 §4.1, the GRPO objective): mean over each sequence's trained tokens,
  /// then mean over the
  /// sequences that have at least one trained token.
  sequence,
};

/// Cap on the log-ratios that policy_loss exponentiates, nats: new − old for the importance
/// ratio and ref − new for k3. exp(89) already overflows fp32, so one token whose log-probs
/// drifted that far would make the loss and every gradient inf or NaN and lose the whole
/// update; exp(20) ≈ 4.85e8 keeps them finite with room to spare (advantages are O(sqrt(G)),
/// kl_coef ≤ 1e6). 20 is the bound common GRPO implementations use (verl clamps both
/// log-ratios to [−20, 20]). Only the upper side is capped: below, exp(x) → 0 cannot
/// overflow, and the terms stay exact with bounded gradients (|∂k3/∂new| ≤ 1, ρ·|A| ≤ |A|).
/// Above the cap the term is constant: it has no gradient there, as PPO's clip has none.
inline constexpr double max_log_ratio = 20.0;

/// Hyper-parameters of policy_loss.
struct loss_options {
  double clip_eps_low = 0.2; ///< ε_low: ratio floor 1 − ε_low for A < 0; in [0, 1)
  /// ε_high: ratio ceiling 1 + ε_high for A > 0; ≥ 0. DAPO's clip-higher raises it (0.28).
  double clip_eps_high = 0.2;
  double kl_coef = 0.0; ///< β of the k3 KL penalty to the reference; ≥ 0, 0 = off
  loss_norm norm = loss_norm::token;

  /// Throws std::invalid_argument naming the first field out of range (or not finite).
  void validate() const;
};

/// What policy_loss returns: the differentiable loss and detached metrics.
struct loss_terms {
  at::Tensor loss;      ///< [] fp32 scalar: pg_loss + kl_coef · kl, differentiable w.r.t. new_logp
  double pg_loss = 0.0; ///< clipped surrogate term, aggregated per loss_options::norm
  double kl = 0.0;      ///< k3 KL estimate, same aggregation; 0 when ref_logp is undefined
  double clip_frac_low = 0.0;  ///< fraction of trained tokens with A < 0 and ratio < 1 − ε_low
  double clip_frac_high = 0.0; ///< fraction of trained tokens with A > 0 and ratio > 1 + ε_high
  double ratio_mean = 0.0;     ///< mean importance ratio over trained tokens (1 when none)
  double ratio_max = 0.0;      ///< largest importance ratio over trained tokens (1 when none)
  std::int64_t tokens = 0;     ///< trained tokens (mask ≠ 0)
};

/// Clipped policy-gradient loss with clip-higher, token- or sequence-level normalisation and an
/// optional k3 KL penalty.
///
/// Per trained token (mask ≠ 0), with ratio ρ = exp(min(new_logp − old_logp, max_log_ratio))
/// and A the sample's advantage (PPO eq. 7 with DAPO's separate bounds, §3.1):
///   ℓ = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)
/// which equals the constant −(1 + ε_high)·A where A > 0 and ρ > 1 + ε_high, the constant
/// −(1 − ε_low)·A where A < 0 and ρ < 1 − ε_low (no gradient in either case), and −ρ·A elsewhere.
/// KL per token (k3, Schulman 2020; unbiased for KL(π_new ‖ π_ref), always ≥ 0):
///   k3 = exp(d) − d − 1,  d = min(ref − new, max_log_ratio)
/// Both are aggregated per `opt.norm`, and loss = pg + kl_coef · kl.
///
/// new_logp: [N, T] fp32, log-probs of the sampled tokens under the policy being trained
/// (usually requires grad); old_logp: [N, T] fp32, the same under the policy that produced the
/// batch (treated as a constant); advantages: [N] fp32, one per sequence; mask: [N, T], any
/// numeric or bool dtype, nonzero = trained token; ref_logp: [N, T] fp32, or an undefined tensor
/// when there is no reference. Values at untrained positions are ignored and may be any finite
/// or non-finite number: they are replaced before exp, so they never reach the loss or its
/// gradient. With finite inputs the loss and its gradient are finite (max_log_ratio). With no trained token at all the loss is an exact 0 that still backpropagates
/// (to zero gradients).
/// token_weights: [N, T] fp32, or undefined (every weight 1): a constant factor on each
/// token's policy-gradient term ℓ (not on the KL term), treated as detached; truncated
/// importance sampling passes min(π_old / π_rollout, C) here (tis_weights). The aggregation's
/// denominators (trained tokens, sequences) do not change with it.
///
/// Throws std::invalid_argument for mismatched shapes or dtypes, invalid options, or
/// kl_coef > 0 without ref_logp.
loss_terms policy_loss(const at::Tensor& new_logp, const at::Tensor& old_logp,
                       const at::Tensor& advantages, const at::Tensor& mask,
                       const at::Tensor& ref_logp, const loss_options& opt,
                       const at::Tensor& token_weights = at::Tensor());

/// Truncated importance-sampling weights (Yao et al. 2025, "Your efficient RL framework
/// secretly brings you off-policy RL training"; veRL `rollout_is_threshold`, slime
/// `--tis-clip`): w = min(exp(old_logp − rollout_logp), cap) per token (an exp that
/// overflows gives exactly cap). old_logp, rollout_logp:
/// [N, T] fp32 → [N, T] fp32, detached. Throws std::invalid_argument for mismatched shapes or
/// cap < 1 (a cap below 1 would shrink even tokens that both sides score alike).
at::Tensor tis_weights(const at::Tensor& old_logp, const at::Tensor& rollout_logp, double cap);

} // namespace sorl::learner
