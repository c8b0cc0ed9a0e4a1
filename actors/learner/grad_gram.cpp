#include "actors/learner/grad_gram.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

namespace sorl::learner {

namespace {

void check(const std::vector<layer_pass>& passes) {
  std::int64_t in = -1, out = -1;
  for (std::size_t k = 0; k < passes.size(); ++k) {
    const auto& p = passes[k];
    if (p.input.dim() != 3 || p.grad_output.dim() != 3)
      throw std::invalid_argument(fmt::format("layer_gram: pass {}: input and grad_output must be [B, S, *]", k));
    if (p.input.size(0) != p.grad_output.size(0) || p.input.size(1) != p.grad_output.size(1))
      throw std::invalid_argument(fmt::format("layer_gram: pass {}: input [{}, {}, *] and grad_output [{}, {}, *] "
                                              "disagree in batch or positions",
                                              k, p.input.size(0), p.input.size(1), p.grad_output.size(0),
                                              p.grad_output.size(1)));
    if (in < 0) {
      in = p.input.size(2);
      out = p.grad_output.size(2);
    } else if (p.input.size(2) != in || p.grad_output.size(2) != out) {
      throw std::invalid_argument(fmt::format("layer_gram: pass {} is a [{}, {}] layer, pass 0 a [{}, {}] one", k,
                                              p.grad_output.size(2), p.input.size(2), out, in));
    }
    if (p.has_bias != passes[0].has_bias) throw std::invalid_argument("layer_gram: passes disagree on the bias");
  }
}

at::Tensor as_double(const at::Tensor& t) { return t.detach().to(at::kDouble).contiguous(); }

}  // namespace

gram_method cheaper_gram_method(const std::vector<layer_pass>& passes) {
  check(passes);
  if (passes.empty()) return gram_method::materialized;
  double positions = 0.0, rollouts = 0.0;
  for (const auto& p : passes) {
    positions += static_cast<double>(p.input.size(0) * p.input.size(1));
    rollouts += static_cast<double>(p.input.size(0));
  }
  const auto in = static_cast<double>(passes[0].input.size(2));
  const auto out = static_cast<double>(passes[0].grad_output.size(2));
  const double ghost = positions * positions * (in + out);
  const double materialized = (positions + rollouts * rollouts) * in * out;
  return ghost < materialized ? gram_method::ghost : gram_method::materialized;
}

at::Tensor layer_gram(const std::vector<layer_pass>& passes, gram_method method) {
  check(passes);
  std::int64_t n = 0;
  for (const auto& p : passes) n += p.input.size(0);
  const c10::Device device = passes.empty() ? c10::Device(c10::kCPU) : passes[0].input.device();
  at::Tensor K = at::zeros({n, n}, at::TensorOptions().dtype(at::kDouble).device(device));
  if (n == 0) return K;
  if (method == gram_method::automatic) method = cheaper_gram_method(passes);
  const bool bias = passes[0].has_bias;

  if (method == gram_method::materialized) {
    // One row of flattened weight (and bias) gradient per rollout; a layer at a time, so the
    // memory is N · in · out doubles.
    std::vector<at::Tensor> rows;
    for (const auto& p : passes) {
      const at::Tensor X = as_double(p.input), E = as_double(p.grad_output);
      at::Tensor G = at::bmm(E.transpose(1, 2), X).reshape({X.size(0), -1});  // [B, out * in]
      if (bias) G = at::cat({G, E.sum(1)}, 1);
      rows.push_back(G);
    }
    const at::Tensor F = at::cat(rows, 0);
    return at::mm(F, F.t());
  }

  // Ghost: block (a, b) of K from positions' inner products, one rollout of pass a at a time
  // so that the products hold S_a × (B_b S_b) entries, not the whole square.
  std::vector<at::Tensor> X, E;
  for (const auto& p : passes) {
    X.push_back(as_double(p.input));
    E.push_back(as_double(p.grad_output));
  }
  std::int64_t row0 = 0;
  for (std::size_t a = 0; a < passes.size(); ++a) {
    const std::int64_t Ba = X[a].size(0);
    std::int64_t col0 = 0;
    for (std::size_t b = 0; b < passes.size(); ++b) {
      const std::int64_t Bb = X[b].size(0), Sb = X[b].size(1);
      if (b < a) {  // the transpose of a block already computed
        K.narrow(0, row0, Ba).narrow(1, col0, Bb).copy_(K.narrow(0, col0, Bb).narrow(1, row0, Ba).t());
        col0 += Bb;
        continue;
      }
      const at::Tensor Xb = X[b].reshape({Bb * Sb, -1}), Eb = E[b].reshape({Bb * Sb, -1});
      for (std::int64_t i = 0; i < Ba; ++i) {
        const at::Tensor xx = at::mm(X[a][i], Xb.t());  // [S_a, B_b S_b]
        const at::Tensor ee = at::mm(E[a][i], Eb.t());
        at::Tensor kij = (xx * ee).sum(0).view({Bb, Sb}).sum(1);  // [B_b]
        if (bias) kij = kij + at::mv(E[b].sum(1), E[a][i].sum(0));
        K[row0 + i].narrow(0, col0, Bb).copy_(kij);
      }
      col0 += Bb;
    }
    row0 += Ba;
  }
  return K;
}

}  // namespace sorl::learner
