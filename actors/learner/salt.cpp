#include "actors/learner/salt.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace sorl::learner {

void salt_options::validate() const {
  auto fail = [](const char* name, double v, const char* want) {
    throw std::invalid_argument(fmt::format("salt.{} = {} must be {}", name, v, want));
  };
  if (!std::isfinite(eta) || eta <= 0.0 || eta > 1.0) fail("eta", eta, "in (0, 1]");
  if (!std::isfinite(beta) || beta < 0.0) fail("beta", beta, ">= 0");
  if (!std::isfinite(c0) || c0 <= 0.0) fail("c0", c0, "> 0");
  if (!std::isfinite(gamma_max) || gamma_max < 1.0) fail("gamma_max", gamma_max, ">= 1");
}

std::string to_string(salt_noop n) {
  switch (n) {
    case salt_noop::none: return "none";
    case salt_noop::too_few: return "too_few";
    case salt_noop::no_signal: return "no_signal";
    case salt_noop::nonfinite: return "nonfinite";
  }
  return "?";
}

salt_result salt_coefficients(const at::Tensor& K_in, const at::Tensor& a_in, const salt_options& opt) {
  opt.validate();
  if (a_in.dim() != 1) throw std::invalid_argument(fmt::format("salt: coefficients must be [N], got {} dims", a_in.dim()));
  const std::int64_t n = a_in.size(0);
  if (K_in.dim() != 2 || K_in.size(0) != n || K_in.size(1) != n)
    throw std::invalid_argument(fmt::format("salt: Gram matrix must be [{0}, {0}] for {0} coefficients", n));
  if (!at::isFloatingType(K_in.scalar_type()) || !at::isFloatingType(a_in.scalar_type()))
    throw std::invalid_argument("salt: the Gram matrix and the coefficients must be floating point");
  const at::Tensor a = a_in.detach().to(at::kCPU, at::kDouble).contiguous();
  if (!at::isfinite(a).all().item<bool>())
    throw std::invalid_argument("salt: a coefficient (advantage) is NaN or infinite");

  salt_result out;
  out.coefficients = a.clone();
  out.shared = at::zeros_like(a);
  out.residual = a.clone();
  const at::Tensor K = K_in.detach().to(at::kCPU, at::kDouble).contiguous();
  if (!at::isfinite(K).all().item<bool>()) {
    out.noop = salt_noop::nonfinite;
    return out;
  }
  // Only rollouts with a feature take part: the others' coefficients reach no gradient.
  const at::Tensor diag = K.diagonal();
  std::vector<std::int64_t> active;
  for (std::int64_t i = 0; i < n; ++i)
    if (diag[i].item<double>() > 0.0) active.push_back(i);
  if (active.size() < 2) {
    out.noop = salt_noop::too_few;
    return out;
  }
  const at::Tensor idx = at::tensor(active, at::kLong);
  // Symmetrised: rounding in the Gram's two triangles must not skew eigh, which reads one.
  at::Tensor Ka = K.index_select(0, idx).index_select(1, idx);
  Ka = (Ka + Ka.t()) * 0.5;
  const at::Tensor aa = a.index_select(0, idx);
  const double quad = at::dot(aa, at::mv(Ka, aa)).item<double>();
  const double indep = at::dot(aa * aa, Ka.diagonal()).item<double>();
  out.norm_before = std::sqrt(std::max(0.0, quad));
  out.norm_after = out.norm_before;
  if (indep <= 0.0) {
    out.noop = salt_noop::no_signal;
    return out;
  }
  out.cancellation = std::max(0.0, quad) / indep;

  // Dominant rank by energy; eigh's eigenvalues are ascending.
  auto eig = at::linalg_eigh(Ka);
  const at::Tensor lam = std::get<0>(eig).flip({0}).clamp_min(0.0);
  const at::Tensor U = std::get<1>(eig).flip({1});
  const double total = lam.sum().item<double>();
  const auto m = static_cast<std::int64_t>(active.size());
  std::int64_t r = m;
  {
    double acc = 0.0;
    const auto* l = lam.data_ptr<double>();
    for (std::int64_t k = 0; k < m; ++k) {
      acc += l[k];
      if (acc >= opt.eta * total) {
        r = k + 1;
        break;
      }
    }
  }
  out.rank = r;
  const at::Tensor Ur = U.narrow(1, 0, r);
  const at::Tensor as = at::mv(Ur, at::mv(Ur.t(), aa));
  const at::Tensor ar = aa - as;
  out.shared.index_copy_(0, idx, as);
  out.residual.index_copy_(0, idx, ar);
  const double a_norm2 = at::dot(aa, aa).item<double>();
  out.shared_share = at::dot(as, as).item<double>() / a_norm2;

  const double deficit = std::clamp((opt.c0 - out.cancellation) / opt.c0, 0.0, 1.0);
  out.gamma = std::min(opt.gamma_max, 1.0 + opt.beta * deficit);
  if (out.gamma == 1.0) return out;  // a' = a: nothing to split or rescale
  at::Tensor ap = as + out.gamma * ar;
  const double ap_norm2 = at::dot(ap, ap).item<double>();
  if (!(ap_norm2 > 0.0)) {
    out.gamma = 1.0;
    out.noop = salt_noop::no_signal;
    return out;
  }
  ap = ap * std::sqrt(a_norm2 / ap_norm2);
  out.coefficients.index_copy_(0, idx, ap);
  out.norm_after = std::sqrt(std::max(0.0, at::dot(ap, at::mv(Ka, ap)).item<double>()));
  return out;
}

}  // namespace sorl::learner
