#include "runtime/ml/policy/fused_logprobs.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace sorl::ml {

namespace {

void check_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "token_logprobs: hidden [R, d] and weight [vocab, d] disagree: ", hidden.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "token_logprobs: hidden and weight must be fp32, got ", hidden.scalar_type(), " and ",
              weight.scalar_type());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0) && targets.scalar_type() == at::kLong,
              "token_logprobs: targets must be [", hidden.size(0), "] int64, got ", targets.sizes(), " ",
              targets.scalar_type());
}

// The logits the loss reads, exactly as the plain path forms them.
at::Tensor scaled_logits(const at::Tensor& hidden, const at::Tensor& weight, double temperature) {
  at::Tensor z = at::linear(hidden, weight);
  // In double, so that the temperature counts as the user wrote it (a scalar divisor of an fp32
  // tensor would be rounded to fp32), then rounded once to fp32.
  if (temperature != 1.0) z = (z.to(at::kDouble) / temperature).to(at::kFloat);
  return z;
}

std::int64_t rows_per_chunk(std::int64_t chunk_rows, std::int64_t vocab) {
  if (chunk_rows > 0) return chunk_rows;
  constexpr std::int64_t logits_per_chunk = std::int64_t{1} << 23;
  return std::max<std::int64_t>(1, logits_per_chunk / std::max<std::int64_t>(vocab, 1));
}

struct fused_logprobs_fn : torch::autograd::Function<fused_logprobs_fn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                                                const at::Tensor& weight, const at::Tensor& targets,
                                                double temperature, bool want_entropy, std::int64_t chunk) {
    at::NoGradGuard no_grad;
    const std::int64_t R = hidden.size(0);
    at::Tensor logp = at::empty({R}, hidden.options());
    at::Tensor entropy = want_entropy ? at::empty({R}, hidden.options()) : at::empty({0}, hidden.options());
    for (std::int64_t r0 = 0; r0 < R; r0 += chunk) {
      const std::int64_t n = std::min(chunk, R - r0);
      const at::Tensor lsm = at::log_softmax(scaled_logits(hidden.narrow(0, r0, n), weight, temperature), -1);
      logp.narrow(0, r0, n).copy_(lsm.gather(1, targets.narrow(0, r0, n).unsqueeze(1)).squeeze(1));
      if (want_entropy) entropy.narrow(0, r0, n).copy_(-(lsm.exp() * lsm).sum(-1));
    }
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->mark_non_differentiable({entropy});
    return {logp, entropy};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    at::NoGradGuard no_grad;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& targets = saved[2];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const std::int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor g = grad_outputs[0];  // [R]; materialised (zeros) when the output went unused
    const bool want_hidden = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    const std::int64_t R = hidden.size(0);
    at::Tensor grad_hidden = want_hidden ? at::empty_like(hidden) : at::Tensor();
    at::Tensor grad_weight = want_weight ? at::zeros_like(weight) : at::Tensor();
    for (std::int64_t r0 = 0; r0 < R && (want_hidden || want_weight); r0 += chunk) {
      const std::int64_t n = std::min(chunk, R - r0);
      const at::Tensor h = hidden.narrow(0, r0, n);
      const at::Tensor gc = g.narrow(0, r0, n).unsqueeze(1);  // [n, 1]
      const at::Tensor lsm = at::log_softmax(scaled_logits(h, weight, temperature), -1);
      // ∂/∂z of g · log softmax(z)[y] = g · onehot(y) − g · softmax(z), in log_softmax's own
      // backward form (grad − exp(out) · Σ grad, with Σ grad = g).
      at::Tensor grad_z = lsm.exp_().mul_(gc).neg_();
      grad_z.scatter_add_(1, targets.narrow(0, r0, n).unsqueeze(1), gc);
      // Autograd of the plain path divides by the temperature in double, then rounds.
      if (temperature != 1.0) grad_z = (grad_z.to(at::kDouble) / temperature).to(at::kFloat);
      if (want_hidden) grad_hidden.narrow(0, r0, n).copy_(at::matmul(grad_z, weight));
      if (want_weight) grad_weight.addmm_(grad_z.t(), h);
    }
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

token_logprob_result token_logprobs_plain(const at::Tensor& hidden, const at::Tensor& weight,
                                          const at::Tensor& targets, double temperature, bool want_entropy) {
  check_inputs(hidden, weight, targets);
  const at::Tensor lsm = at::log_softmax(scaled_logits(hidden, weight, temperature), -1);
  token_logprob_result out;
  out.logprobs = lsm.gather(1, targets.unsqueeze(1)).squeeze(1);
  if (want_entropy) {
    at::NoGradGuard no_grad;  // a metric only
    out.entropy = -(lsm.exp() * lsm).sum(-1);
  }
  return out;
}

token_logprob_result token_logprobs_fused(const at::Tensor& hidden, const at::Tensor& weight,
                                          const at::Tensor& targets, double temperature, bool want_entropy,
                                          std::int64_t chunk_rows) {
  check_inputs(hidden, weight, targets);
  TORCH_CHECK(chunk_rows >= 0, "token_logprobs_fused: chunk_rows must be >= 0, got ", chunk_rows);
  const std::int64_t chunk = rows_per_chunk(chunk_rows, weight.size(0));
  auto outs = fused_logprobs_fn::apply(hidden, weight, targets, temperature, want_entropy, chunk);
  token_logprob_result out;
  out.logprobs = outs[0];
  if (want_entropy) out.entropy = outs[1];
  return out;
}

}  // namespace sorl::ml
