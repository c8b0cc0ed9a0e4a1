#include "actors/learner/grpo.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>

namespace sorl::learner {

namespace {

void require_finite_rewards(const std::vector<float>& rewards, const char* who) {
  for (std::size_t i = 0; i < rewards.size(); ++i)
    if (!std::isfinite(rewards[i]))
      throw std::invalid_argument(
        fmt::format("{}: reward {} at index {} is not finite", who, rewards[i], i));
}

bool all_equal(const std::vector<float>& rewards) {
  for (const float r : rewards)
    if (r != rewards.front())
      return false;
  return true;
}

void require_same_shape(const at::Tensor& t, const at::Tensor& like, const char* name) {
  if (!t.defined())
    throw std::invalid_argument(fmt::format("policy_loss: {} is undefined", name));
  if (t.sizes() != like.sizes())
    throw std::invalid_argument(fmt::format("policy_loss: {} has shape [{}], new_logp has [{}]",
                                            name, fmt::join(t.sizes(), ", "),
                                            fmt::join(like.sizes(), ", ")));
}

void require_float(const at::Tensor& t, const char* name) {
  if (t.scalar_type() != at::kFloat)
    throw std::invalid_argument(
      fmt::format("policy_loss: {} must be fp32, got {}", name, c10::toString(t.scalar_type())));
}

} // namespace

std::vector<float> group_advantages(const std::vector<float>& rewards, bool scale_by_std,
                                    double eps) {
  require_finite_rewards(rewards, "group_advantages");
  if (!(eps >= 0.0) || !std::isfinite(eps))
    throw std::invalid_argument(fmt::format("group_advantages: eps must be >= 0, got {}", eps));
  std::vector<float> out(rewards.size(), 0.0f);
  // Bitwise-equal rewards short-circuit to exact zeros: computing (r - mean) would give 0 too
  // in exact arithmetic, but a rounded mean can leave ±1 ulp residues that std then blows up.
  if (rewards.size() <= 1 || all_equal(rewards))
    return out;
  const double g = static_cast<double>(rewards.size());
  double sum = 0.0;
  for (const float r : rewards)
    sum += r;
  const double mean = sum / g;
  double denom = 1.0;
  if (scale_by_std) {
    double sq = 0.0;
    for (const float r : rewards)
      sq += (r - mean) * (r - mean);
    denom = std::sqrt(sq / g) + eps;
  }
  for (std::size_t i = 0; i < rewards.size(); ++i)
    out[i] = static_cast<float>((rewards[i] - mean) / denom);
  return out;
}

bool has_signal(const std::vector<float>& rewards) {
  require_finite_rewards(rewards, "has_signal");
  return rewards.size() > 1 && !all_equal(rewards);
}

float overlong_penalty(std::int64_t length, std::int64_t max_len, std::int64_t cache_len) {
  if (length < 0 || max_len <= 0 || cache_len < 0 || cache_len > max_len)
    throw std::invalid_argument(fmt::format(
      "overlong_penalty: need length >= 0, max_len > 0, 0 <= cache_len <= max_len; got length "
      "{}, max_len {}, cache_len {}",
      length, max_len, cache_len));
  const std::int64_t safe = max_len - cache_len;
  if (length <= safe)
    return 0.0f;
  if (length > max_len)
    return -1.0f;
  // Here cache_len > 0: length lies in (safe, max_len], which is empty when cache_len == 0.
  return static_cast<float>(static_cast<double>(safe - length) / static_cast<double>(cache_len));
}

void loss_options::validate() const {
  if (!(clip_eps_low >= 0.0 && clip_eps_low < 1.0))
    throw std::invalid_argument(
      fmt::format("loss_options.clip_eps_low must be in [0, 1), got {}", clip_eps_low));
  if (!(clip_eps_high >= 0.0) || !std::isfinite(clip_eps_high))
    throw std::invalid_argument(
      fmt::format("loss_options.clip_eps_high must be >= 0 and finite, got {}", clip_eps_high));
  if (!(kl_coef >= 0.0) || !std::isfinite(kl_coef))
    throw std::invalid_argument(
      fmt::format("loss_options.kl_coef must be >= 0 and finite, got {}", kl_coef));
}

loss_terms policy_loss(const at::Tensor& new_logp, const at::Tensor& old_logp,
                       const at::Tensor& advantages, const at::Tensor& mask,
                       const at::Tensor& ref_logp, const loss_options& opt,
                       const at::Tensor& token_weights) {
  opt.validate();
  if (!new_logp.defined() || new_logp.dim() != 2)
    throw std::invalid_argument("policy_loss: new_logp must be a defined [N, T] tensor");
  require_float(new_logp, "new_logp");
  require_same_shape(old_logp, new_logp, "old_logp");
  require_float(old_logp, "old_logp");
  require_same_shape(mask, new_logp, "mask");
  if (!advantages.defined() || advantages.dim() != 1 || advantages.size(0) != new_logp.size(0))
    throw std::invalid_argument(fmt::format(
      "policy_loss: advantages must be [{}] (one per sequence), got [{}]", new_logp.size(0),
      advantages.defined() ? fmt::format("{}", fmt::join(advantages.sizes(), ", ")) : "undefined"));
  require_float(advantages, "advantages");
  if (ref_logp.defined()) {
    require_same_shape(ref_logp, new_logp, "ref_logp");
    require_float(ref_logp, "ref_logp");
  } else if (opt.kl_coef > 0.0) {
    throw std::invalid_argument(
      fmt::format("policy_loss: kl_coef is {} but ref_logp is undefined", opt.kl_coef));
  }
  if (token_weights.defined()) {
    require_same_shape(token_weights, new_logp, "token_weights");
    require_float(token_weights, "token_weights");
  }

  const at::Tensor trained = mask.ne(0);            // [N, T] bool
  const at::Tensor weight = trained.to(at::kFloat); // [N, T] 0/1
  const at::Tensor zeros = at::zeros_like(new_logp);
  // Untrained positions are zeroed before exp: padding may hold garbage, and exp(garbage)
  // could be inf, whose backward (inf · 0) would be NaN even though the loss masks it out.
  const at::Tensor log_ratio =
    at::where(trained, new_logp - old_logp.detach(), zeros).clamp_max(max_log_ratio);
  const at::Tensor ratio = log_ratio.exp();
  const at::Tensor adv = advantages.detach().unsqueeze(1); // [N, 1]

  const double lo = 1.0 - opt.clip_eps_low;
  const double hi = 1.0 + opt.clip_eps_high;
  // The min of PPO's two surrogates, written out: the clipped branch wins exactly where the
  // ratio has left the trust region in the direction the advantage pushes it. Selecting a
  // detached constant there makes "no gradient when clipped" explicit instead of relying on
  // the tie-breaking of minimum's backward.
  const at::Tensor clipped_high = ratio.gt(hi).logical_and(adv.gt(0)).logical_and(trained);
  const at::Tensor clipped_low = ratio.lt(lo).logical_and(adv.lt(0)).logical_and(trained);
  const at::Tensor clipped = clipped_high.logical_or(clipped_low);
  const at::Tensor bound =
    at::where(clipped_high, at::full_like(ratio, hi), at::full_like(ratio, lo));
  const at::Tensor surrogate = at::where(clipped, bound * adv, ratio * adv);
  // Untrained positions' weights may be anything: they are zeroed with the mask below.
  const at::Tensor pg_tok =
    token_weights.defined() ? -surrogate * at::where(trained, token_weights.detach(), zeros) : -surrogate; // [N, T]

  const at::Tensor tokens = weight.sum();
  auto aggregate = [&](const at::Tensor& per_token) -> at::Tensor {
    const at::Tensor masked = per_token * weight; // finite everywhere, so · 0 is safe
    if (opt.norm == loss_norm::token)
      return masked.sum() / tokens.clamp_min(1.0);
    const at::Tensor per_seq_tokens = weight.sum(1); // [N]
    const at::Tensor per_seq = masked.sum(1) / per_seq_tokens.clamp_min(1.0);
    const at::Tensor has_tokens = per_seq_tokens.gt(0).to(at::kFloat); // [N]
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0);
  };

  loss_terms out;
  const at::Tensor pg = aggregate(pg_tok);
  at::Tensor kl;
  if (ref_logp.defined()) {
    // k3 = exp(d) − d − 1 with d = ref − new: unbiased for KL(π_new ‖ π_ref) under samples from
    // π_new and never negative (exp(d) ≥ 1 + d).
    const at::Tensor d =
      at::where(trained, ref_logp.detach() - new_logp, zeros).clamp_max(max_log_ratio);
    kl = aggregate(d.exp() - d - 1.0);
  }
  out.loss = (ref_logp.defined() && opt.kl_coef > 0.0) ? pg + opt.kl_coef * kl : pg;

  at::NoGradGuard no_grad;
  const double n_tokens = tokens.item<double>();
  out.tokens = static_cast<std::int64_t>(n_tokens);
  out.pg_loss = pg.item<double>();
  out.kl = kl.defined() ? kl.item<double>() : 0.0;
  if (out.tokens > 0) {
    out.clip_frac_low = clipped_low.sum().item<double>() / n_tokens;
    out.clip_frac_high = clipped_high.sum().item<double>() / n_tokens;
    out.ratio_mean = (ratio * weight).sum().item<double>() / n_tokens;
    // Untrained positions hold ratio 1 (their log-ratio was zeroed); set them to 0, below any
    // real ratio, so that they can't pose as the max when every trained ratio is < 1.
    out.ratio_max = at::where(trained, ratio, zeros).max().item<double>();
  } else {
    out.ratio_mean = 1.0;
    out.ratio_max = 1.0;
  }
  return out;
}

at::Tensor tis_weights(const at::Tensor& old_logp, const at::Tensor& rollout_logp, double cap) {
  if (!old_logp.defined() || !rollout_logp.defined() || old_logp.sizes() != rollout_logp.sizes())
    throw std::invalid_argument("tis_weights: old_logp and rollout_logp must be defined tensors of one shape");
  if (!(cap >= 1.0) || !std::isfinite(cap))
    throw std::invalid_argument(fmt::format("tis_weights: cap must be >= 1 and finite, got {}", cap));
  at::NoGradGuard no_grad;
  // An overflowing exp is +inf, which the cap brings back to exactly `cap`.
  return (old_logp.detach() - rollout_logp.detach()).exp().clamp_max(cap);
}

} // namespace sorl::learner
