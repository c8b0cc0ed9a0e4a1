// Exactly on-policy learning: the learner scores the weights the rollout workers sample with
// (the bf16 image of its fp32 master, straight-through gradient), π_old from the rollout's own
// log-probs without a recompute pass, the mismatch figures, and truncated importance sampling.

#include "actors/learner/learner_core.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "tests/ml/policy_test_util.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

using namespace sorl;
using namespace sorl::learner;

namespace {

ml::model_dims dims() {
  return ml::test::small_dims();
}

/// A model whose fp32 weights lie on the bf16 grid, as a pretrained bf16 checkpoint loads:
/// before any update the fp32 and the bf16 forward see the same values.
ml::policy_model on_grid_model(std::uint64_t seed) {
  ml::policy_model m(dims(), seed, /*init_std=*/0.1);
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : m.parameters())
    t.copy_(t.to(at::kBFloat16).to(at::kFloat));
  return m;
}

std::vector<std::int32_t> prompt_of(std::uint32_t salt) {
  std::vector<std::int32_t> out;
  std::uint32_t x = salt * 2654435761u + 12345u;
  for (int i = 0; i < 6; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<std::int32_t>((x >> 8) % 40u));
  }
  return out;
}

/// What a rollout worker does with the weights the sync publishes: the bf16 rounding of the
/// master (clone(kBFloat16) casts exactly as learner_service::snapshot does), 4 groups of 4
/// samples at temperature 0.7 through the batched generator with its KV cache, each token's
/// sampling log-prob as the worker reports it. Rewards: 1 for an even first token.
std::vector<rollout_sample> rollouts(const ml::policy_model& master, std::uint64_t seed) {
  const ml::policy_model worker = master.clone(at::kBFloat16);
  ml::generator gen(worker);
  ml::sampling_params sp;
  sp.temperature = 0.7;
  sp.max_new_tokens = 10;
  std::map<std::uint64_t, std::vector<std::int32_t>> prompts; // by request id
  for (std::uint32_t g = 0; g < 4; ++g) {
    const auto prompt = prompt_of(g + 10 * static_cast<std::uint32_t>(seed));
    sp.seed = seed * 100 + g;
    prompts[gen.submit(prompt, sp, /*group_size=*/4)] = prompt;
  }
  std::vector<rollout_sample> batch;
  for (const auto& r : gen.run_until_idle()) {
    rollout_sample s;
    s.group_id = r.request_id;
    s.prompt = prompts.at(r.request_id);
    s.response = r.tokens;
    s.loss_mask.assign(r.tokens.size(), 1);
    s.sampling_logprobs = r.logprobs;
    s.reward = r.tokens.front() % 2 == 0 ? 1.0f : 0.0f;
    batch.push_back(std::move(s));
  }
  return batch;
}

learner_options options(forward_weights w) {
  learner_options o;
  o.lr = 1e-3; // AdamW moves each weight ~1e-3 a step: several bf16 ulps of a 0.1 weight
  o.temperature = 0.7;
  o.weights = w;
  o.old_logprobs = old_logprob_source::recompute;
  return o;
}

/// Share of the master's elements that are not on the bf16 grid.
double off_grid_share(const ml::policy_model& m) {
  double off = 0.0, all = 0.0;
  for (const auto& [name, t] : m.parameters()) {
    const at::Tensor d = t.detach();
    off += d.ne(d.to(at::kBFloat16).to(at::kFloat)).sum().item<double>();
    all += static_cast<double>(d.numel());
  }
  return off / all;
}

} // namespace

TEST_CASE("after updates move the master off the bf16 grid the learner still scores the rollouts' "
          "own log-probs, and the fp32 learner does not") {
  at::set_num_threads(1);
  // Tolerances: the rollout's log-probs come from the cached decode (a prompt prefill, then
  // one row per token, oneDNN or BLAS GEMMs), the learner's from one full forward; on the same
  // weights they differ only in the last bits of fp32 logits, ~1e-6 nats.
  constexpr double mean_tol = 1e-5, max_tol = 1e-4;
  ml::policy_model exact = on_grid_model(5), drifting = on_grid_model(5);
  learner_core le(exact, options(forward_weights::bf16), 1);
  learner_core ld(drifting, options(forward_weights::fp32), 1);
  for (std::uint64_t step = 0; step < 4; ++step) {
    INFO("step " << step + 1);
    const step_metrics me = le.train_step(rollouts(exact, step + 1));
    const step_metrics md = ld.train_step(rollouts(drifting, step + 1));
    REQUIRE(me.updates == 1);
    REQUIRE(me.mismatch_tokens == me.tokens_trained);
    CHECK(me.mismatch_mean <= mean_tol);
    CHECK(me.mismatch_max <= max_tol);
    CHECK(me.token_mult_prob_error == Approx(1.0).margin(mean_tol));
    CHECK(std::abs(me.mismatch_k3) <= 1e-9);
    if (step == 0) { // both start on the grid: the fp32 learner is exact too, once
      CHECK(md.mismatch_mean <= mean_tol);
    } else { // the master it differentiates has left what the workers sample with
      CHECK(md.mismatch_mean > 10 * mean_tol);
      CHECK(md.mismatch_max > max_tol);
    }
  }
  // Not vacuous: most of the master is off the grid, and the two learners' masters differ.
  CHECK(off_grid_share(exact) > 0.5);
  CHECK(off_grid_share(drifting) > 0.5);
}

TEST_CASE("the straight-through gradient is the gradient at the bf16-rounded weights, bit for bit") {
  at::set_num_threads(1);
  ml::policy_model master(dims(), 9, 0.1); // fp32 init: off the grid
  master.set_requires_grad(true);
  master.set_bf16_compute(true);
  REQUIRE(master.bf16_compute());
  // The reference: an fp32 model holding the rounded weights, differentiated by plain autograd.
  ml::policy_model rounded = master.clone(at::kBFloat16).clone(at::kFloat);
  REQUIRE_FALSE(rounded.bf16_compute());
  rounded.set_requires_grad(true);
  const auto batch = rollouts(master, 3);
  const at::Tensor w = at::arange(1, 11, at::kFloat).div(10.0); // per-position weights
  auto objective = [&](const ml::policy_model& m) {
    const at::Tensor lp = response_logprobs_tensor(m, batch, 0.7);
    return (lp.narrow(1, 0, std::min<std::int64_t>(lp.size(1), 10)) * w.narrow(0, 0, std::min<std::int64_t>(lp.size(1), 10))).sum();
  };
  const at::Tensor la = objective(master), lb = objective(rounded);
  CHECK(la.item<float>() == lb.item<float>());
  la.backward();
  lb.backward();
  const auto& pa = master.parameters();
  const auto& pb = rounded.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    REQUIRE(pa[i].second.grad().defined());
    CHECK(at::equal(pa[i].second.grad(), pb[i].second.grad()));
  }
  // The master's own (fp32) gradient differs: the test would catch a view that is not used.
  ml::policy_model plain = master.clone(at::kFloat);
  plain.set_bf16_compute(false);
  plain.set_requires_grad(true);
  objective(plain).backward();
  bool any_differs = false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    any_differs = any_differs || !at::equal(plain.parameters()[i].second.grad(), pa[i].second.grad());
  CHECK(any_differs);
  // An update of the master reaches the next forward: the image is rebuilt.
  const at::Tensor before = objective(master).detach();
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : master.parameters())
      t.add_(t.sign() * 0.01); // several bf16 ulps of every weight
  }
  CHECK_FALSE(at::equal(before, objective(master).detach()));
}

TEST_CASE("with the rollout's log-probs as pi_old the recompute pass is skipped and, when both "
          "sides agree, the updates are the recompute path's bit for bit") {
  at::set_num_threads(1);
  for (const auto& [epochs, minibatches] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {1, 3}}) {
    INFO("epochs " << epochs << ", minibatches " << minibatches);
    ml::policy_model a = on_grid_model(21), b = on_grid_model(21);
    learner_options oa = options(forward_weights::bf16);
    oa.epochs = epochs;
    oa.minibatches = minibatches;
    oa.old_logprobs = old_logprob_source::rollout;
    learner_options ob = oa;
    ob.old_logprobs = old_logprob_source::recompute;
    learner_core la(a, oa, 4), lb(b, ob, 4);
    for (std::uint64_t step = 0; step < 2; ++step) {
      auto batch = rollouts(a, 7 + step);
      // The learner's own log-probs as the sampling ones: both sides agree exactly, so the
      // only difference left between the paths is where π_old comes from.
      const auto lp = response_logprobs(a, batch, 0.7);
      for (std::size_t i = 0; i < batch.size(); ++i)
        batch[i].sampling_logprobs = lp[i];
      const step_metrics ma = la.train_step(batch);
      const step_metrics mb = lb.train_step(batch);
      const std::int64_t updates = static_cast<std::int64_t>(epochs) * minibatches;
      CHECK(ma.updates == updates);
      CHECK(mb.updates == updates);
      // One forward per update (each minibatch fits one micro-batch), plus the recompute pass
      // unless the single update's forward doubles as it.
      CHECK(ma.forwards == updates);
      CHECK(mb.forwards == (updates == 1 ? 1 : updates + 1));
      CHECK(ma.loss == mb.loss);
      CHECK(ma.ratio_max == mb.ratio_max);
      CHECK(mb.mismatch_mean == 0.0);
      CHECK(mb.mismatch_bitwise == 1.0);
      CHECK(mb.mismatch_tokens == mb.tokens_trained);
      // The rollout path measures the forwards before the first update: the first minibatch.
      if (minibatches == 1)
        CHECK(ma.mismatch_tokens == ma.tokens_trained);
      else
        CHECK(ma.mismatch_tokens < ma.tokens_trained);
      CHECK(ma.mismatch_tokens > 0);
      CHECK(ma.mismatch_mean <= 1e-6); // a minibatch's own forward, rows of another batch
      for (std::size_t i = 0; i < a.parameters().size(); ++i) {
        INFO(a.parameters()[i].first);
        REQUIRE(at::equal(a.parameters()[i].second, b.parameters()[i].second));
      }
    }
  }
}

TEST_CASE("the mismatch figures of a hand-made gap") {
  at::set_num_threads(1);
  ml::policy_model m = on_grid_model(2);
  learner_core l(m, options(forward_weights::bf16), 1);
  auto batch = rollouts(m, 5);
  const auto lp = response_logprobs(m, batch, 0.7);
  for (std::size_t i = 0; i < batch.size(); ++i)
    batch[i].sampling_logprobs = lp[i];
  // One token's rollout log-prob 0.25 nats below the learner's, every other equal.
  batch[2].sampling_logprobs[0] -= 0.25f;
  const double gap = static_cast<double>(lp[2][0]) - static_cast<double>(batch[2].sampling_logprobs[0]);
  const step_metrics s = l.train_step(batch);
  const auto n = static_cast<double>(s.tokens_trained);
  REQUIRE(s.mismatch_tokens == s.tokens_trained);
  CHECK(s.mismatch_mean == Approx(gap / n).epsilon(1e-12));
  CHECK(s.mismatch_max == Approx(gap).epsilon(1e-12));
  CHECK(s.mismatch_k3 == Approx((std::expm1(gap) - gap) / n).epsilon(1e-9));
  CHECK(s.token_mult_prob_error == Approx((n - 1 + std::exp(gap)) / n).epsilon(1e-12));
  CHECK(s.mismatch_bitwise == Approx((n - 1) / n).epsilon(1e-12));
}

TEST_CASE("truncated importance sampling weighs each token by min(pi_old / pi_rollout, C)") {
  // By hand: one sequence of 3 trained tokens, new = old (ratio 1), A = 2, token-level
  // normalisation. old − rollout = [log 0.5, log 3, 0] → w = [0.5, min(3, 2) = 2, 1].
  const at::Tensor old_lp = at::tensor({-1.0f, -2.0f, -0.5f}).view({1, 3});
  const at::Tensor rollout = old_lp - at::tensor({std::log(0.5f), std::log(3.0f), 0.0f}).view({1, 3});
  const at::Tensor w = tis_weights(old_lp, rollout, 2.0);
  CHECK(w[0][0].item<float>() == Approx(0.5f).epsilon(1e-6));
  CHECK(w[0][1].item<float>() == 2.0f); // capped exactly
  CHECK(w[0][2].item<float>() == 1.0f);
  // An overflowing ratio is the cap, not inf.
  CHECK(tis_weights(at::full({1, 1}, 0.0f), at::full({1, 1}, -200.0f), 2.0)[0][0].item<float>() == 2.0f);
  CHECK_THROWS_AS(tis_weights(old_lp, rollout, 0.5), std::invalid_argument);

  const at::Tensor new_lp = old_lp.clone().requires_grad_(true);
  loss_options lo;
  const loss_terms t = policy_loss(new_lp, old_lp, at::tensor({2.0f}), at::ones({1, 3}), at::Tensor(), lo, w);
  // ℓ = −Σ w_t ρ_t A / 3 = −(0.5 + 2 + 1) · 2 / 3 = −7/3.
  CHECK(t.loss.item<double>() == Approx(-7.0 / 3.0).epsilon(1e-6));
  t.loss.backward();
  // ∂ℓ/∂new_t = −w_t ρ_t A / 3.
  const at::Tensor g = new_lp.grad();
  CHECK(g[0][0].item<double>() == Approx(-1.0 / 3.0).epsilon(1e-6));
  CHECK(g[0][1].item<double>() == Approx(-4.0 / 3.0).epsilon(1e-6));
  CHECK(g[0][2].item<double>() == Approx(-2.0 / 3.0).epsilon(1e-6));
}

TEST_CASE("truncated importance sampling in a train step reports its weights and needs the "
          "recompute") {
  at::set_num_threads(1);
  ml::policy_model m = on_grid_model(8);
  learner_options o = options(forward_weights::bf16);
  o.tis_cap = 2.0;
  learner_core l(m, o, 1);
  auto batch = rollouts(m, 9);
  const auto lp = response_logprobs(m, batch, 0.7);
  for (std::size_t i = 0; i < batch.size(); ++i)
    batch[i].sampling_logprobs = lp[i];
  // One token the rollout found 3× less likely than the learner does (weight capped at 2),
  // one 2× more likely (weight 0.5); every other weight is 1.
  batch[0].sampling_logprobs[0] -= std::log(3.0f);
  batch[1].sampling_logprobs[0] += std::log(2.0f);
  const step_metrics s = l.train_step(batch);
  const auto n = static_cast<double>(s.tokens_trained);
  CHECK(s.tis_weight_mean == Approx((n - 2 + 2.0 + 0.5) / n).epsilon(1e-6));
  CHECK(s.tis_capped_frac == Approx(1.0 / n).epsilon(1e-12));

  learner_options bad = o;
  bad.old_logprobs = old_logprob_source::rollout;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("tis_cap needs old_logprobs = recompute"));
  bad = o;
  bad.tis_cap = 0.5;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("tis_cap"));
}

TEST_CASE("with one update over several micro-batches the update's forwards are the recompute "
          "pass, bit for bit") {
  at::set_num_threads(1);
  // The reference runs the separate no-grad pass: truncated IS needs π_old of the whole batch
  // first. A cap of 1 against rollout log-probs far below the learner's weighs every token by
  // exactly 1, so only where π_old comes from differs.
  ml::policy_model a = on_grid_model(31), b = on_grid_model(31);
  learner_options oa = options(forward_weights::bf16);
  oa.old_logprobs = old_logprob_source::recompute;
  oa.micro_batch_tokens = 40; // several micro-batches
  learner_options ob = oa;
  ob.tis_cap = 1.0;
  learner_core la(a, oa, 4), lb(b, ob, 4);
  for (std::uint64_t step = 0; step < 2; ++step) {
    auto batch = rollouts(a, 3 + step);
    for (auto& s : batch)
      for (float& lp : s.sampling_logprobs)
        lp = -100.0f;
    const step_metrics ma = la.train_step(batch);
    const step_metrics mb = lb.train_step(batch);
    REQUIRE(ma.updates == 1);
    CHECK(ma.forwards > 1);
    CHECK(mb.forwards == 2 * ma.forwards); // the recompute pass runs the same micro-batches
    CHECK(mb.tis_weight_mean == 1.0);
    CHECK(ma.loss == mb.loss);
    CHECK(ma.ratio_mean == 1.0);
    CHECK(ma.ratio_max == 1.0);
    CHECK(ma.mismatch_tokens == ma.tokens_trained);
    // The same values, summed micro-batch by micro-batch instead of over the whole batch.
    CHECK(ma.mismatch_mean == Approx(mb.mismatch_mean).epsilon(1e-12));
    CHECK(ma.entropy == Approx(mb.entropy).epsilon(1e-12));
    for (std::size_t i = 0; i < a.parameters().size(); ++i) {
      INFO(a.parameters()[i].first);
      REQUIRE(at::equal(a.parameters()[i].second, b.parameters()[i].second));
    }
  }
}
