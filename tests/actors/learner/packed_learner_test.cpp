// The learner's packed log-prob forwards (sequences end to end, chunked LM head; each group's
// prompt once or every rollout's) against the padded ones with whole logits: the same
// log-probs, losses, figures and gradients up to fp32 rounding.

#include "actors/learner/learner_core.hpp"
#include "tests/ml/policy_test_util.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

using namespace sorl;
using namespace sorl::learner;

namespace {

ml::model_dims dims() {
  ml::model_dims d = ml::test::small_dims();
  d.vocab = 61; // odd: chunks of the LM head do not divide it
  return d;
}

using ml::test::tokens;

/// Groups of samples with prompts and responses of unequal lengths (so the padded path pads),
/// rewards alternating, one token in each response untrained.
std::vector<rollout_sample> batch_of(int groups, int group_size) {
  std::vector<rollout_sample> batch;
  for (int g = 0; g < groups; ++g) {
    const auto prompt = tokens(3 + std::int64_t{g} * 5, dims().vocab, 500u + static_cast<std::uint32_t>(g));
    for (int k = 0; k < group_size; ++k) {
      rollout_sample s;
      s.group_id = static_cast<std::uint64_t>(g);
      s.prompt = prompt;
      s.response = tokens(1 + std::int64_t{(k * 7 + g * 3) % 11}, dims().vocab,
                          static_cast<std::uint32_t>(g * 100 + k));
      s.loss_mask.assign(s.response.size(), 1);
      s.loss_mask[0] = s.response.size() > 1 ? 0 : 1;
      s.sampling_logprobs.assign(s.response.size(), -2.0f);
      s.reward = k % 2 == 0 ? 1.0f : 0.0f;
      batch.push_back(std::move(s));
    }
  }
  return batch;
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

} // namespace

// Log-probs of magnitude ~1-5 from matmuls over other row counts: ~1e-6 apart in practice.
constexpr double logprob_atol = 1e-5;
// Gradients are sums over every token: relative to the largest entry of each.
constexpr double grad_rtol = 1e-5;

TEST_CASE("packed and padded log-probs of a learner batch agree on values and gradients") {
  at::set_num_threads(1);
  const auto batch = batch_of(3, 5);
  for (const bool bf16 : {true, false})
  for (const bool share : {false, true}) {
    INFO("bf16 " << bf16 << ", prompts shared " << share);
    ml::policy_model a(dims(), 17, 0.2);
    ml::policy_model b = a.clone(at::kFloat);
    for (ml::policy_model* m : {&a, &b}) {
      m->set_requires_grad(true);
      m->set_bf16_compute(bf16);
    }
    const at::Tensor packed = response_logprobs_tensor(a, batch, 0.7, true, share);
    const at::Tensor padded = response_logprobs_tensor(b, batch, 0.7, false);
    REQUIRE(packed.sizes() == padded.sizes());
    // Only the response columns carry values.
    at::Tensor real = at::zeros(packed.sizes(), at::kBool);
    for (std::size_t i = 0; i < batch.size(); ++i)
      real[static_cast<std::int64_t>(i)].narrow(0, 0, static_cast<std::int64_t>(batch[i].response.size())).fill_(true);
    CHECK(max_abs(packed.masked_select(real), padded.masked_select(real)) <= logprob_atol);
    const at::Tensor w = real.to(at::kFloat) * at::linspace(-1.0, 1.0, packed.numel()).view(packed.sizes());
    (packed * w).sum().backward();
    (padded * w).sum().backward();
    for (std::size_t i = 0; i < a.parameters().size(); ++i) {
      INFO(a.parameters()[i].first);
      const at::Tensor& ga = a.parameters()[i].second.grad();
      const at::Tensor& gb = b.parameters()[i].second.grad();
      REQUIRE(ga.defined());
      CHECK(max_abs(ga, gb) <= grad_rtol * (1.0 + gb.abs().max().item<double>()));
    }
  }
}

TEST_CASE("packed and padded train steps report the same losses and figures, in one forward or "
          "in micro-batches") {
  at::set_num_threads(1);
  const auto batch = batch_of(3, 5);
  struct shape {
    int epochs, minibatches;
    std::int64_t micro_batch_tokens;
  };
  for (const bool share : {false, true})
  for (const shape sh : {shape{1, 1, 4096}, shape{1, 1, 60}, shape{2, 2, 4096}, shape{1, 2, 40}}) {
    INFO("epochs " << sh.epochs << ", minibatches " << sh.minibatches << ", micro_batch_tokens "
                   << sh.micro_batch_tokens << ", prompts shared " << share);
    ml::policy_model a(dims(), 23, 0.2);
    ml::policy_model b = a.clone(at::kFloat);
    learner_options o;
    o.old_logprobs = old_logprob_source::recompute;
    o.temperature = 0.7;
    o.lr = 1e-3;
    o.epochs = sh.epochs;
    o.minibatches = sh.minibatches;
    o.micro_batch_tokens = sh.micro_batch_tokens;
    learner_options op = o, oq = o;
    op.packed_forward = true;
    op.share_prompts = share;
    oq.packed_forward = false;
    learner_core la(a, op, 5), lb(b, oq, 5);
    const step_metrics ma = la.train_step(batch);
    const step_metrics mb = lb.train_step(batch);
    REQUIRE(ma.updates == mb.updates);
    CHECK(ma.forwards == mb.forwards);
    CHECK(ma.loss == Approx(mb.loss).margin(1e-6));
    CHECK(ma.pg_loss == Approx(mb.pg_loss).margin(1e-6));
    CHECK(ma.ratio_mean == Approx(mb.ratio_mean).margin(1e-6));
    CHECK(ma.grad_norm == Approx(mb.grad_norm).epsilon(1e-4));
    CHECK(ma.entropy == Approx(mb.entropy).margin(1e-5));
    CHECK(ma.mismatch_mean == Approx(mb.mismatch_mean).margin(1e-5));
    CHECK(ma.forward_seconds > 0.0);
    CHECK(ma.backward_seconds > 0.0);
    // After the first update the two masters differ only where AdamW's normalised step of a
    // near-zero gradient entry flips: compare the log-probs the updated policies give.
    const at::Tensor pa = response_logprobs_tensor(a, batch, 0.7, true).detach();
    const at::Tensor pb = response_logprobs_tensor(b, batch, 0.7, true).detach();
    CHECK(max_abs(pa, pb) <= 1e-2);
  }
}
