// Advantages, overlong shaping and the clipped loss against values worked out by hand.

#include "actors/learner/grpo.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <vector>

using namespace sorl::learner;

namespace {

/// [rows, cols] fp32 from a row-major list.
at::Tensor mat(std::vector<float> v, std::int64_t rows, std::int64_t cols) {
  return at::tensor(v, at::kFloat).view({rows, cols}).clone();
}

at::Tensor vec(std::vector<float> v) {
  return at::tensor(v, at::kFloat);
}

loss_options opts(loss_norm norm = loss_norm::token) {
  loss_options o;
  o.clip_eps_low = 0.2;
  o.clip_eps_high = 0.28;
  o.kl_coef = 0.0;
  o.norm = norm;
  return o;
}

} // namespace

TEST_CASE("an all-equal group gets exactly zero advantages, never NaN") {
  for (const bool scale : {true, false}) {
    for (const auto& rewards : {std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f},
                                std::vector<float>{0.0f, 0.0f}, std::vector<float>{1e30f, 1e30f}}) {
      const auto a = group_advantages(rewards, scale);
      REQUIRE(a.size() == rewards.size());
      for (const float x : a)
        CHECK(x == 0.0f); // exact, and NaN would fail this too
    }
  }
  // Even with eps 0, where (r − mean) / std would be 0 / 0.
  for (const float x : group_advantages({2.0f, 2.0f, 2.0f}, true, 0.0))
    CHECK(x == 0.0f);
  CHECK_FALSE(has_signal({0.5f, 0.5f, 0.5f}));
}

TEST_CASE("a group of one gets zero advantage") {
  CHECK(group_advantages({3.0f}, true) == std::vector<float>{0.0f});
  CHECK(group_advantages({-7.0f}, false) == std::vector<float>{0.0f});
  CHECK(group_advantages({}, true).empty());
  CHECK_FALSE(has_signal({3.0f}));
  CHECK_FALSE(has_signal({}));
}

TEST_CASE("mixed rewards give the hand-computed advantages") {
  // {1, 0, 0, 1}: mean 0.5, population std 0.5 → ±0.5 / (0.5 + 1e-6) = ±0.999998.
  auto a = group_advantages({1.0f, 0.0f, 0.0f, 1.0f}, true);
  CHECK(a[0] == Approx(0.999998).epsilon(1e-7));
  CHECK(a[1] == Approx(-0.999998).epsilon(1e-7));
  CHECK(a[2] == Approx(-0.999998).epsilon(1e-7));
  CHECK(a[3] == Approx(0.999998).epsilon(1e-7));

  // {1, 2, 3, 4}: mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25,
  // std 1.1180340 → A = {−1.5, −0.5, 0.5, 1.5} / 1.1180350 = {−1.3416396, −0.4472132, ...}.
  a = group_advantages({1.0f, 2.0f, 3.0f, 4.0f}, true);
  CHECK(a[0] == Approx(-1.3416396).epsilon(1e-6));
  CHECK(a[1] == Approx(-0.4472132).epsilon(1e-6));
  CHECK(a[2] == Approx(0.4472132).epsilon(1e-6));
  CHECK(a[3] == Approx(1.3416396).epsilon(1e-6));

  // {0, 0, 0, 1}: mean 0.25, variance (3 · 0.0625 + 0.5625) / 4 = 0.1875, std 0.4330127
  // → {−0.25, −0.25, −0.25, 0.75} / 0.4330137 = {−0.5773489 ×3, 1.7320468}.
  a = group_advantages({0.0f, 0.0f, 0.0f, 1.0f}, true);
  CHECK(a[0] == Approx(-0.5773489).epsilon(1e-6));
  CHECK(a[2] == Approx(-0.5773489).epsilon(1e-6));
  CHECK(a[3] == Approx(1.7320468).epsilon(1e-6));

  // Dr. GRPO: only the mean is removed, exactly.
  a = group_advantages({1.0f, 2.0f, 3.0f, 4.0f}, false);
  CHECK(a == std::vector<float>{-1.5f, -0.5f, 0.5f, 1.5f});
  CHECK(has_signal({1.0f, 2.0f}));
}

TEST_CASE("a non-finite reward is rejected naming its index") {
  const std::vector<float> bad{0.0f, 1.0f, std::nanf(""), 1.0f};
  CHECK_THROWS_WITH(group_advantages(bad, true), Catch::Contains("index 2"));
  CHECK_THROWS_AS(has_signal({INFINITY}), std::invalid_argument);
  CHECK_THROWS_AS(group_advantages({1.0f, 2.0f}, true, -1.0), std::invalid_argument);
}

TEST_CASE("the DAPO overlong penalty follows eq. 13") {
  // L_max 20, L_cache 4: free up to 16 tokens, then a linear ramp to −1 at 20, −1 beyond.
  CHECK(overlong_penalty(0, 20, 4) == 0.0f);
  CHECK(overlong_penalty(16, 20, 4) == 0.0f);
  CHECK(overlong_penalty(17, 20, 4) == -0.25f);
  CHECK(overlong_penalty(18, 20, 4) == -0.5f);
  CHECK(overlong_penalty(20, 20, 4) == -1.0f);
  CHECK(overlong_penalty(25, 20, 4) == -1.0f);
  // No cache: a hard step at L_max.
  CHECK(overlong_penalty(20, 20, 0) == 0.0f);
  CHECK(overlong_penalty(21, 20, 0) == -1.0f);
  CHECK_THROWS_AS(overlong_penalty(-1, 20, 4), std::invalid_argument);
  CHECK_THROWS_AS(overlong_penalty(5, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(overlong_penalty(5, 20, 21), std::invalid_argument);
}

TEST_CASE("clipping binds on both sides and stops the gradient there") {
  // Sequence 0 (A = +1): ratios 1.5 (above 1 + 0.28: clipped) and 1.1 (free).
  // Sequence 1 (A = −1): ratios 0.5 (below 1 − 0.2: clipped) and 0.9 (free).
  // Token losses −min(ρA, clip(ρ)A): −1.28, −1.1, +0.8, +0.9; token mean −0.68 / 4 = −0.17.
  const at::Tensor old_logp = mat({-1.0f, -2.0f, -0.5f, -1.5f}, 2, 2);
  const at::Tensor log_ratio =
    mat({std::log(1.5f), std::log(1.1f), std::log(0.5f), std::log(0.9f)}, 2, 2);
  const at::Tensor new_logp = (old_logp + log_ratio).detach().requires_grad_(true);
  const at::Tensor adv = vec({1.0f, -1.0f});
  const at::Tensor mask = at::ones({2, 2}, at::kFloat);

  const loss_terms t = policy_loss(new_logp, old_logp, adv, mask, at::Tensor(), opts());
  CHECK(t.loss.item<double>() == Approx(-0.17).epsilon(1e-6));
  CHECK(t.pg_loss == Approx(-0.17).epsilon(1e-6));
  CHECK(t.kl == 0.0);
  CHECK(t.clip_frac_high == 0.25);
  CHECK(t.clip_frac_low == 0.25);
  CHECK(t.ratio_mean == Approx(1.0).epsilon(1e-6)); // (1.5 + 1.1 + 0.5 + 0.9) / 4
  CHECK(t.ratio_max == Approx(1.5).epsilon(1e-6));
  CHECK(t.tokens == 4);

  t.loss.backward();
  const at::Tensor g = new_logp.grad();
  // d(−ρA)/d new_logp = −ρA, over 4 tokens; exactly 0 where clipped.
  CHECK(g[0][0].item<float>() == 0.0f);
  CHECK(g[1][0].item<float>() == 0.0f);
  CHECK(g[0][1].item<double>() == Approx(-1.1 / 4).epsilon(1e-6));
  CHECK(g[1][1].item<double>() == Approx(0.9 / 4).epsilon(1e-6));
}

TEST_CASE("clipping binds only in the direction the advantage pushes") {
  // A < 0 with ρ = 1.5 and A > 0 with ρ = 0.5 are outside the range but not clipped (the
  // pessimistic min keeps the unclipped term): losses +1.5 and −0.5, both with gradient.
  const at::Tensor old_logp = mat({-1.0f, -1.0f}, 2, 1);
  const at::Tensor new_logp =
    (old_logp + mat({std::log(1.5f), std::log(0.5f)}, 2, 1)).detach().requires_grad_(true);
  const loss_terms t = policy_loss(new_logp, old_logp, vec({-1.0f, 1.0f}),
                                   at::ones({2, 1}, at::kFloat), at::Tensor(), opts());
  CHECK(t.pg_loss == Approx((1.5 - 0.5) / 2).epsilon(1e-6));
  CHECK(t.clip_frac_low == 0.0);
  CHECK(t.clip_frac_high == 0.0);
  t.loss.backward();
  CHECK(new_logp.grad()[0][0].item<double>() == Approx(1.5 / 2).epsilon(1e-6));
  CHECK(new_logp.grad()[1][0].item<double>() == Approx(-0.5 / 2).epsilon(1e-6));
}

TEST_CASE("token- and sequence-level normalisation differ on responses of different lengths") {
  // Sequence 0: one trained token, ρ = 1, A = 2 → loss −2.
  // Sequence 1: three trained tokens, ρ = 1.1, 1.2, 1.0, A = −1 → losses 1.1, 1.2, 1.0.
  // Sequence 2: nothing trained (e.g. overlong-filtered), garbage and NaN in its log-probs.
  // Token level:    (−2 + 3.3) / 4 = 0.325.
  // Sequence level: mean(−2, 3.3 / 3) = mean(−2, 1.1) = −0.45; sequence 2 is not counted.
  const float nan = std::nanf("");
  const at::Tensor old_logp = mat({-1, 0, 0, -1, -1, -1, nan, 0, 0}, 3, 3);
  const at::Tensor new_logp =
    mat({-1, 0, 0, -1 + std::log(1.1f), -1 + std::log(1.2f), -1, 100, nan, 0}, 3, 3)
      .requires_grad_(true);
  const at::Tensor mask = mat({1, 0, 0, 1, 1, 1, 0, 0, 0}, 3, 3);
  const at::Tensor adv = vec({2.0f, -1.0f, 5.0f});

  const loss_terms tok = policy_loss(new_logp, old_logp, adv, mask, at::Tensor(), opts());
  CHECK(tok.loss.item<double>() == Approx(0.325).epsilon(1e-6));
  CHECK(tok.tokens == 4);
  tok.loss.backward();
  at::Tensor g = new_logp.grad().clone();
  CHECK(g[0][0].item<double>() == Approx(-2.0 / 4).epsilon(1e-6));
  CHECK(g[1][0].item<double>() == Approx(1.1 / 4).epsilon(1e-6)); // −ρA / tokens
  CHECK(g[1][1].item<double>() == Approx(1.2 / 4).epsilon(1e-6));
  CHECK(g[2].abs().sum().item<float>() == 0.0f); // untrained: no gradient, and no NaN
  CHECK(g[0][1].item<float>() == 0.0f);

  new_logp.mutable_grad() = at::Tensor();
  const loss_terms seq =
    policy_loss(new_logp, old_logp, adv, mask, at::Tensor(), opts(loss_norm::sequence));
  CHECK(seq.loss.item<double>() == Approx(-0.45).epsilon(1e-6));
  seq.loss.backward();
  g = new_logp.grad();
  CHECK(g[0][0].item<double>() == Approx(-2.0 / 1 / 2).epsilon(1e-6));
  CHECK(g[1][0].item<double>() == Approx(1.1 / 3 / 2).epsilon(1e-6)); // −ρA / |o_i| / sequences
  CHECK(g[1][1].item<double>() == Approx(1.2 / 3 / 2).epsilon(1e-6));
  CHECK(g[2].abs().sum().item<float>() == 0.0f);
}

TEST_CASE("the k3 KL estimator gives its hand-computed value and gradient") {
  // π_new = 0.5, π_ref = 0.25: d = ln 0.25 − ln 0.5 = −ln 2, k3 = e^d − d − 1 = 0.5 + ln 2 − 1
  // = 0.1931472. With A = 0 the loss is kl_coef · k3; d k3 / d new = 1 − e^d = 0.5.
  loss_options o = opts();
  o.kl_coef = 0.1;
  const at::Tensor new_logp = mat({std::log(0.5f)}, 1, 1).requires_grad_(true);
  const at::Tensor ref_logp = mat({std::log(0.25f)}, 1, 1);
  const loss_terms t =
    policy_loss(new_logp, new_logp.detach(), vec({0.0f}), at::ones({1, 1}), ref_logp, o);
  CHECK(t.kl == Approx(0.1931472).epsilon(1e-6));
  CHECK(t.pg_loss == 0.0);
  CHECK(t.loss.item<double>() == Approx(0.01931472).epsilon(1e-6));
  t.loss.backward();
  CHECK(new_logp.grad()[0][0].item<double>() == Approx(0.05).epsilon(1e-6));

  // Equal policies: zero KL. kl_coef > 0 without a reference is a caller error.
  const loss_terms same =
    policy_loss(ref_logp, ref_logp, vec({0.0f}), at::ones({1, 1}), ref_logp, o);
  CHECK(same.kl == 0.0);
  CHECK_THROWS_AS(policy_loss(ref_logp, ref_logp, vec({0.0f}), at::ones({1, 1}), at::Tensor(), o),
                  std::invalid_argument);
}

TEST_CASE("k3 KL with ref − new = 89 stays finite: the value at the bound, no gradient beyond it") {
  // Uncapped, e^89 overflows fp32 and the loss and its gradient are inf. Capped at
  // max_log_ratio = 20: k3 = e^20 − 20 − 1 = 485165174.41, loss = 0.1 · k3 (A = 0, one token),
  // and the capped term is constant, so its gradient is exactly 0.
  REQUIRE(max_log_ratio == 20.0);
  const double k3_at_bound = std::exp(20.0) - 21.0;
  loss_options o = opts();
  o.kl_coef = 0.1;
  const at::Tensor new_logp = mat({-90.0f}, 1, 1).requires_grad_(true);
  const at::Tensor ref_logp = mat({-1.0f}, 1, 1);
  const loss_terms t =
    policy_loss(new_logp, new_logp.detach(), vec({0.0f}), at::ones({1, 1}), ref_logp, o);
  CHECK(std::isfinite(t.kl));
  CHECK(t.kl == Approx(k3_at_bound).epsilon(1e-6));
  CHECK(t.loss.item<double>() == Approx(0.1 * k3_at_bound).epsilon(1e-6));
  t.loss.backward();
  CHECK(new_logp.grad()[0][0].item<float>() == 0.0f);

  // Just inside the bound (d = 19) the term and its gradient are exact: d k3 / d new
  // = 1 − e^19, times kl_coef.
  const at::Tensor inside = mat({-20.0f}, 1, 1).requires_grad_(true);
  const loss_terms u =
    policy_loss(inside, inside.detach(), vec({0.0f}), at::ones({1, 1}), ref_logp, o);
  CHECK(u.kl == Approx(std::exp(19.0) - 20.0).epsilon(1e-6));
  u.loss.backward();
  CHECK(inside.grad()[0][0].item<double>() == Approx(0.1 * (1.0 - std::exp(19.0))).epsilon(1e-6));

  // The lower side is not capped: d = −89 gives k3 = e^-89 + 89 − 1 = 88 and gradient
  // kl_coef · (1 − e^-89) = 0.1.
  const at::Tensor above = mat({-1.0f}, 1, 1).requires_grad_(true);
  const loss_terms v = policy_loss(above, above.detach(), vec({0.0f}), at::ones({1, 1}),
                                   mat({-90.0f}, 1, 1), o);
  CHECK(v.kl == Approx(88.0).epsilon(1e-6));
  v.loss.backward();
  CHECK(above.grad()[0][0].item<double>() == Approx(0.1).epsilon(1e-6));
}

TEST_CASE("an importance ratio of e^89 is capped at e^20: finite loss and gradient for either advantage") {
  const double cap = std::exp(20.0);
  const at::Tensor old_logp = mat({-90.0f, -90.0f}, 2, 1);
  const at::Tensor new_logp = mat({-1.0f, -1.0f}, 2, 1).requires_grad_(true);
  // Sequence 0, A = −1: the unclipped branch −ρA = ρ = e^20 (uncapped: inf). Sequence 1,
  // A = +1: clipped at 1 + ε_high, constant −1.28 (uncapped its gradient was inf · 0 = NaN).
  // Sequence-level mean: (e^20 − 1.28) / 2.
  const loss_terms t = policy_loss(new_logp, old_logp, vec({-1.0f, 1.0f}), at::ones({2, 1}),
                                   at::Tensor(), opts(loss_norm::sequence));
  CHECK(t.loss.item<double>() == Approx((cap - 1.28) / 2).epsilon(1e-6));
  CHECK(t.ratio_max == Approx(cap).epsilon(1e-6));
  t.loss.backward();
  const at::Tensor g = new_logp.grad();
  CHECK(g[0][0].item<float>() == 0.0f); // beyond the cap the term is constant
  CHECK(g[1][0].item<float>() == 0.0f); // clipped
  CHECK(at::isfinite(g).all().item<bool>());

  // At log-ratio 19 (inside the cap), A = −1: loss ρ = e^19 and gradient ρ = e^19.
  const at::Tensor at19 = mat({-71.0f}, 1, 1).requires_grad_(true);
  const loss_terms u = policy_loss(at19, mat({-90.0f}, 1, 1), vec({-1.0f}), at::ones({1, 1}),
                                   at::Tensor(), opts());
  CHECK(u.loss.item<double>() == Approx(std::exp(19.0)).epsilon(1e-6));
  u.loss.backward();
  CHECK(at19.grad()[0][0].item<double>() == Approx(std::exp(19.0)).epsilon(1e-6));
}

TEST_CASE("with no trained token the loss is an exact zero that still backpropagates") {
  const at::Tensor new_logp = mat({-1.0f, -2.0f}, 1, 2).requires_grad_(true);
  const loss_terms t = policy_loss(new_logp, new_logp.detach() - 1.0, vec({1.0f}),
                                   at::zeros({1, 2}), at::Tensor(), opts(loss_norm::sequence));
  CHECK(t.loss.item<float>() == 0.0f);
  CHECK(t.tokens == 0);
  CHECK(t.ratio_mean == 1.0);
  t.loss.backward();
  CHECK(new_logp.grad().abs().sum().item<float>() == 0.0f);
}

TEST_CASE("policy_loss rejects mismatched shapes and bad options") {
  const at::Tensor a = at::zeros({2, 3});
  CHECK_THROWS_AS(policy_loss(a, at::zeros({2, 2}), vec({0, 0}), a, at::Tensor(), opts()),
                  std::invalid_argument);
  CHECK_THROWS_AS(policy_loss(a, a, vec({0, 0, 0}), a, at::Tensor(), opts()),
                  std::invalid_argument);
  CHECK_THROWS_AS(policy_loss(a, a.to(at::kDouble), vec({0, 0}), a, at::Tensor(), opts()),
                  std::invalid_argument);
  loss_options bad = opts();
  bad.clip_eps_low = 1.0;
  CHECK_THROWS_AS(policy_loss(a, a, vec({0, 0}), a, at::Tensor(), bad), std::invalid_argument);
}
