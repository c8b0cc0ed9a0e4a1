#include "runtime/ml/policy/model.hpp"

#include "tests/ml/policy_test_util.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::full_logits;
using sorl::ml::test::max_abs_diff;
using sorl::ml::test::small_dims;
using sorl::ml::test::small_init_std;

TEST_CASE("the tiny and 50m presets have the stated shapes and parameter counts", "[model]") {
  const model_dims tiny = preset("tiny");
  CHECK(tiny.vocab == 272);
  CHECK(tiny.head_dim() == 32);
  // embed 272*128 + 4 * (attn 128*128*2 + 128*64*2 + mlp 3*128*384 + norms 2*128) + norm 128
  CHECK(tiny.parameter_count() == 34816 + 4 * (32768 + 16384 + 147456 + 256) + 128);
  CHECK(tiny.parameter_count() == 822400);
  const model_dims m50 = preset("50m");
  // embed 272*768 + 8 * (768*768*2 + 768*256*2 + 3*768*2048 + 2*768) + 768
  CHECK(m50.parameter_count() == 208896 + 8 * (1179648 + 393216 + 4718592 + 1536) + 768);
  CHECK(m50.parameter_count() == 50553600);
  CHECK_THROWS_AS(preset("huge"), std::invalid_argument);
}

TEST_CASE("parameter_count equals the sum over parameters, tied or not", "[model]") {
  for (const bool tie : {true, false}) {
    for (const bool bias : {false, true}) {
      model_dims d = small_dims();
      d.tie_embeddings = tie;
      d.qkv_bias = bias;
      const policy_model m(d, 1);
      std::int64_t n = 0;
      for (const auto& p : m.parameters()) n += p.second.numel();
      CHECK(n == d.parameter_count());
    }
  }
}

TEST_CASE("parameters follow Hugging Face Llama names, order and shapes", "[model]") {
  model_dims d = small_dims();
  d.n_layers = 1;
  d.tie_embeddings = false;
  d.qkv_bias = true;
  const policy_model m(d, 1);
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected = {
      {"model.embed_tokens.weight", {40, 32}},
      {"model.layers.0.self_attn.q_proj.weight", {32, 32}},
      {"model.layers.0.self_attn.q_proj.bias", {32}},
      {"model.layers.0.self_attn.k_proj.weight", {16, 32}},
      {"model.layers.0.self_attn.k_proj.bias", {16}},
      {"model.layers.0.self_attn.v_proj.weight", {16, 32}},
      {"model.layers.0.self_attn.v_proj.bias", {16}},
      {"model.layers.0.self_attn.o_proj.weight", {32, 32}},
      {"model.layers.0.mlp.gate_proj.weight", {48, 32}},
      {"model.layers.0.mlp.up_proj.weight", {48, 32}},
      {"model.layers.0.mlp.down_proj.weight", {32, 48}},
      {"model.layers.0.input_layernorm.weight", {32}},
      {"model.layers.0.post_attention_layernorm.weight", {32}},
      {"model.norm.weight", {32}},
      {"lm_head.weight", {40, 32}},
  };
  REQUIRE(m.parameters().size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(m.parameters()[i].first == expected[i].first);
    CHECK(m.parameters()[i].second.sizes().vec() == expected[i].second);
    CHECK(m.parameters()[i].second.scalar_type() == at::kFloat);
  }
  CHECK(m.parameter("model.norm.weight").sum().item<double>() == 32.0);
  CHECK_THROWS_AS(m.parameter("model.nope"), std::out_of_range);

  d.tie_embeddings = true;
  const policy_model tied(d, 1);
  CHECK(tied.parameters().back().first == "model.norm.weight");
}

TEST_CASE("inconsistent dims are rejected naming the field", "[model]") {
  model_dims d = small_dims();
  d.n_kv_heads = 3;
  CHECK_THROWS_WITH(d.validate(), Catch::Contains("n_kv_heads"));
  d = small_dims();
  d.d_model = 30;
  CHECK_THROWS_WITH(d.validate(), Catch::Contains("d_model"));
  d = small_dims();
  d.n_heads = 16;  // head_dim 2 is fine; 32 / 32 = 1 is odd
  d.n_kv_heads = 16;
  CHECK_NOTHROW(d.validate());
  d.n_heads = 32;
  d.n_kv_heads = 32;
  CHECK_THROWS_WITH(d.validate(), Catch::Contains("even"));
  d = small_dims();
  d.vocab = 0;
  CHECK_THROWS_WITH(policy_model(d, 1), Catch::Contains("vocab"));
}

TEST_CASE("rms_norm matches a hand-computed value", "[model]") {
  const at::Tensor x = at::tensor({3.0f, 4.0f});
  const at::Tensor w = at::tensor({1.0f, 2.0f});
  const at::Tensor y = rms_norm(x, w, 0.0);
  // mean square 12.5: [3, 8] / sqrt(12.5)
  CHECK(y[0].item<double>() == Approx(3.0 / std::sqrt(12.5)).epsilon(1e-6));
  CHECK(y[1].item<double>() == Approx(8.0 / std::sqrt(12.5)).epsilon(1e-6));
}

TEST_CASE("rope rotates each frequency pair by position times its frequency", "[model]") {
  // head_dim 4, theta 100: frequencies 1 and 100^(-1/2) = 0.1.
  const auto [cos, sin] = rope_tables(8, 4, 100.0);
  CHECK(cos.sizes().vec() == std::vector<std::int64_t>{8, 2});
  CHECK(cos[3][0].item<double>() == Approx(std::cos(3.0)).margin(1e-7));
  CHECK(sin[3][1].item<double>() == Approx(std::sin(0.3)).margin(1e-7));
  // x = (x1 | x2) = (1, 0 | 0, 1) at position 2: pair 0 = (1, 0) -> (cos 2, sin 2),
  // pair 1 = (0, 1) -> (-sin 0.2, cos 0.2), laid out as (re0, re1 | im0, im1).
  const at::Tensor x = at::tensor({1.0f, 0.0f, 0.0f, 1.0f}).view({1, 1, 4});  // [pos, heads, hd]
  const at::Tensor y = apply_rope(x, cos.narrow(0, 2, 1), sin.narrow(0, 2, 1)).view({4});
  CHECK(y[0].item<double>() == Approx(std::cos(2.0)).margin(1e-6));
  CHECK(y[1].item<double>() == Approx(-std::sin(0.2)).margin(1e-6));
  CHECK(y[2].item<double>() == Approx(std::sin(2.0)).margin(1e-6));
  CHECK(y[3].item<double>() == Approx(std::cos(0.2)).margin(1e-6));
}

TEST_CASE("rope attention scores depend only on relative position", "[model]") {
  const auto [cos, sin] = rope_tables(32, 8, 10000.0);
  const at::Tensor q = at::tensor({0.3f, -1.0f, 0.5f, 2.0f, 1.5f, 0.1f, -0.7f, 0.2f}).view({1, 1, 8});
  const at::Tensor k = at::tensor({1.0f, 0.4f, -0.2f, 0.6f, 0.9f, -1.1f, 0.3f, 0.8f}).view({1, 1, 8});
  auto score = [&](std::int64_t m, std::int64_t n) {
    const at::Tensor qm = apply_rope(q, cos.narrow(0, m, 1), sin.narrow(0, m, 1));
    const at::Tensor kn = apply_rope(k, cos.narrow(0, n, 1), sin.narrow(0, n, 1));
    return (qm * kn).sum().item<double>();
  };
  CHECK(score(5, 2) == Approx(score(20, 17)).margin(1e-5));
  CHECK(score(5, 2) != Approx(score(5, 4)).margin(1e-3));
}

TEST_CASE("with zeroed attention and MLP outputs the model is embedding, norm and head", "[model]") {
  const model_dims d = small_dims();
  policy_model m(d, 3, small_init_std);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, t] : m.parameters())
      if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos) t.zero_();
  }
  const std::vector<std::int32_t> toks = {1, 7, 7, 30};
  const at::Tensor logits = full_logits(m, toks);
  const at::Tensor emb = m.parameter("model.embed_tokens.weight");
  const at::Tensor h = emb.index_select(0, sorl::ml::test::ids_of(toks).squeeze(0));
  const at::Tensor expected = at::matmul(rms_norm(h, m.parameter("model.norm.weight"), d.norm_eps), emb.t());
  CHECK(max_abs_diff(logits, expected) < 1e-5);
  // Positions and context play no part: the two 7s give the same row.
  CHECK(max_abs_diff(logits[1], logits[2]) == 0.0);
}

TEST_CASE("the forward is causal", "[model]") {
  const policy_model m(small_dims(), 4, small_init_std);
  const at::Tensor a = full_logits(m, {3, 9, 27, 1, 5});
  const at::Tensor b = full_logits(m, {3, 9, 27, 2, 6});
  CHECK(max_abs_diff(a.narrow(0, 0, 3), b.narrow(0, 0, 3)) < 1e-6);
  CHECK(max_abs_diff(a.narrow(0, 3, 2), b.narrow(0, 3, 2)) > 1e-2);
}

TEST_CASE("left and right padding leave the logits of real tokens unchanged", "[model]") {
  const policy_model m(small_dims(), 5, small_init_std);
  const std::vector<std::int32_t> toks = {11, 2, 35, 8};
  const at::Tensor ref = full_logits(m, toks);
  const at::Tensor ids = at::tensor({0, 0, 11, 2, 35, 8,  /*row 2*/ 11, 2, 35, 8, 0, 0}, at::kLong).view({2, 6});
  const at::Tensor mask = at::tensor({0, 0, 1, 1, 1, 1, /*row 2*/ 1, 1, 1, 1, 0, 0}, at::kLong).view({2, 6});
  at::NoGradGuard no_grad;
  const at::Tensor out = m.forward(ids, mask);
  CHECK(out.sizes().vec() == std::vector<std::int64_t>{2, 6, 40});
  CHECK(max_abs_diff(out[0].narrow(0, 2, 4), ref) < sorl::ml::test::logits_atol);
  CHECK(max_abs_diff(out[1].narrow(0, 0, 4), ref) < sorl::ml::test::logits_atol);
  CHECK(at::isfinite(out).all().item<bool>());
}

TEST_CASE("gradients reach every parameter", "[model]") {
  model_dims d = small_dims();
  d.tie_embeddings = false;
  d.qkv_bias = true;
  policy_model m(d, 6, small_init_std);
  m.set_requires_grad(true);
  const at::Tensor ids = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3});
  const at::Tensor logits = m.forward(ids);
  at::log_softmax(logits, -1).select(-1, 7).sum().backward();
  for (const auto& [name, t] : m.parameters()) {
    INFO(name);
    REQUIRE(t.grad().defined());
    CHECK(t.grad().abs().sum().item<double>() > 0.0);
  }
}

TEST_CASE("a bf16 rollout copy holds rounded weights and follows in-place updates", "[model]") {
  const policy_model train(small_dims(), 7, small_init_std);
  const policy_model roll = train.clone(at::kBFloat16);
  REQUIRE(roll.weight_dtype() == at::kBFloat16);
  REQUIRE(roll.parameters().size() == train.parameters().size());
  for (std::size_t i = 0; i < train.parameters().size(); ++i) {
    CHECK(roll.parameters()[i].second.scalar_type() == at::kBFloat16);
    CHECK(at::equal(roll.parameters()[i].second, train.parameters()[i].second.to(at::kBFloat16)));
  }
  // The fp32 compute image of the bf16 weights is exact: an fp32 model holding the rounded
  // values computes the same logits.
  const policy_model rounded = roll.clone(at::kFloat);
  const std::vector<std::int32_t> toks = {4, 8, 15, 16, 23};
  CHECK(max_abs_diff(full_logits(roll, toks), full_logits(rounded, toks)) == 0.0);
  CHECK(max_abs_diff(full_logits(roll, toks), full_logits(train, toks)) > 0.0);

  // A weight sync writes into the bf16 tensors in place; the next forward sees it.
  policy_model roll2 = train.clone(at::kBFloat16);
  const policy_model other(small_dims(), 8, small_init_std);
  {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < other.parameters().size(); ++i)
      roll2.parameters()[i].second.copy_(other.parameters()[i].second);
  }
  const policy_model other_rounded = other.clone(at::kBFloat16).clone(at::kFloat);
  CHECK(max_abs_diff(full_logits(roll2, toks), full_logits(other_rounded, toks)) == 0.0);

  policy_model roll3 = train.clone(at::kBFloat16);
  roll3.copy_weights_from(other);
  CHECK(max_abs_diff(full_logits(roll3, toks), full_logits(other_rounded, toks)) == 0.0);
  CHECK_THROWS(roll3.set_requires_grad(true));
}

TEST_CASE("forward rejects malformed input naming the values", "[model]") {
  const policy_model m(small_dims(), 9);
  CHECK_THROWS_WITH(m.forward(at::tensor({1, 40}, at::kLong).view({1, 2})), Catch::Contains("max 40"));
  CHECK_THROWS_WITH(m.forward(at::tensor({1, 2}, at::kLong)), Catch::Contains("[batch, seq]"));
  CHECK_THROWS_WITH(m.forward(at::zeros({1, 65}, at::kLong)), Catch::Contains("max_seq"));
  CHECK_THROWS_WITH(m.forward(at::zeros({2, 3}, at::kLong), at::ones({2, 4}, at::kLong)),
                    Catch::Contains("attention_mask"));
  CHECK_THROWS_WITH(m.forward(at::zeros({1, 3}, at::kFloat)), Catch::Contains("integer"));
}

TEST_CASE("forward_rows gives forward's logits at the chosen positions and their gradients", "[model]") {
  policy_model m(small_dims(), 8, small_init_std);
  m.set_requires_grad(true);
  const at::Tensor ids = at::tensor({0, 0, 11, 2, 35, 8, /*row 2*/ 11, 2, 35, 8, 4, 0}, at::kLong).view({2, 6});
  const at::Tensor mask = at::tensor({0, 0, 1, 1, 1, 1, /*row 2*/ 1, 1, 1, 1, 1, 0}, at::kLong).view({2, 6});
  const at::Tensor rows = at::tensor({3, 5, /*row 2*/ 0, 4}, at::kLong).view({2, 2});
  const at::Tensor all = m.forward(ids, mask);
  const at::Tensor picked = all.gather(1, rows.unsqueeze(-1).expand({2, 2, 40}));
  const at::Tensor some = m.forward_rows(ids, mask, rows);
  REQUIRE(some.sizes().vec() == std::vector<std::int64_t>{2, 2, 40});
  CHECK(max_abs_diff(some, picked) < 1e-6);
  // The same loss through either path gives the same gradients.
  auto grads_of = [&](const at::Tensor& logits) {
    for (auto& [name, t] : m.parameters())
      if (t.grad().defined())
        t.mutable_grad().zero_();
    at::log_softmax(logits, -1).select(-1, 7).sum().backward();
    std::vector<at::Tensor> g;
    for (const auto& [name, t] : m.parameters())
      g.push_back(t.grad().clone());
    return g;
  };
  const auto g_all = grads_of(picked);
  const auto g_some = grads_of(some);
  for (std::size_t i = 0; i < g_all.size(); ++i)
    CHECK(max_abs_diff(g_all[i], g_some[i]) < 1e-5);
  CHECK_THROWS_AS(m.forward_rows(ids, mask, at::tensor({6, 0, 0, 0}, at::kLong).view({2, 2})), c10::Error);
  CHECK_THROWS_AS(m.forward_rows(ids, mask, at::tensor({1, 2}, at::kLong).view({1, 2})), c10::Error);
  CHECK_THROWS_AS(m.forward_rows(ids, mask, rows.to(at::kInt)), c10::Error);
}
