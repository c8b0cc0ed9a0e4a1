#include "runtime/ml/policy/fused_logprobs.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>

#include <cstdint>

using namespace sorl::ml;

namespace {

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

struct case_data {
  at::Tensor hidden, weight, targets, g;
};

// Logits of magnitude ~1-5 (hidden and weight entries ~N(0, 0.5²), d = 24): far from uniform.
case_data make_case(std::int64_t rows, std::int64_t vocab, std::uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  case_data c;
  c.hidden = at::empty({rows, 24}).normal_(0.0, 0.5, gen);
  c.weight = at::empty({vocab, 24}).normal_(0.0, 0.5, gen);
  c.targets = at::randint(vocab, {rows}, gen, at::kLong);
  c.g = at::empty({rows}).normal_(0.0, 1.0, gen);
  return c;
}

}  // namespace

// The chunked path runs the plain path's own operations on its rows, so the values differ only
// where the LM-head matmul rounds differently over fewer rows: ~1e-7 on log-probs of magnitude
// ~1-10 (1e-5 leaves room for other BLAS builds). Gradients are sums over rows (the weight's
// over chunks): 1e-5 relative to their largest entry.
constexpr double value_atol = 1e-5;
constexpr double grad_rtol = 1e-5;

TEST_CASE("fused log-probs equal the plain log-softmax on values and gradients, any chunking", "[fused_logprobs]") {
  for (const double temperature : {1.0, 0.7, 1.3}) {
    for (const std::int64_t chunk : {std::int64_t{0}, std::int64_t{1}, std::int64_t{5}, std::int64_t{36},
                                     std::int64_t{37}, std::int64_t{100}}) {
      INFO("temperature " << temperature << ", chunk_rows " << chunk);
      const case_data c = make_case(37, 53, 7);  // odd sizes: the last chunk is short
      const at::Tensor ha = c.hidden.clone().requires_grad_(true), wa = c.weight.clone().requires_grad_(true);
      const at::Tensor hb = c.hidden.clone().requires_grad_(true), wb = c.weight.clone().requires_grad_(true);
      const token_logprob_result fused = token_logprobs_fused(ha, wa, c.targets, temperature, true, chunk);
      const token_logprob_result plain = token_logprobs_plain(hb, wb, c.targets, temperature, true);
      CHECK(max_abs(fused.logprobs, plain.logprobs) <= value_atol);
      CHECK(max_abs(fused.entropy, plain.entropy) <= value_atol);
      CHECK_FALSE(fused.entropy.requires_grad());
      (fused.logprobs * c.g).sum().backward();
      (plain.logprobs * c.g).sum().backward();
      CHECK(max_abs(ha.grad(), hb.grad()) <= grad_rtol * (1.0 + hb.grad().abs().max().item<double>()));
      CHECK(max_abs(wa.grad(), wb.grad()) <= grad_rtol * (1.0 + wb.grad().abs().max().item<double>()));
    }
  }
}

TEST_CASE("the fused log-probs' gradient is g (onehot - softmax) / temperature by hand", "[fused_logprobs]") {
  // One row, vocabulary 3, hidden = I: the logits are the weight's column 0.
  const at::Tensor weight = at::tensor({1.0f, 2.0f, 0.5f}).view({3, 1}).requires_grad_(true);
  const at::Tensor hidden = at::ones({1, 1});
  const at::Tensor target = at::tensor(std::vector<std::int64_t>{1}, at::kLong);
  const double T = 0.5;
  const token_logprob_result r = token_logprobs_fused(hidden, weight, target, T, false);
  CHECK_FALSE(r.entropy.defined());
  const at::Tensor z = at::tensor({2.0, 4.0, 1.0}, at::kDouble);  // logits / T
  const at::Tensor p = at::softmax(z, 0);
  CHECK(r.logprobs.item<double>() == Approx(std::log(p[1].item<double>())).epsilon(1e-6));
  r.logprobs.sum().mul(3.0).backward();  // g = 3
  const at::Tensor expected = (at::tensor({0.0, 1.0, 0.0}, at::kDouble) - p) * 3.0 / T;
  CHECK(max_abs(weight.grad().squeeze(1).to(at::kDouble), expected) <= 1e-6);
}

TEST_CASE("fused log-probs need no gradient and refuse bad shapes", "[fused_logprobs]") {
  const case_data c = make_case(6, 11, 3);
  {
    at::NoGradGuard no_grad;
    const token_logprob_result r = token_logprobs_fused(c.hidden, c.weight, c.targets, 1.0, true, 4);
    CHECK_FALSE(r.logprobs.requires_grad());
    CHECK(max_abs(r.logprobs, token_logprobs_plain(c.hidden, c.weight, c.targets, 1.0, false).logprobs) <= value_atol);
  }
  // Only the weight requires grad (a frozen trunk): its gradient alone.
  const at::Tensor w = c.weight.clone().requires_grad_(true);
  (token_logprobs_fused(c.hidden, w, c.targets, 1.0, false, 4).logprobs * c.g).sum().backward();
  REQUIRE(w.grad().defined());
  CHECK_THROWS_AS(token_logprobs_fused(c.hidden, c.weight.narrow(1, 0, 5), c.targets, 1.0, false), c10::Error);
  CHECK_THROWS_AS(token_logprobs_fused(c.hidden, c.weight, c.targets.narrow(0, 0, 3), 1.0, false), c10::Error);
  CHECK_THROWS_AS(token_logprobs_fused(c.hidden.to(at::kDouble), c.weight, c.targets, 1.0, false), c10::Error);
  CHECK_THROWS_AS(token_logprobs_fused(c.hidden, c.weight, c.targets, 1.0, false, -1), c10::Error);
}
