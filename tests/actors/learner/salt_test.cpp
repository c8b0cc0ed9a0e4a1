// SALT in the learner: the coefficient reweighting on hand-computed Gram matrices and its
// degenerate cases (actors/learner/salt.hpp), the Gram matrix of per-rollout gradients against
// autograd's per-sample gradients (actors/learner/grad_gram.hpp, rollout_gradient_gram), and
// train_step with SALT on against the plain step.

#include "actors/learner/grad_gram.hpp"
#include "actors/learner/learner_core.hpp"
#include "actors/learner/salt.hpp"
#include "tests/ml/policy_test_util.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace sorl;
using namespace sorl::learner;

namespace {

at::Tensor vec(std::vector<double> v) { return at::tensor(v, at::kDouble); }

at::Tensor mat(const std::vector<std::vector<double>>& rows) {
  std::vector<at::Tensor> r;
  for (const auto& row : rows) r.push_back(vec(row));
  return at::stack(r);
}

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).norm().item<double>() / want.norm().item<double>();
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

}  // namespace

// -- the coefficients ----------------------------------------------------------------------------

TEST_CASE("SALT splits, amplifies and rescales the coefficients as computed by hand") {
  // K = 11ᵀ + I: a shared direction (eigenvalue 4, u = 1/√3) over independent residuals (1, 1).
  const at::Tensor K = mat({{2, 1, 1}, {1, 2, 1}, {1, 1, 2}});
  const at::Tensor a = vec({2, 0, -1});
  salt_options o;
  o.eta = 0.6;  // 4 / 6 of the energy is in the first eigenvalue: r = 1
  o.beta = 1.0;
  o.c0 = 1.0;
  o.gamma_max = 3.0;
  const salt_result r = salt_coefficients(K, a, o);
  CHECK(r.noop == salt_noop::none);
  CHECK(r.rank == 1);
  // Ka = (3, 1, 0): aᵀKa = 6; Σ a_i² K_ii = 2 · 5 = 10.
  CHECK(r.cancellation == Approx(0.6).epsilon(1e-12));
  CHECK(r.norm_before == Approx(std::sqrt(6.0)).epsilon(1e-12));
  // γ = 1 + β (c0 − c) / c0 = 1.4.
  CHECK(r.gamma == Approx(1.4).epsilon(1e-12));
  // a_s = mean(a) · 1 = 1/3 each, a_r = (5/3, −1/3, −4/3).
  CHECK(rel_error(r.shared, vec({1.0 / 3, 1.0 / 3, 1.0 / 3})) < 1e-12);
  CHECK(rel_error(r.residual, vec({5.0 / 3, -1.0 / 3, -4.0 / 3})) < 1e-12);
  CHECK(r.shared_share == Approx((1.0 / 3) / 5.0).epsilon(1e-12));  // ‖a_s‖² = 1/3 of ‖a‖² = 5
  // a_s + 1.4 a_r = (8/3, −0.4/3, −4.6/3), ‖·‖² = 85.32 / 9, rescaled to ‖a‖² = 5.
  const double scale = std::sqrt(5.0 / (85.32 / 9.0));
  const at::Tensor want = vec({8.0 / 3 * scale, -0.4 / 3 * scale, -4.6 / 3 * scale});
  CHECK(rel_error(r.coefficients, want) < 1e-12);
  CHECK(r.coefficients.norm().item<double>() == Approx(std::sqrt(5.0)).epsilon(1e-12));
  const double after = at::dot(want, at::mv(K, want)).item<double>();
  CHECK(r.norm_after == Approx(std::sqrt(after)).epsilon(1e-12));
}

TEST_CASE("a = a_s + a_r with a_sᵀ a_r = 0 and γ within [1, γ_max], on random geometries") {
  at::manual_seed(7);
  for (int trial = 0; trial < 50; ++trial) {
    const std::int64_t n = 2 + trial % 9, p = 1 + trial % 5;
    // Low-rank shared part plus small residuals: the geometry SALT targets.
    const at::Tensor G = at::randn({n, p}, at::kDouble).matmul(at::randn({p, 64}, at::kDouble)) +
                         0.1 * at::randn({n, 64}, at::kDouble);
    const at::Tensor K = G.matmul(G.t());
    const at::Tensor a = at::randn({n}, at::kDouble);
    salt_options o;
    o.eta = 0.5 + 0.05 * (trial % 10);
    o.beta = 0.5 * (trial % 7);
    o.c0 = 0.2 + 0.1 * (trial % 8);
    o.gamma_max = 1.0 + 0.5 * (trial % 4);
    const salt_result r = salt_coefficients(K, a, o);
    INFO("trial " << trial);
    REQUIRE(r.noop == salt_noop::none);
    CHECK((r.shared + r.residual - a).abs().max().item<double>() < 1e-12);
    CHECK(std::abs(at::dot(r.shared, r.residual).item<double>()) < 1e-10 * a.dot(a).item<double>());
    CHECK(r.gamma >= 1.0);
    CHECK(r.gamma <= o.gamma_max);
    CHECK(r.rank >= 1);
    CHECK(r.rank <= n);
    CHECK(std::isfinite(r.norm_after));
    CHECK(r.coefficients.norm().item<double>() == Approx(a.norm().item<double>()).epsilon(1e-12));
    // The rescaled coefficients are a_s + γ a_r up to one positive factor.
    const at::Tensor unscaled = r.shared + r.gamma * r.residual;
    const double factor = r.coefficients.norm().item<double>() / unscaled.norm().item<double>();
    CHECK((r.coefficients - factor * unscaled).abs().max().item<double>() < 1e-10);
  }
}

TEST_CASE("without amplification the coefficients are the advantages bit for bit") {
  const at::Tensor K = mat({{2, 1, 1}, {1, 2, 1}, {1, 1, 2}});
  const at::Tensor a = vec({0.3, -1.7, 1.1});
  salt_options o;
  o.beta = 0.0;
  const salt_result off = salt_coefficients(K, a, o);
  CHECK(off.gamma == 1.0);
  CHECK(bitwise_equal(off.coefficients, a));
  // c ≥ c₀: no amplification either.
  salt_options low;
  low.c0 = 1e-6;
  const salt_result none = salt_coefficients(K, a, low);
  CHECK(none.noop == salt_noop::none);
  CHECK(none.gamma == 1.0);
  CHECK(bitwise_equal(none.coefficients, a));
}

TEST_CASE("degenerate Gram matrices and coefficients give a no-op or a clear error, never NaN") {
  salt_options o;
  SECTION("all-zero advantages") {
    const salt_result r = salt_coefficients(mat({{1, 0.5}, {0.5, 1}}), vec({0, 0}), o);
    CHECK(r.noop == salt_noop::no_signal);
    CHECK(r.gamma == 1.0);
    CHECK(bitwise_equal(r.coefficients, vec({0, 0})));
  }
  SECTION("a zero Gram matrix (rank 0)") {
    const salt_result r = salt_coefficients(at::zeros({3, 3}, at::kDouble), vec({1, -1, 0.5}), o);
    CHECK(r.noop == salt_noop::too_few);
    CHECK(bitwise_equal(r.coefficients, vec({1, -1, 0.5})));
  }
  SECTION("one rollout") {
    const salt_result r = salt_coefficients(mat({{4}}), vec({1.5}), o);
    CHECK(r.noop == salt_noop::too_few);
    CHECK(bitwise_equal(r.coefficients, vec({1.5})));
  }
  SECTION("no rollouts") {
    const salt_result r = salt_coefficients(at::zeros({0, 0}, at::kDouble), at::zeros({0}, at::kDouble), o);
    CHECK(r.noop == salt_noop::too_few);
    CHECK(r.coefficients.numel() == 0);
  }
  SECTION("duplicate rollouts: K of rank 1, fully cancelling") {
    // g_1 = g_2 = g_3 with advantages summing to 0: Σ a_i g_i = 0 exactly, c = 0.
    const salt_result r = salt_coefficients(at::ones({3, 3}, at::kDouble), vec({1, -0.5, -0.5}), o);
    CHECK(r.noop == salt_noop::none);
    CHECK(r.rank == 1);
    CHECK(r.cancellation == Approx(0.0).margin(1e-12));
    CHECK(r.gamma == Approx(1.0 + o.beta).epsilon(1e-12));
    CHECK(at::isfinite(r.coefficients).all().item<bool>());
    CHECK(r.coefficients.norm().item<double>() == Approx(vec({1, -0.5, -0.5}).norm().item<double>()));
  }
  SECTION("a rollout without a gradient keeps its coefficient and stays out of the split") {
    const salt_result r =
        salt_coefficients(mat({{2, 1, 0}, {1, 2, 0}, {0, 0, 0}}), vec({1, -1, 0.75}), o);
    CHECK(r.noop == salt_noop::none);
    CHECK(r.coefficients[2].item<double>() == 0.75);
    CHECK(r.shared[2].item<double>() == 0.0);
  }
  SECTION("a non-finite Gram matrix") {
    at::Tensor K = mat({{1, 0}, {0, 1}});
    K[0][1] = std::numeric_limits<double>::quiet_NaN();
    const salt_result r = salt_coefficients(K, vec({1, -1}), o);
    CHECK(r.noop == salt_noop::nonfinite);
    CHECK(bitwise_equal(r.coefficients, vec({1, -1})));
  }
  SECTION("bad inputs are refused") {
    CHECK_THROWS_AS(salt_coefficients(mat({{1, 0}, {0, 1}}), vec({1, std::nan("")}), o), std::invalid_argument);
    CHECK_THROWS_AS(salt_coefficients(mat({{1, 0}, {0, 1}}), vec({1, 2, 3}), o), std::invalid_argument);
    salt_options bad;
    bad.eta = 0.0;
    CHECK_THROWS_WITH(salt_coefficients(mat({{1, 0}, {0, 1}}), vec({1, -1}), bad), "salt.eta = 0 must be in (0, 1]");
    bad = {};
    bad.gamma_max = 0.5;
    CHECK_THROWS_AS(salt_coefficients(mat({{1, 0}, {0, 1}}), vec({1, -1}), bad), std::invalid_argument);
  }
}

// -- the Gram matrix ----------------------------------------------------------------------------

namespace {

ml::model_dims gram_dims(bool tied, bool bias) {
  ml::model_dims d;
  d.vocab = 40;
  d.d_model = 16;
  d.n_layers = 2;
  d.n_heads = 4;
  d.n_kv_heads = 2;
  d.d_ff = 24;
  d.max_seq = 64;
  d.tie_embeddings = tied;
  d.qkv_bias = bias;
  return d;
}

using ml::test::tokens;

/// Two groups of three of varying prompt and response lengths; the responses of the first
/// group have environment tokens (mask 0) in the middle, as multi-turn episodes do, and one
/// sample has no trained token at all.
std::vector<rollout_sample> gram_batch(std::int64_t vocab) {
  std::vector<rollout_sample> batch;
  for (int g = 0; g < 2; ++g)
    for (int k = 0; k < 3; ++k) {
      rollout_sample s;
      s.group_id = static_cast<std::uint64_t>(g);
      s.prompt = tokens(4 + static_cast<std::size_t>(g * 3), vocab, 100u + static_cast<std::uint32_t>(g));
      s.response = tokens(5 + static_cast<std::size_t>(k * 3 + g), vocab, static_cast<std::uint32_t>(g * 10 + k));
      s.loss_mask.assign(s.response.size(), 1);
      if (g == 0)
        for (std::size_t t = 2; t < 4 && t < s.response.size(); ++t) s.loss_mask[t] = 0;
      if (g == 1 && k == 2) s.loss_mask.assign(s.response.size(), 0);
      s.sampling_logprobs.assign(s.response.size(), 0.0f);
      s.reward = static_cast<float>(k % 2);
      batch.push_back(std::move(s));
    }
  return batch;
}

/// The reference: g_i from autograd, one backward per sample of its own objective term, over
/// the parameters that enter K; their Gram in fp64.
at::Tensor explicit_gram(const ml::policy_model& model, const std::vector<rollout_sample>& batch,
                         const learner_options& o, const std::vector<std::string>& names) {
  const at::Tensor logp = response_logprobs_tensor(model, batch, o.temperature);  // [N, T]
  const auto n = static_cast<std::int64_t>(batch.size());
  at::Tensor mask = at::zeros_like(logp);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::size_t t = 0; t < batch[static_cast<std::size_t>(i)].loss_mask.size(); ++t)
      mask[i][static_cast<std::int64_t>(t)] = static_cast<double>(batch[static_cast<std::size_t>(i)].loss_mask[t]);
  at::Tensor w;
  if (o.loss.norm == loss_norm::token) {
    w = mask / mask.sum();
  } else {
    const at::Tensor per = mask.sum(1, true);
    const double seqs = per.gt(0).sum().item<double>();
    w = mask / (per.clamp_min(1.0) * seqs);
  }
  std::vector<at::Tensor> params;
  for (const auto& name : names) params.push_back(model.parameter(name));
  std::vector<at::Tensor> rows;
  for (std::int64_t i = 0; i < n; ++i) {
    const at::Tensor term = (logp[i] * w[i]).sum();
    const auto g = torch::autograd::grad({term}, params, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
    std::vector<at::Tensor> flat;
    for (std::size_t k = 0; k < g.size(); ++k)
      flat.push_back(g[k].defined() ? g[k].reshape({-1}).to(at::kDouble) : at::zeros({params[k].numel()}, at::kDouble));
    rows.push_back(at::cat(flat));
  }
  const at::Tensor F = at::stack(rows);
  return F.matmul(F.t());
}

/// Names of the weights that enter K for `last` decoder layers (−1 = all) and an untied head.
std::vector<std::string> gram_names(const ml::model_dims& d, std::int64_t last) {
  std::vector<std::string> names;
  const std::int64_t first = last < 0 ? 0 : d.n_layers - last;
  for (std::int64_t l = first; l < d.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}) {
      names.push_back(p + m + ".weight");
      if (d.qkv_bias) names.push_back(p + m + ".bias");
    }
    for (const char* m : {"self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      names.push_back(p + m + ".weight");
  }
  names.push_back("lm_head.weight");
  return names;
}

}  // namespace

TEST_CASE("the Gram matrix without per-sample gradients equals autograd's per-sample Gram") {
  const bool bias = GENERATE(false, true);
  const auto norm = GENERATE(loss_norm::token, loss_norm::sequence);
  const auto method = GENERATE(gram_method::ghost, gram_method::materialized);
  const std::int64_t budget = GENERATE(std::int64_t{0}, std::int64_t{40});  // one forward, or several
  const std::int64_t last = GENERATE(std::int64_t{-1}, std::int64_t{1}, std::int64_t{0});
  const ml::model_dims d = gram_dims(/*tied=*/false, bias);
  ml::policy_model model(d, 5);
  model.set_requires_grad(true);
  const auto batch = gram_batch(d.vocab);
  learner_options o;
  o.loss.norm = norm;
  o.salt_gram = method;
  o.micro_batch_tokens = budget;
  o.salt_layers = last;
  o.temperature = 0.8;
  INFO("bias " << bias << " sequence " << (norm == loss_norm::sequence) << " ghost " << (method == gram_method::ghost)
               << " budget " << budget << " last " << last);
  const at::Tensor K = rollout_gradient_gram(model, batch, o);
  const at::Tensor want = explicit_gram(model, batch, o, gram_names(d, last));
  REQUIRE(K.sizes() == want.sizes());
  CHECK(rel_error(K, want) <= 1e-5);
  // The sample without a trained token has no feature.
  CHECK(K[5].abs().max().item<double>() == 0.0);
}

TEST_CASE("ghost and materialized Gram matrices of one layer agree, biases and several passes included") {
  at::manual_seed(3);
  std::vector<layer_pass> passes;
  for (int k = 0; k < 3; ++k) passes.push_back({at::randn({2 + k, 5 + k, 7}), at::randn({2 + k, 5 + k, 3}), true});
  const at::Tensor ghost = layer_gram(passes, gram_method::ghost);
  const at::Tensor mat_ = layer_gram(passes, gram_method::materialized);
  CHECK(ghost.sizes() == std::vector<std::int64_t>{9, 9});
  CHECK(rel_error(ghost, mat_) < 1e-12);
  CHECK((ghost - ghost.t()).abs().max().item<double>() <= 1e-12 * ghost.abs().max().item<double>());
  // One entry by hand: G_i = E_iᵀ X_i, b_i = Σ_s E_i[s].
  const at::Tensor X = passes[1].input[1].to(at::kDouble), E = passes[1].grad_output[1].to(at::kDouble);
  const at::Tensor Y = passes[2].input[0].to(at::kDouble), F = passes[2].grad_output[0].to(at::kDouble);
  const double want = (E.t().matmul(X) * F.t().matmul(Y)).sum().item<double>() + E.sum(0).dot(F.sum(0)).item<double>();
  CHECK(ghost[3][5].item<double>() == Approx(want).epsilon(1e-12));
  // Long sequences in a narrow layer: materializing is cheaper; short ones in a wide layer: ghost.
  CHECK(cheaper_gram_method({{at::zeros({4, 512, 8}), at::zeros({4, 512, 8}), false}}) == gram_method::materialized);
  CHECK(cheaper_gram_method({{at::zeros({4, 4, 512}), at::zeros({4, 4, 512}), false}}) == gram_method::ghost);
  CHECK_THROWS_AS(layer_gram({{at::zeros({2, 3, 4}), at::zeros({2, 4, 4}), false}}), std::invalid_argument);
  CHECK_THROWS_AS(layer_gram({{at::zeros({2, 3, 4}), at::zeros({2, 3, 4}), false},
                              {at::zeros({2, 3, 5}), at::zeros({2, 3, 4}), false}}),
                  std::invalid_argument);
}

// -- train_step with SALT ------------------------------------------------------------------------

namespace {

std::vector<at::Tensor> snapshot(const ml::policy_model& m) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : m.parameters()) out.push_back(t.detach().clone());
  return out;
}

bool same_weights(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!bitwise_equal(a[i], b[i])) return false;
  return true;
}

/// One train_step from the same weights with `o`; the weights after it and the metrics.
std::pair<std::vector<at::Tensor>, step_metrics> step_with(const learner_options& o,
                                                           const std::vector<rollout_sample>& batch) {
  ml::policy_model model(gram_dims(/*tied=*/true, false), 11);
  model.set_requires_grad(true);
  learner_core core(model, o, 1);
  const step_metrics m = core.train_step(batch);
  return {snapshot(model), m};
}

}  // namespace

TEST_CASE("SALT without amplification is the plain GRPO / DAPO step bit for bit") {
  const int minibatches = GENERATE(1, 2);
  const auto norm = GENERATE(loss_norm::token, loss_norm::sequence);
  // 4096 tokens: each minibatch is one micro-batch, whose forward SALT and the update share;
  // 40: several, and SALT runs forwards of its own.
  const std::int64_t micro_tokens = GENERATE(4096, 40);
  const auto batch = gram_batch(40);
  learner_options plain;
  // With SALT on the learner's forwards are padded (learner_options::packed_forward); the
  // packed ones agree with them up to fp32 rounding only.
  plain.packed_forward = false;
  plain.lr = 1e-2;
  plain.minibatches = minibatches;
  plain.loss.norm = norm;
  plain.micro_batch_tokens = micro_tokens;
  learner_options salt = plain;
  salt.salt_enabled = true;
  salt.salt.beta = 0.0;
  const auto [w_plain, m_plain] = step_with(plain, batch);
  const auto [w_salt, m_salt] = step_with(salt, batch);
  INFO("minibatches " << minibatches << ", micro_batch_tokens " << micro_tokens);
  CHECK(same_weights(w_plain, w_salt));
  CHECK(m_plain.loss == m_salt.loss);
  CHECK(m_plain.salt_updates == 0);
  CHECK(m_salt.salt_updates == minibatches);
  CHECK(m_salt.salt_gamma == 1.0);
  CHECK(m_salt.salt_norm_after == m_salt.salt_norm_before);
}

TEST_CASE("SALT with amplification changes the update and reports its geometry") {
  const std::int64_t layers = GENERATE(0, -1);
  INFO("salt_layers " << layers);
  const auto batch = gram_batch(40);
  learner_options plain;
  plain.lr = 1e-2;
  plain.salt_layers = layers;
  learner_options salt = plain;
  salt.salt_enabled = true;
  salt.salt.beta = 2.0;
  salt.salt.c0 = 10.0;  // above any cancellation of these 6 rollouts: γ > 1
  salt.salt.gamma_max = 2.5;
  const auto [w_plain, m_plain] = step_with(plain, batch);
  const auto [w_salt, m_salt] = step_with(salt, batch);
  CHECK_FALSE(same_weights(w_plain, w_salt));
  CHECK(m_salt.salt_updates == 1);
  CHECK(m_salt.salt_noops == 0);
  CHECK(m_salt.salt_gamma > 1.0);
  CHECK(m_salt.salt_gamma <= 2.5);
  CHECK(m_salt.salt_rank >= 1.0);
  CHECK(m_salt.salt_rank <= 5.0);  // the sample without a trained token stays out
  CHECK(m_salt.salt_cancellation > 0.0);
  CHECK(std::isfinite(m_salt.salt_norm_after));
  CHECK(m_salt.salt_norm_after > 0.0);
  CHECK(m_salt.salt_seconds > 0.0);
  CHECK(m_salt.salt_seconds < m_salt.seconds);
  // The same step twice: deterministic.
  const auto [w_again, m_again] = step_with(salt, batch);
  CHECK(same_weights(w_salt, w_again));
}

TEST_CASE("SALT reweights alike whether its minibatch is one micro-batch or several") {
  // One micro-batch: SALT reads the update's own forward. Several: forwards of its own, and
  // K and the gradient are sums over parts. Only the order of summation differs.
  const int minibatches = GENERATE(1, 2);
  const auto batch = gram_batch(40);
  learner_options one;
  one.lr = 1e-2;
  one.minibatches = minibatches;
  one.salt_enabled = true;
  one.salt_layers = -1;
  one.salt.beta = 2.0;
  one.salt.c0 = 10.0;
  learner_options several = one;
  several.micro_batch_tokens = 40;
  const auto [w_one, m_one] = step_with(one, batch);
  const auto [w_several, m_several] = step_with(several, batch);
  INFO("minibatches " << minibatches);
  CHECK(m_one.salt_gamma > 1.0);
  CHECK(m_several.salt_gamma == Approx(m_one.salt_gamma).epsilon(1e-6));
  CHECK(m_several.salt_cancellation == Approx(m_one.salt_cancellation).epsilon(1e-6));
  CHECK(m_several.salt_rank == m_one.salt_rank);
  const auto before = snapshot(ml::policy_model(gram_dims(/*tied=*/true, false), 11));
  for (std::size_t i = 0; i < w_one.size(); ++i) {
    const double step = (w_one[i] - before[i]).abs().max().item<double>();
    const double gap = (w_one[i] - w_several[i]).abs().max().item<double>();
    CHECK(gap <= 1e-4 * std::max(step, 1e-12));
  }
}

TEST_CASE("SALT's options are validated with the learner's") {
  learner_options o;
  o.salt.c0 = 0.0;
  CHECK_THROWS_WITH(o.validate(), "salt.c0 = 0 must be > 0");
  o = {};
  o.salt_layers = -2;
  CHECK_THROWS_AS(o.validate(), std::invalid_argument);
}
