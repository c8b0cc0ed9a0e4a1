// The learner's update step on a small policy model: direction of the update, mismatch metric,
// overlong handling, determinism and a bit-exact optimizer-state round trip.

#include "actors/learner/learner_core.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/formats/safetensors.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <iostream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace sorl;
using namespace sorl::learner;

namespace {

/// Small enough that a train step takes milliseconds.
ml::model_dims small_dims() {
  ml::model_dims d;
  d.vocab = 48;
  d.d_model = 32;
  d.n_layers = 2;
  d.n_heads = 4;
  d.n_kv_heads = 2;
  d.d_ff = 64;
  d.max_seq = 64;
  return d;
}

/// Deterministic pseudo-random token list (an LCG: no dependence on the standard library's RNG).
std::vector<std::int32_t> tokens(std::size_t n, std::int64_t vocab, std::uint32_t salt) {
  std::vector<std::int32_t> out;
  std::uint32_t x = salt * 2654435761u + 12345u;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab)));
  }
  return out;
}

rollout_sample sample(std::uint64_t group, std::vector<std::int32_t> prompt,
                      std::vector<std::int32_t> response, float reward) {
  rollout_sample s;
  s.group_id = group;
  s.prompt = std::move(prompt);
  s.response = std::move(response);
  s.loss_mask.assign(s.response.size(), 1);
  s.sampling_logprobs.assign(s.response.size(), 0.0f);
  s.reward = reward;
  return s;
}

/// `groups` groups of `group_size` samples; rewards alternate 1, 0 within a group; responses
/// of varying length (min_len .. min_len + 3).
std::vector<rollout_sample> synthetic_batch(int groups, int group_size, std::int64_t vocab,
                                            std::size_t prompt_len = 6, std::size_t min_len = 4) {
  std::vector<rollout_sample> batch;
  for (int g = 0; g < groups; ++g) {
    const auto prompt = tokens(prompt_len, vocab, 1000u + static_cast<std::uint32_t>(g));
    for (int k = 0; k < group_size; ++k) {
      const auto salt = static_cast<std::uint32_t>(g * 100 + k);
      batch.push_back(sample(static_cast<std::uint64_t>(g), prompt,
                             tokens(min_len + static_cast<std::size_t>(k % 4), vocab, salt),
                             k % 2 == 0 ? 1.0f : 0.0f));
    }
  }
  return batch;
}

double sum_logprob(const std::vector<float>& lp) {
  return std::accumulate(lp.begin(), lp.end(), 0.0);
}

bool same_weights(const ml::policy_model& a, const ml::policy_model& b) {
  const auto& pa = a.parameters();
  const auto& pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (!at::equal(pa[i].second, pb[i].second))
      return false;
  return true;
}

/// The batches here carry made-up sampling log-probs (0), so π_old is the learner's recompute;
/// tests/actors/learner/on_policy_test.cpp covers π_old from the rollout.
learner_options test_options() {
  learner_options o;
  o.old_logprobs = old_logprob_source::recompute;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  o.max_grad_norm = 1.0;
  o.loss.clip_eps_high = 0.28;
  return o;
}

} // namespace

TEST_CASE("a train step raises the log-prob of rewarded responses and lowers punished ones") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), /*seed=*/7);
  auto batch = synthetic_batch(/*groups=*/2, /*group_size=*/4, small_dims().vocab);
  const auto before = response_logprobs(model, batch);

  learner_core learner(model, test_options(), /*seed=*/1);
  const step_metrics m = learner.train_step(batch);
  const auto after = response_logprobs(model, batch);

  for (std::size_t i = 0; i < batch.size(); ++i) {
    INFO("sample " << i << " reward " << batch[i].reward);
    if (batch[i].reward > 0.5f)
      CHECK(sum_logprob(after[i]) > sum_logprob(before[i]));
    else
      CHECK(sum_logprob(after[i]) < sum_logprob(before[i]));
  }
  CHECK(m.samples == 8);
  CHECK(m.groups == 2);
  CHECK(m.zero_signal_groups == 0);
  CHECK(m.updates == 1);
  CHECK(m.skipped_updates == 0);
  CHECK(m.tokens_trained == 2 * (4 + 5 + 6 + 7));
  CHECK(m.reward_mean == 0.5);
  CHECK(m.advantage_abs_mean == Approx(0.999998).epsilon(1e-6)); // rewards {1, 0, 1, 0}
  CHECK(m.ratio_mean == Approx(1.0).epsilon(1e-5));              // the first update is on-policy
  CHECK(m.clip_frac_low == 0.0);
  CHECK(m.clip_frac_high == 0.0);
  CHECK(m.grad_norm > 0.0);
  CHECK(m.entropy > 0.0);
  CHECK(learner.step() == 1);
  CHECK(learner.optimizer_updates() == 1);
}

TEST_CASE("the mismatch is zero when sampling log-probs equal the model's") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 3);
  auto batch = synthetic_batch(2, 3, small_dims().vocab);
  // The learner first: it decides which weights the model's forwards see (the bf16 image).
  learner_core learner(model, test_options(), 1);
  const auto lp = response_logprobs(model, batch);
  for (std::size_t i = 0; i < batch.size(); ++i)
    batch[i].sampling_logprobs = lp[i];
  const step_metrics m = learner.train_step(batch);
  CHECK(m.mismatch_mean == 0.0);
  CHECK(m.mismatch_max == 0.0);

  // Shift one trained token's sampling log-prob by 0.5 nats: max 0.5, mean 0.5 / tokens.
  const auto lp2 = response_logprobs(model, batch);
  for (std::size_t i = 0; i < batch.size(); ++i)
    batch[i].sampling_logprobs = lp2[i];
  batch[1].sampling_logprobs[2] -= 0.5f;
  const step_metrics m2 = learner.train_step(batch);
  CHECK(m2.mismatch_max == Approx(0.5).epsilon(1e-6));
  CHECK(m2.mismatch_mean == Approx(0.5 / static_cast<double>(m2.tokens_trained)).epsilon(1e-6));

  // An environment token (loss_mask 0) doesn't count towards the mismatch.
  const auto lp3 = response_logprobs(model, batch);
  for (std::size_t i = 0; i < batch.size(); ++i)
    batch[i].sampling_logprobs = lp3[i];
  batch[0].loss_mask[1] = 0;
  batch[0].sampling_logprobs[1] += 3.0f;
  const step_metrics m3 = learner.train_step(batch);
  CHECK(m3.mismatch_max == 0.0);
  CHECK(m3.tokens_trained == m2.tokens_trained - 1);
}

TEST_CASE("overlong shaping lowers a long response's reward and filtering masks a truncated one") {
  at::set_num_threads(1);
  const auto vocab = small_dims().vocab;
  // Both responses earn 1; lengths 16 and 18 under L_max 20, L_cache 4: penalties 0 and −0.5.
  std::vector<rollout_sample> batch{sample(0, tokens(4, vocab, 1), tokens(16, vocab, 2), 1.0f),
                                    sample(0, tokens(4, vocab, 1), tokens(18, vocab, 3), 1.0f)};
  batch[1].truncated = true;

  learner_options o = test_options();
  // Without handling the group has no signal.
  CHECK(batch_advantages(batch, o) == std::vector<float>{0.0f, 0.0f});
  // Shaped rewards {1, 0.5}: mean 0.75, std 0.25 → ±0.25 / 0.250001 = ±0.999996.
  o.overlong = overlong_mode::shape;
  o.overlong_max_len = 20;
  o.overlong_cache_len = 4;
  auto a = batch_advantages(batch, o);
  CHECK(a[0] == Approx(0.999996).epsilon(1e-6));
  CHECK(a[1] == Approx(-0.999996).epsilon(1e-6));
  o.scale_advantages = false; // Dr. GRPO: ±0.25
  a = batch_advantages(batch, o);
  CHECK(a[0] == 0.25f);
  CHECK(a[1] == -0.25f);
  // Only generated tokens count towards the length: make 4 of the 18 environment tokens
  // (loss_mask 0, as in a multi-turn response) and 14 generated tokens earn no penalty.
  auto multi_turn = batch;
  for (std::size_t t = 4; t < 8; ++t)
    multi_turn[1].loss_mask[t] = 0;
  CHECK(batch_advantages(multi_turn, o) == std::vector<float>{0.0f, 0.0f});

  ml::policy_model model(small_dims(), 5);
  {
    learner_core learner(model, o, 1);
    const step_metrics m = learner.train_step(batch);
    CHECK(m.overlong_penalty_mean == -0.25);
    CHECK(m.zero_signal_groups == 0);
    CHECK(m.tokens_trained == 16 + 18);
    CHECK(m.overlong_filtered == 0);
  }

  // Filtering: the truncated sample's 18 tokens are not trained; its reward still counts in the
  // group statistics (here: no signal, so the lone trained sample has advantage 0).
  o.overlong = overlong_mode::filter;
  learner_core learner(model, o, 1);
  const step_metrics m = learner.train_step(batch);
  CHECK(m.overlong_filtered == 1);
  CHECK(m.tokens_trained == 16);
  CHECK(m.zero_signal_groups == 1);

  // A batch where only the truncated sample has tokens to train: nothing to update.
  std::vector<rollout_sample> only{batch[1]};
  const step_metrics none = learner.train_step(only);
  CHECK(none.tokens_trained == 0);
  CHECK(none.updates == 0);
  CHECK(none.skipped_updates == 1);
}

TEST_CASE("later minibatches are off-policy, so clipping can engage") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 11);
  auto batch = synthetic_batch(4, 4, small_dims().vocab);
  learner_options o = test_options();
  o.lr = 3e-2; // large steps, so that the ratio leaves [1 − ε_low, 1 + ε_high]
  o.epochs = 2;
  o.minibatches = 2;
  learner_core learner(model, o, 1);
  const step_metrics m = learner.train_step(batch);
  CHECK(m.updates == 4);
  CHECK(m.ratio_max > 1.0 + o.loss.clip_eps_high);
  CHECK(m.clip_frac_low + m.clip_frac_high > 0.0);
}

TEST_CASE("minibatch_rows cuts shuffled units into near-equal counts and keeps a unit's rows "
          "together") {
  using rows = std::vector<std::vector<std::int64_t>>;
  const rows singles{{0}, {1}, {2}, {3}, {4}};
  // One minibatch: every unit, in order, unshuffled.
  CHECK(minibatch_rows(singles, 1, 7, 0, 0) == rows{{0, 1, 2, 3, 4}});
  // Two: 5 units cut 2 + 3, together a permutation of the rows.
  const rows two = minibatch_rows(singles, 2, 7, 0, 0);
  REQUIRE(two.size() == 2);
  CHECK(two[0].size() == 2);
  CHECK(two[1].size() == 3);
  std::vector<std::int64_t> all = two[0];
  all.insert(all.end(), two[1].begin(), two[1].end());
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  // The same (seed, step, epoch) gives the same cut; 2 of 5 has 10 possible first halves, and
  // these three seeds' draws are not all the same one.
  CHECK(minibatch_rows(singles, 2, 7, 0, 0) == two);
  CHECK_FALSE((minibatch_rows(singles, 2, 8, 0, 0) == two && minibatch_rows(singles, 2, 7, 1, 0) == two &&
                minibatch_rows(singles, 2, 7, 0, 1) == two));
  // More minibatches than units: one unit each.
  CHECK(minibatch_rows(singles, 9, 7, 0, 0).size() == 5);

  // Groups of interleaved rows: 4 groups of 3 rows.
  const rows groups{{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}};
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    const rows mb = minibatch_rows(groups, 2, seed, 5, 0);
    REQUIRE(mb.size() == 2);
    for (const auto& m : mb) {
      REQUIRE(m.size() == 6); // two whole groups each
      // Each minibatch is two of the groups, each one's rows in its own order.
      for (std::size_t at = 0; at < m.size(); at += 3) {
        const auto g = static_cast<std::size_t>(m[at]);
        REQUIRE(g < 4);
        CHECK(std::vector<std::int64_t>(m.begin() + static_cast<long>(at), m.begin() + static_cast<long>(at) + 3) ==
              groups[g]);
      }
    }
  }
  CHECK_THROWS_WITH(minibatch_rows(groups, 0, 1, 0, 0), Catch::Contains("minibatches must be >= 1"));
}

TEST_CASE("group_minibatches splits the batch by group: fewer groups than minibatches give one "
          "update per group") {
  at::set_num_threads(1);
  const auto batch = synthetic_batch(2, 4, small_dims().vocab);
  for (const bool by_group : {false, true}) {
    INFO("group_minibatches " << by_group);
    learner_options o = test_options();
    o.minibatches = 4;
    o.group_minibatches = by_group;
    ml::policy_model model(small_dims(), 5);
    learner_core learner(model, o, 1);
    const step_metrics m = learner.train_step(batch);
    // Rollouts: 4 minibatches of 2 of the 8. Groups: only 2 groups, one minibatch each.
    CHECK(m.updates == (by_group ? 2 : 4));
  }
}

TEST_CASE("the same inputs and seed give bit-identical weights") {
  at::set_num_threads(1);
  learner_options o = test_options();
  o.epochs = 2;
  o.minibatches = 3;
  o.loss.kl_coef = 0.05;
  o.loss.norm = loss_norm::sequence;
  const auto batch = synthetic_batch(3, 4, small_dims().vocab);

  ml::policy_model a(small_dims(), 21), b(small_dims(), 21);
  learner_core la(a, o, 99), lb(b, o, 99);
  la.train_step(batch);
  lb.train_step(batch);
  CHECK(same_weights(a, b));
  la.train_step(batch);
  lb.train_step(batch);
  CHECK(same_weights(a, b));

  // A different seed shuffles the minibatches differently.
  ml::policy_model c(small_dims(), 21);
  learner_core lc(c, o, 100);
  lc.train_step(batch);
  lc.train_step(batch);
  CHECK_FALSE(same_weights(a, c));
}

TEST_CASE("micro-batches group rows of similar length under the padded-token budget") {
  const std::vector<std::int64_t> len = {5, 20, 7, 20, 3};
  const std::vector<std::int64_t> rows = {0, 1, 2, 3, 4};
  using groups = std::vector<std::vector<std::int64_t>>;
  // 5 rows × 20 tokens = 100 fit: one forward, the rows in their own order.
  CHECK(plan_micro_batches(rows, len, 100) == groups{{0, 1, 2, 3, 4}});
  CHECK(plan_micro_batches(rows, len, 0) == groups{{0, 1, 2, 3, 4}});
  // Longest first: {1, 3} pads to 2 × 20 = 40; a third row would make 60. Then {2, 0, 4}
  // pads to 3 × 7 = 21.
  CHECK(plan_micro_batches(rows, len, 40) == groups{{1, 3}, {2, 0, 4}});
  // A row longer than the budget still gets a forward of its own.
  CHECK(plan_micro_batches(rows, len, 10) == groups{{1}, {3}, {2}, {0, 4}});
  CHECK(plan_micro_batches({3, 0}, len, 20) == groups{{3}, {0}});
  CHECK(plan_micro_batches({}, len, 10).empty());
  CHECK_THROWS_WITH(plan_micro_batches(rows, len, -1), Catch::Contains("budget must be >= 0"));
  CHECK_THROWS_WITH(plan_micro_batches({5}, len, 10), Catch::Contains("row 5 is outside"));
}

TEST_CASE("an update split into micro-batches equals the update in one forward") {
  at::set_num_threads(1);
  for (const loss_norm norm : {loss_norm::token, loss_norm::sequence}) {
    INFO("norm " << (norm == loss_norm::token ? "token" : "sequence"));
    learner_options o = test_options();
    o.lr = 1e-1;
    // Adam divides by sqrt(v̂) + eps: with eps ≪ |g| it maps a gradient of 1e-9 and one of
    // 1e-12 to the same ±lr step, so rounding in near-zero gradients would dominate the
    // weights. eps = 1 keeps the update a smooth function of the gradient.
    o.adam_eps = 1.0;
    o.minibatches = 2;
    o.loss.kl_coef = 0.05;
    o.loss.norm = norm;
    // Responses of 4..19 tokens after 6-token prompts, and one sample that trains nothing,
    // so that some micro-batch may hold no trained token.
    auto batch = synthetic_batch(3, 4, small_dims().vocab, 6, 4);
    for (std::size_t i = 0; i < batch.size(); ++i)
      batch[i].response = tokens(4 + 5 * (i % 4) - i % 3, small_dims().vocab,
                                 static_cast<std::uint32_t>(i + 77));
    for (auto& s : batch) {
      s.loss_mask.assign(s.response.size(), 1);
      s.sampling_logprobs.assign(s.response.size(), 0.0f);
    }
    batch[5].loss_mask.assign(batch[5].response.size(), 0);

    learner_options whole = o;
    whole.micro_batch_tokens = 0;
    learner_options split = o;
    split.micro_batch_tokens = 40; // one to three rows per forward
    ml::policy_model a(small_dims(), 31), b(small_dims(), 31);
    learner_core la(a, whole, 5), lb(b, split, 5);
    for (int step = 0; step < 2; ++step) {
      const step_metrics ma = la.train_step(batch);
      const step_metrics mb = lb.train_step(batch);
      CHECK(mb.updates == ma.updates);
      CHECK(mb.tokens_trained == ma.tokens_trained);
      CHECK(mb.loss == Approx(ma.loss).margin(1e-6));
      CHECK(mb.pg_loss == Approx(ma.pg_loss).margin(1e-6));
      CHECK(mb.kl == Approx(ma.kl).margin(1e-7));
      CHECK(mb.ratio_mean == Approx(ma.ratio_mean).epsilon(1e-6));
      CHECK(mb.clip_frac_low == Approx(ma.clip_frac_low).margin(1e-9));
      CHECK(mb.clip_frac_high == Approx(ma.clip_frac_high).margin(1e-9));
      CHECK(mb.grad_norm == Approx(ma.grad_norm).epsilon(1e-5));
      CHECK(mb.entropy == Approx(ma.entropy).epsilon(1e-6));
    }
    // The same updates up to fp32 summation order: after two steps every weight agrees to
    // 1e-6 while the steps themselves moved weights by far more.
    double diff = 0.0, moved = 0.0;
    ml::policy_model start(small_dims(), 31);
    for (std::size_t i = 0; i < a.parameters().size(); ++i) {
      const at::Tensor& wa = a.parameters()[i].second;
      diff = std::max(diff, (wa - b.parameters()[i].second).abs().max().item<double>());
      moved = std::max(moved, (wa - start.parameters()[i].second).abs().max().item<double>());
    }
    INFO("max |a - b| " << diff << ", max movement " << moved);
    CHECK(diff < 1e-6);
    CHECK(moved > 1e-3);
  }
}

TEST_CASE("a minibatch without signal skips its backward and steps AdamW bit for bit as with it") {
  at::set_num_threads(1);
  // One step with signal first, so that Adam's moments are nonzero and a zero-gradient step
  // still moves the weights; then batches whose groups all have equal rewards.
  auto flat = synthetic_batch(3, 4, small_dims().vocab);
  for (auto& s : flat)
    s.reward = 0.5f;
  // One epoch, one minibatch, one forward is the single pass; the other shapes reuse the old
  // log-probs for the first update or run a forward of their own.
  // With SALT, the skipped minibatch skips K as well and reports the no-op K would give.
  for (const auto& [epochs, minibatches] :
       std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 1}, {2, 2}}) {
    for (const std::int64_t micro : {std::int64_t{0}, std::int64_t{40}})
    for (const bool salt : {false, true}) {
      INFO("epochs " << epochs << ", minibatches " << minibatches << ", micro_batch_tokens " << micro
                     << ", salt " << salt);
      learner_options o = test_options();
      o.epochs = epochs;
      o.minibatches = minibatches;
      o.micro_batch_tokens = micro;
      o.salt_enabled = salt;
      o.salt.c0 = 4.0; // amplifies on the first step's minibatches
      learner_options full = o;
      full.skip_zero_signal = false;
      ml::policy_model a(small_dims(), 41), b(small_dims(), 41);
      learner_core la(a, o, 6), lb(b, full, 6);
      la.train_step(synthetic_batch(3, 4, small_dims().vocab));
      lb.train_step(synthetic_batch(3, 4, small_dims().vocab));
      REQUIRE(same_weights(a, b));
      ml::policy_model before(small_dims(), 41);
      for (std::size_t i = 0; i < a.parameters().size(); ++i)
        before.parameters()[i].second.detach().copy_(a.parameters()[i].second.detach());
      for (int step = 0; step < 2; ++step) {
        const step_metrics ma = la.train_step(flat);
        const step_metrics mb = lb.train_step(flat);
        CHECK(ma.zero_signal_groups == 3);
        CHECK(ma.zero_signal_updates == epochs * minibatches);
        CHECK(mb.zero_signal_updates == 0);
        CHECK(ma.updates == mb.updates);
        CHECK(ma.grad_norm == 0.0);
        CHECK(mb.grad_norm == 0.0);
        CHECK(ma.loss == mb.loss);
        CHECK(ma.pg_loss == mb.pg_loss);
        CHECK(ma.ratio_mean == mb.ratio_mean);
        CHECK(ma.clip_frac_low == mb.clip_frac_low);
        CHECK(ma.entropy == mb.entropy);
        CHECK(ma.salt_updates == (salt ? epochs * minibatches : 0));
        CHECK(ma.salt_updates == mb.salt_updates);
        CHECK(ma.salt_noops == mb.salt_noops);
        CHECK(ma.salt_noops == ma.salt_updates);
        CHECK(ma.salt_gamma == mb.salt_gamma);
        CHECK(ma.salt_rank == mb.salt_rank);
        CHECK(ma.salt_cancellation == mb.salt_cancellation);
        CHECK(ma.salt_norm_before == mb.salt_norm_before);
        CHECK(ma.salt_norm_after == mb.salt_norm_after);
      }
      CHECK(same_weights(a, b));
      CHECK_FALSE(same_weights(a, before)); // momentum moved them: the check is not vacuous
      const optimizer_state sa = la.save_optimizer_state(), sb = lb.save_optimizer_state();
      CHECK(sa.step == sb.step);
      REQUIRE(sa.tensors.size() == sb.tensors.size());
      for (std::size_t i = 0; i < sa.tensors.size(); ++i) {
        INFO(sa.tensors[i].first);
        CHECK(sa.tensors[i].first == sb.tensors[i].first);
        CHECK(at::equal(sa.tensors[i].second, sb.tensors[i].second));
      }
    }
  }

  // A KL term has a gradient of its own: no skip.
  learner_options kl = test_options();
  kl.loss.kl_coef = 0.05;
  ml::policy_model c(small_dims(), 41);
  learner_core lc(c, kl, 6);
  lc.train_step(synthetic_batch(3, 4, small_dims().vocab));
  const step_metrics mk = lc.train_step(flat);
  CHECK(mk.zero_signal_updates == 0);
  CHECK(mk.grad_norm > 0.0);

  // One group with signal in the minibatch: the backward runs.
  auto mixed = flat;
  mixed[0].reward = 1.0f;
  ml::policy_model d(small_dims(), 41);
  learner_core ld(d, test_options(), 6);
  const step_metrics mm = ld.train_step(mixed);
  CHECK(mm.zero_signal_groups == 2);
  CHECK(mm.zero_signal_updates == 0);
  CHECK(mm.grad_norm > 0.0);
}

TEST_CASE("lr = 0 leaves every weight bit as it was while the loss and gradients are computed") {
  at::set_num_threads(1);
  learner_options o = test_options(); // weight decay 0.01: a zero lr must not apply it either
  o.lr = 0.0;
  const auto batch = synthetic_batch(2, 4, small_dims().vocab);
  ml::policy_model model(small_dims(), 5), untouched(small_dims(), 5);
  {
    // A -0.0 weight: adding a zero step would make it +0.0, a different bit pattern.
    at::NoGradGuard no_grad;
    model.parameters()[0].second.view({-1})[0] = -0.0f;
    untouched.parameters()[0].second.view({-1})[0] = -0.0f;
  }
  learner_core learner(model, o, 1);
  const step_metrics m = learner.train_step(batch);
  CHECK(m.grad_norm > 0.0);
  CHECK(m.advantage_abs_mean > 0.0);
  CHECK(m.updates == 1);
  CHECK(same_weights(model, untouched));
  CHECK(std::signbit(model.parameters()[0].second.view({-1})[0].item<float>()));
  // The same step with lr > 0 moves them: the comparison above can fail.
  o.lr = 1e-3;
  ml::policy_model moved(small_dims(), 5);
  learner_core trained(moved, o, 1);
  trained.train_step(batch);
  CHECK_FALSE(same_weights(moved, untouched));
}

TEST_CASE("an optimizer state round trip through safetensors is bit-exact") {
  at::set_num_threads(1);
  learner_options o = test_options();
  o.epochs = 2;
  o.minibatches = 2;
  o.loss.kl_coef = 0.05;
  const auto batch = synthetic_batch(3, 4, small_dims().vocab);
  const auto batch2 = synthetic_batch(2, 5, small_dims().vocab, 5, 3);

  ml::policy_model model(small_dims(), 31);
  learner_core learner(model, o, 4);
  learner.train_step(batch);
  learner.train_step(batch2);

  // Save weights and optimizer state as a checkpoint would, then continue.
  const std::string dir = SORL_TEST_DATA_DIR;
  ml::save_safetensors(dir + "/learner_model.safetensors", model.parameters());
  const optimizer_state saved = learner.save_optimizer_state();
  ml::save_safetensors(dir + "/learner_optimizer.safetensors", saved.tensors);
  CHECK(saved.step == 2);
  learner.train_step(batch);

  // A fresh model and learner (different init, different reference) restored from the files.
  ml::policy_model restored(small_dims(), 999);
  ml::load_safetensors_into(dir + "/learner_model.safetensors", restored.parameters());
  learner_core resumed(restored, o, 4);
  optimizer_state loaded;
  loaded.step = saved.step;
  loaded.tensors = ml::load_safetensors(dir + "/learner_optimizer.safetensors");
  resumed.load_optimizer_state(loaded);
  CHECK(resumed.step() == 2);
  CHECK(resumed.optimizer_updates() == learner.optimizer_updates() - 4);
  resumed.train_step(batch);
  CHECK(same_weights(model, restored));
  CHECK(same_weights(*learner.reference(), *resumed.reference()));
}

TEST_CASE("a bad optimizer state is rejected and leaves the learner untouched") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 41);
  learner_core learner(model, test_options(), 1);
  learner.train_step(synthetic_batch(1, 4, small_dims().vocab));
  const optimizer_state good = learner.save_optimizer_state();

  optimizer_state missing = good;
  missing.tensors.pop_back();
  CHECK_THROWS_WITH(learner.load_optimizer_state(missing), Catch::Contains("missing"));

  optimizer_state extra = good;
  extra.tensors.emplace_back("reference.model.norm.weight", at::ones({32}));
  CHECK_THROWS_WITH(learner.load_optimizer_state(extra), Catch::Contains("unexpected"));

  optimizer_state wrong = good;
  wrong.tensors[1].second = at::zeros({3});
  CHECK_THROWS_WITH(learner.load_optimizer_state(wrong), Catch::Contains(wrong.tensors[1].first));

  const optimizer_state after = learner.save_optimizer_state();
  REQUIRE(after.tensors.size() == good.tensors.size());
  for (std::size_t i = 0; i < good.tensors.size(); ++i)
    CHECK(at::equal(after.tensors[i].second, good.tensors[i].second));
}

TEST_CASE("a failed reward is left out of its group statistics and masked out of the loss") {
  at::set_num_threads(1);
  const auto vocab = small_dims().vocab;
  const auto prompt = tokens(4, vocab, 7);
  // Group 0: rewards 1.0 / (scorer threw or returned NaN) / 3.0; group 1 has no failure.
  std::vector<rollout_sample> batch{
    sample(0, prompt, tokens(5, vocab, 1), 1.0f), sample(0, prompt, tokens(6, vocab, 2), 0.0f),
    sample(0, prompt, tokens(5, vocab, 3), 3.0f), sample(1, prompt, tokens(5, vocab, 4), 0.5f),
    sample(1, prompt, tokens(7, vocab, 5), 2.0f), sample(1, prompt, tokens(5, vocab, 6), -1.0f)};
  batch[1].reward_failed = true;
  batch[1].reward = std::nanf("");
  learner_options o = test_options();
  o.advantage_eps = 0.0;
  // Mean 2 and population std 1 over the two finite rewards; the failed one gets 0.
  const auto a = batch_advantages(batch, o);
  CHECK(a[0] == -1.0f);
  CHECK(a[1] == 0.0f);
  CHECK(a[2] == 1.0f);

  // The other group's advantages are bit-identical to those of a batch without the failure.
  auto clean = batch;
  clean[1].reward_failed = false;
  clean[1].reward = 2.0f;
  const auto b = batch_advantages(clean, o);
  for (std::size_t i = 3; i < 6; ++i)
    CHECK(std::memcmp(&a[i], &b[i], sizeof(float)) == 0);

  // The failed sample's tokens are never trained, and the step counts it.
  ml::policy_model model(small_dims(), 9);
  learner_core learner(model, o, 1);
  const step_metrics m = learner.train_step(batch);
  CHECK(m.reward_failures == 1);
  CHECK(m.tokens_trained == 5 + 5 + 5 + 7 + 5);
  CHECK(m.reward_mean == Approx((1.0 + 3.0 + 0.5 + 2.0 - 1.0) / 5.0));
  CHECK(m.updates == 1);
}

TEST_CASE("overlong shaping compares each turn of an episode with the per-turn budget") {
  at::set_num_threads(1);
  const auto vocab = small_dims().vocab;
  // A number-guess-like layout: `turns` turns of 4 policy tokens (mask 1), separated by 3
  // environment tokens (mask 0).
  auto episode = [&](int turns, std::uint32_t salt) {
    std::vector<std::int32_t> resp;
    std::vector<std::uint8_t> mask;
    const auto toks = tokens(static_cast<std::size_t>(turns) * 7, vocab, salt);
    for (int t = 0; t < turns; ++t) {
      for (int k = 0; k < 4; ++k) {
        resp.push_back(toks[resp.size()]);
        mask.push_back(1);
      }
      if (t + 1 < turns)
        for (int k = 0; k < 3; ++k) {
          resp.push_back(toks[resp.size()]);
          mask.push_back(0);
        }
    }
    auto s = sample(0, tokens(4, vocab, 1), resp, 1.0f);
    s.loss_mask = mask;
    return s;
  };
  // Two correct episodes: 5 turns × 4 tokens and 1 turn × 4 tokens, max_new_tokens 16, cache 4.
  std::vector<rollout_sample> batch{episode(5, 2), episode(1, 3)};
  learner_options o = test_options();
  o.overlong = overlong_mode::shape;
  o.overlong_max_len = 16;
  o.overlong_cache_len = 4;
  CHECK(batch_advantages(batch, o) == std::vector<float>{0.0f, 0.0f});
  ml::policy_model model(small_dims(), 11);
  {
    learner_core learner(model, o, 1);
    const step_metrics m = learner.train_step(batch);
    CHECK(m.overlong_penalty_mean == 0.0);
    CHECK(m.overlong_shaped == 0);
  }
  // One turn of 14 tokens in the second episode: (12 − 14) / 4 = −0.5 from that turn alone.
  for (int k = 0; k < 10; ++k) {
    batch[1].response.push_back(batch[1].response[0]);
    batch[1].loss_mask.push_back(1);
    batch[1].sampling_logprobs.push_back(0.0f);
  }
  o.scale_advantages = false; // Dr. GRPO: rewards {1, 0.5} → ±0.25
  CHECK(batch_advantages(batch, o) == std::vector<float>{0.25f, -0.25f});
  learner_core learner(model, o, 1);
  const step_metrics m = learner.train_step(batch);
  CHECK(m.overlong_penalty_mean == -0.25);
  CHECK(m.overlong_shaped == 1);
}

TEST_CASE("a malformed sample is rejected before anything changes") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 51);
  ml::policy_model copy = model.clone(at::kFloat);
  learner_core learner(model, test_options(), 1);
  auto batch = synthetic_batch(1, 3, small_dims().vocab);
  batch[1].loss_mask.pop_back();
  CHECK_THROWS_WITH(learner.train_step(batch), Catch::Contains("sample 1"));
  batch = synthetic_batch(1, 3, small_dims().vocab);
  batch[2].response[0] = static_cast<std::int32_t>(small_dims().vocab);
  CHECK_THROWS_WITH(learner.train_step(batch), Catch::Contains("sample 2"));
  batch = synthetic_batch(1, 3, small_dims().vocab);
  batch[0].reward = std::nanf("");
  CHECK_THROWS_AS(learner.train_step(batch), std::invalid_argument);
  batch = synthetic_batch(1, 3, small_dims().vocab);
  batch[0].prompt.clear();
  CHECK_THROWS_AS(learner.train_step(batch), std::invalid_argument);
  CHECK_THROWS_AS(learner.train_step({}), std::invalid_argument);
  CHECK(learner.step() == 0);
  CHECK(same_weights(model, copy));

  learner_options bad = test_options();
  bad.minibatches = 0;
  CHECK_THROWS_AS(learner_core(model, bad, 1), std::invalid_argument);
  ml::policy_model bf16 = model.clone(at::kBFloat16);
  CHECK_THROWS_AS(learner_core(bf16, test_options(), 1), std::invalid_argument);
}

TEST_CASE("a temperature too small for fp32 is refused, and at the floor the update is finite") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 61);
  learner_options o = test_options();
  o.temperature = 1e-40;
  CHECK_THROWS_WITH(learner_core(model, o, 1), Catch::Contains("temperature"));
  auto batch = synthetic_batch(1, 4, small_dims().vocab);
  CHECK_THROWS_AS(response_logprobs(model, batch, 1e-40), std::invalid_argument);

  o.temperature = 0.01;
  learner_core learner(model, o, 1);
  const step_metrics m = learner.train_step(batch);
  CHECK(m.updates == 1);
  CHECK(m.nonfinite_updates == 0);
  CHECK(std::isfinite(m.loss));
  CHECK(std::isfinite(m.grad_norm));
  for (const auto& lp : response_logprobs(model, batch, 0.01))
    for (const float x : lp)
      CHECK(std::isfinite(x));
}

TEST_CASE("the learner's log-probs at temperature 0.7 are log_softmax(logits / 0.7)") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 67);
  auto batch = synthetic_batch(1, 2, small_dims().vocab);
  // Against the same logits divided and normalised in double: equal up to the fp32 rounding
  // of the log-softmax (the quotient itself is rounded once, from a double division).
  const auto at_07 = response_logprobs(model, batch, 0.7);
  const auto& s0 = batch[0];
  std::vector<std::int64_t> ids(s0.prompt.begin(), s0.prompt.end());
  ids.insert(ids.end(), s0.response.begin(), s0.response.end());
  const at::Tensor logits =
    model.forward(at::tensor(ids, at::kLong).unsqueeze(0), at::ones({1, static_cast<std::int64_t>(ids.size())}, at::kLong))
      .detach()
      .to(at::kDouble);
  const at::Tensor lsm = at::log_softmax(logits / 0.7, -1);
  for (std::size_t k = 0; k < s0.response.size(); ++k) {
    const double want =
      lsm[0][static_cast<std::int64_t>(s0.prompt.size() + k) - 1][s0.response[k]].item<double>();
    CHECK(at_07[0][k] == Approx(want).margin(1e-5));
  }
}

TEST_CASE("a step whose every update has a non-finite loss fails with the reason") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 71);
  {
    at::NoGradGuard no_grad;
    model.parameters()[0].second.fill_(std::nanf("")); // as from a corrupt checkpoint
  }
  learner_core learner(model, test_options(), 1);
  const auto batch = synthetic_batch(1, 4, small_dims().vocab);
  CHECK_THROWS_AS(learner.train_step(batch), training_stalled);
  CHECK_THROWS_WITH(learner.train_step(batch), Catch::Contains("non-finite loss or gradient"));
  CHECK(learner.optimizer_updates() == 0); // the dropped updates changed no optimizer state
}

TEST_CASE("max_idle_steps consecutive steps with nothing to train fail, and a trained step resets the count") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 73);
  learner_options o = test_options();
  o.max_idle_steps = 3;
  learner_core learner(model, o, 1);
  auto idle = synthetic_batch(1, 4, small_dims().vocab);
  for (auto& s : idle)
    std::fill(s.loss_mask.begin(), s.loss_mask.end(), 0);
  const auto busy = synthetic_batch(1, 4, small_dims().vocab);
  for (int i = 0; i < 2; ++i) {
    const step_metrics m = learner.train_step(idle);
    CHECK(m.updates == 0);
    CHECK(m.skipped_updates == 1);
    CHECK(m.nonfinite_updates == 0);
  }
  CHECK(learner.train_step(busy).updates == 1); // resets the count
  learner.train_step(idle);
  learner.train_step(idle);
  CHECK_THROWS_WITH(learner.train_step(idle), Catch::Contains("3 consecutive steps"));
  CHECK(learner.step() == 6);
}

// Not run by ctest (hidden): `learner_core_test "[.bench]" -s` prints the cost of one step.
TEST_CASE("cost of a train step on the tiny preset", "[.bench]") {
  at::set_num_threads(1);
  const ml::model_dims dims = ml::preset("tiny");
  ml::policy_model model(dims, 1);
  std::vector<rollout_sample> batch;
  for (int g = 0; g < 8; ++g)
    for (int k = 0; k < 8; ++k)
      batch.push_back(sample(static_cast<std::uint64_t>(g),
                             tokens(16, dims.vocab, static_cast<std::uint32_t>(g)),
                             tokens(16, dims.vocab, static_cast<std::uint32_t>(g * 8 + k + 100)),
                             static_cast<float>(k % 2)));
  for (const int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (const int minibatches : {1, 4}) {
      for (const double kl : {0.0, 0.05}) {
        learner_options o = test_options();
        o.loss.kl_coef = kl;
        o.minibatches = minibatches;
        learner_core learner(model, o, 1);
        learner.train_step(batch); // warm-up
        double total = 0.0;
        const int reps = 3;
        // Process CPU time too: on a shared machine wall time mostly measures the neighbours.
        const std::clock_t c0 = std::clock();
        for (int r = 0; r < reps; ++r)
          total += learner.train_step(batch).seconds;
        const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
        std::cout << "tiny preset, 64 samples x (16 prompt + 16 response) tokens, " << threads
                  << " thread(s), " << minibatches << " minibatch(es), kl_coef " << kl << ": "
                  << 1000.0 * total / reps << " ms wall, " << 1000.0 * cpu / reps
                  << " ms CPU per train_step\n";
      }
    }
  }
}

TEST_CASE("learner options come from [algorithm] and the turn budget, with the config's defaults") {
  sorl::experiment_config cfg;
  const learner_options plain;
  const learner_options d = learner_options_from(cfg);
  CHECK(d.lr == plain.lr);
  CHECK(d.weight_decay == plain.weight_decay);
  CHECK(d.max_grad_norm == plain.max_grad_norm);
  CHECK(d.loss.clip_eps_low == plain.loss.clip_eps_low);
  CHECK(d.loss.clip_eps_high == plain.loss.clip_eps_high);
  CHECK(d.loss.kl_coef == plain.loss.kl_coef);
  CHECK(d.loss.norm == plain.loss.norm);
  CHECK(d.scale_advantages == plain.scale_advantages);
  CHECK(d.overlong == plain.overlong);
  CHECK(d.temperature == plain.temperature);
  CHECK(d.epochs == plain.epochs);
  CHECK(d.minibatches == plain.minibatches);
  CHECK(d.weights == plain.weights);
  CHECK(d.weights == forward_weights::bf16);
  CHECK(d.old_logprobs == plain.old_logprobs);
  CHECK(d.tis_cap == plain.tis_cap);

  auto& a = cfg.algorithm;
  a.lr = 3e-5;
  a.weight_decay = 0.1;
  a.max_grad_norm = 0.5;
  a.clip_eps_low = 0.1;
  a.clip_eps_high = 0.3;
  a.kl_coef = 0.05;
  a.loss_norm = sorl::loss_norm_kind::sequence;
  a.scale_advantages = false;
  a.overlong = sorl::overlong_kind::shape;
  a.overlong_cache = 40; // more than the budget: capped at L_max
  a.temperature = 0.7;
  a.epochs = 2;
  a.minibatches = 4;
  a.learner_weights = sorl::learner_weights_kind::fp32;
  a.old_logprobs = sorl::old_logprobs_kind::rollout;
  cfg.task.max_new_tokens = 32;
  const learner_options o = learner_options_from(cfg);
  CHECK(o.lr == 3e-5);
  CHECK(o.weight_decay == 0.1);
  CHECK(o.max_grad_norm == 0.5);
  CHECK(o.loss.clip_eps_low == 0.1);
  CHECK(o.loss.clip_eps_high == 0.3);
  CHECK(o.loss.kl_coef == 0.05);
  CHECK(o.loss.norm == loss_norm::sequence);
  CHECK_FALSE(o.scale_advantages);
  CHECK(o.overlong == overlong_mode::shape);
  CHECK(o.overlong_max_len == 32);
  CHECK(o.overlong_cache_len == 32);
  CHECK(o.temperature == 0.7);
  CHECK(o.epochs == 2);
  CHECK(o.minibatches == 4);
  CHECK(o.weights == forward_weights::fp32);
  CHECK(o.old_logprobs == old_logprob_source::rollout);
  CHECK(o.tis_cap == 0.0);

  a.overlong = sorl::overlong_kind::filter;
  a.temperature = 0.0; // greedy rollouts are scored at temperature 1
  a.old_logprobs = sorl::old_logprobs_kind::recompute;
  a.tis_cap = 2.0;
  const learner_options g = learner_options_from(cfg);
  CHECK(g.overlong == overlong_mode::filter);
  CHECK(g.temperature == 1.0);
  CHECK(g.old_logprobs == old_logprob_source::recompute);
  CHECK(g.tis_cap == 2.0);
}

TEST_CASE("response_logprobs_tensor is response_logprobs with gradients to the model") {
  at::set_num_threads(1);
  ml::policy_model model(small_dims(), 4);
  model.set_requires_grad(true);
  const auto batch = synthetic_batch(2, 3, small_dims().vocab);
  const auto plain = response_logprobs(model, batch, 0.7);
  const at::Tensor t = response_logprobs_tensor(model, batch, 0.7);
  REQUIRE(t.dim() == 2);
  REQUIRE(t.size(0) == static_cast<std::int64_t>(batch.size()));
  for (std::size_t i = 0; i < batch.size(); ++i)
    for (std::size_t k = 0; k < batch[i].response.size(); ++k)
      CHECK(t[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(k)].item<float>() == plain[i][k]);
  REQUIRE(t.requires_grad());
  t.select(1, 0).sum().backward();
  const auto& embed = model.parameters().front().second;
  REQUIRE(embed.grad().defined());
  CHECK(embed.grad().abs().sum().item<double>() > 0.0);
  CHECK_THROWS_AS(response_logprobs_tensor(model, batch, 0.0), std::invalid_argument);
}
