#pragma once

// Shared fixtures for the policy-model tests: a model small enough that every test runs in
// milliseconds, with weights large enough (std 0.3) that attention is far from uniform, so a
// wrong mask or position shows up in the logits.

#include "runtime/ml/policy/model.hpp"

#include "runtime/ml/policy/torch_compat.hpp"

#include <cstdint>
#include <vector>

namespace sorl::ml::test {

inline model_dims small_dims() {
  model_dims d;
  d.vocab = 40;
  d.d_model = 32;
  d.n_layers = 2;
  d.n_heads = 4;
  d.n_kv_heads = 2;
  d.d_ff = 48;
  d.max_seq = 64;
  return d;
}

inline constexpr double small_init_std = 0.3;

/// Incremental and full forward differ only by fp32 summation order; their logits here are of
/// magnitude ~1-10 and agree to ~1e-6 in practice. 1e-4 leaves room for other BLAS builds.
inline constexpr double logits_atol = 1e-4;

/// [1, n] int64 ids of a token list.
inline at::Tensor ids_of(const std::vector<std::int32_t>& toks) {
  return at::tensor(std::vector<std::int64_t>(toks.begin(), toks.end()), at::kLong).unsqueeze(0);
}

/// Full-forward logits of one sequence: [n, vocab] fp32.
inline at::Tensor full_logits(const policy_model& m, const std::vector<std::int32_t>& toks) {
  at::NoGradGuard no_grad;
  return m.forward(ids_of(toks)).squeeze(0);
}

/// Pseudo-random token list of length n, deterministic in `salt`.
inline std::vector<std::int32_t> tokens(std::int64_t n, std::int64_t vocab, std::uint32_t salt) {
  std::vector<std::int32_t> out;
  std::uint32_t x = salt * 2654435761u + 12345u;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab)));
  }
  return out;
}

/// A model of `d` whose every parameter is random: weights as small_init_std gives them, and
/// the 1-D ones (norm weights, biases; constant at init) ~ N(1, 0.3^2), so that a norm or bias
/// that is dropped or swapped shows in the logits.
inline policy_model random_policy(const model_dims& d, std::uint64_t seed) {
  policy_model m(d, seed, small_init_std);
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : m.parameters())
    if (t.dim() == 1) t.normal_(1.0, 0.3);
  return m;
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace sorl::ml::test
