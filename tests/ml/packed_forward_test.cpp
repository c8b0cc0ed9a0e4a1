#include "runtime/ml/policy/model.hpp"

#include "tests/ml/policy_test_util.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::full_logits;
using sorl::ml::test::max_abs_diff;
using sorl::ml::test::random_policy;
using sorl::ml::test::small_dims;
using sorl::ml::test::tokens;

namespace {

// Sequences of odd and unequal lengths, one of a single token.
std::vector<std::vector<std::int32_t>> sequences(std::int64_t vocab) {
  return {tokens(5, vocab, 1), tokens(1, vocab, 2), tokens(9, vocab, 3), tokens(4, vocab, 4)};
}

struct packed_input {
  at::Tensor ids;                     // [S]
  std::vector<std::int64_t> lens;
};

packed_input pack(const std::vector<std::vector<std::int32_t>>& seqs) {
  packed_input p;
  std::vector<std::int64_t> flat;
  for (const auto& s : seqs) {
    flat.insert(flat.end(), s.begin(), s.end());
    p.lens.push_back(static_cast<std::int64_t>(s.size()));
  }
  p.ids = at::tensor(flat, at::kLong);
  return p;
}

// Right-padded [B, L] ids and mask of the same sequences, as the learner's padded path has them.
std::pair<at::Tensor, at::Tensor> pad(const std::vector<std::vector<std::int32_t>>& seqs) {
  std::int64_t L = 0;
  for (const auto& s : seqs) L = std::max<std::int64_t>(L, static_cast<std::int64_t>(s.size()));
  const auto B = static_cast<std::int64_t>(seqs.size());
  at::Tensor ids = at::zeros({B, L}, at::kLong), mask = at::zeros({B, L}, at::kLong);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < seqs[static_cast<std::size_t>(b)].size(); ++t) {
      ids[b][static_cast<std::int64_t>(t)] = seqs[static_cast<std::size_t>(b)][t];
      mask[b][static_cast<std::int64_t>(t)] = 1;
    }
  return {ids, mask};
}

// Two copies of one random policy that record gradients, computing on the bf16 image or not.
std::pair<policy_model, policy_model> twin_models(const model_dims& d, std::uint64_t seed, bool bf16) {
  policy_model a = random_policy(d, seed);
  policy_model b = a.clone(at::kFloat);
  for (policy_model* m : {&a, &b}) {
    m->set_requires_grad(true);
    m->set_bf16_compute(bf16);
  }
  return {std::move(a), std::move(b)};
}

// Every parameter's gradient in a and b, relative to its scale: sums over every position
// round differently.
void check_same_gradients(const policy_model& a, const policy_model& b) {
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    INFO(a.parameters()[i].first);
    const at::Tensor& ga = a.parameters()[i].second.grad();
    const at::Tensor& gb = b.parameters()[i].second.grad();
    REQUIRE(ga.defined());
    REQUIRE(gb.defined());
    CHECK(max_abs_diff(ga, gb) <= 1e-5 * (1.0 + gb.abs().max().item<double>()));
  }
}

}  // namespace

// Logits here are of magnitude ~1-10; the packed and padded passes differ only by fp32 rounding
// of matmuls over other row counts (~1e-6 in practice), as the cached decode does.
constexpr double packed_atol = 1e-4;

TEST_CASE("a packed forward gives every sequence its own logits, positions restarting at 0", "[model][packed]") {
  for (const bool bias : {false, true}) {
    for (const auto attention : {packed_attention::batched, packed_attention::per_sequence}) {
      model_dims d = small_dims();
      d.qkv_bias = bias;
      d.tie_embeddings = !bias;
      policy_model m = random_policy(d, 11);
      m.set_packed_attention(attention);
      const auto seqs = sequences(d.vocab);
      const packed_input p = pack(seqs);
      at::NoGradGuard no_grad;
      const at::Tensor all = m.forward_packed(p.ids, p.lens, at::Tensor());
      REQUIRE(all.sizes() == (std::vector<std::int64_t>{p.ids.size(0), d.vocab}));
      std::int64_t offset = 0;
      for (const auto& s : seqs) {
        const auto n = static_cast<std::int64_t>(s.size());
        CHECK(max_abs_diff(all.narrow(0, offset, n), full_logits(m, s)) <= packed_atol);
        offset += n;
      }
      // Chosen rows only: the same rows of the whole.
      const at::Tensor rows = at::tensor(std::vector<std::int64_t>{18, 0, 5, 7}, at::kLong);
      CHECK(max_abs_diff(m.forward_packed(p.ids, p.lens, rows), all.index_select(0, rows)) <= packed_atol);
      const at::Tensor hidden = m.forward_packed_hidden(p.ids, p.lens, rows);
      CHECK(hidden.sizes() == (std::vector<std::int64_t>{4, d.d_model}));
      CHECK(max_abs_diff(at::linear(hidden, m.lm_head_compute_weight()), all.index_select(0, rows)) <= packed_atol);
    }
  }
}

TEST_CASE("packed and padded forwards give the same gradients, on the bf16 image too", "[model][packed]") {
  for (const bool bf16 : {false, true}) {
    for (const auto attention : {packed_attention::batched, packed_attention::per_sequence}) {
      INFO("bf16 " << bf16 << ", per_sequence " << (attention == packed_attention::per_sequence));
      const model_dims d = small_dims();
      auto [a, b] = twin_models(d, 5, bf16);
      a.set_packed_attention(attention);
      const auto seqs = sequences(d.vocab);
      const packed_input p = pack(seqs);
      const auto [ids, mask] = pad(seqs);
      // Every position's logits weighed by a fixed random tensor.
      const at::Tensor w = at::randn({p.ids.size(0), d.vocab}, at::detail::getDefaultCPUGenerator());
      (a.forward_packed(p.ids, p.lens, at::Tensor()) * w).sum().backward();
      const at::Tensor padded = b.forward(ids, mask);  // [B, L, V]
      std::vector<at::Tensor> real;
      for (std::size_t i = 0; i < seqs.size(); ++i)
        real.push_back(padded[static_cast<std::int64_t>(i)].narrow(0, 0, static_cast<std::int64_t>(seqs[i].size())));
      (at::cat(real, 0) * w).sum().backward();
      check_same_gradients(a, b);
    }
  }
}

TEST_CASE("forward_packed refuses bad lengths, ids and rows", "[model][packed]") {
  const model_dims d = small_dims();
  const policy_model m(d, 3);
  const at::Tensor ids = at::tensor(std::vector<std::int64_t>{1, 2, 3, 4}, at::kLong);
  CHECK_THROWS_AS(m.forward_packed(ids, {2, 1}, at::Tensor()), c10::Error);        // sums to 3, not 4
  CHECK_THROWS_AS(m.forward_packed(ids, {4, 0}, at::Tensor()), c10::Error);        // an empty sequence
  CHECK_THROWS_AS(m.forward_packed(ids, {}, at::Tensor()), c10::Error);
  CHECK_THROWS_AS(m.forward_packed(ids.unsqueeze(0), {4}, at::Tensor()), c10::Error);
  CHECK_THROWS_AS(m.forward_packed(ids + d.vocab, {4}, at::Tensor()), c10::Error);
  CHECK_THROWS_AS(m.forward_packed(ids, {4}, at::tensor(std::vector<std::int64_t>{4}, at::kLong)), c10::Error);
  const at::Tensor long_ids = at::zeros({d.max_seq + 1}, at::kLong);
  CHECK_THROWS_AS(m.forward_packed(long_ids, {d.max_seq + 1}, at::Tensor()), c10::Error);
}

namespace {

// Three sequences that share one prompt of 6 tokens and a fourth with its own, as a learner
// batch of two groups: rows 0-5 the shared prompt, then each sequence's own tokens.
struct shared_input {
  std::vector<std::vector<std::int32_t>> seqs;   // each sequence whole
  at::Tensor ids;                                // [S'] the rows, each prompt once
  std::vector<std::vector<std::int64_t>> rows;   // sequence b's rows
};

shared_input shared_prompts(std::int64_t vocab) {
  const auto prompt = tokens(6, vocab, 7), other = tokens(3, vocab, 8);
  const std::vector<std::vector<std::int32_t>> own{tokens(4, vocab, 9), tokens(1, vocab, 10),
                                                   tokens(7, vocab, 11), tokens(2, vocab, 12)};
  shared_input s;
  std::vector<std::int64_t> flat(prompt.begin(), prompt.end());
  auto add = [&](const std::vector<std::int32_t>& head, std::int64_t head_start, const std::vector<std::int32_t>& tail) {
    std::vector<std::int32_t> whole = head;
    whole.insert(whole.end(), tail.begin(), tail.end());
    s.seqs.push_back(whole);
    std::vector<std::int64_t> r;
    for (std::size_t t = 0; t < head.size(); ++t) r.push_back(head_start + static_cast<std::int64_t>(t));
    for (const std::int32_t tok : tail) {
      r.push_back(static_cast<std::int64_t>(flat.size()));
      flat.push_back(tok);
    }
    s.rows.push_back(r);
  };
  for (int k = 0; k < 3; ++k) add(prompt, 0, own[static_cast<std::size_t>(k)]);
  const auto other_start = static_cast<std::int64_t>(flat.size());
  flat.insert(flat.end(), other.begin(), other.end());
  add(other, other_start, own[3]);
  s.ids = at::tensor(flat, at::kLong);
  return s;
}

}  // namespace

TEST_CASE("a forward over shared prompts gives every sequence the logits it has alone", "[model][packed]") {
  const model_dims d = small_dims();
  policy_model m = random_policy(d, 13);
  const shared_input s = shared_prompts(d.vocab);
  REQUIRE(s.ids.size(0) == 6 + 4 + 1 + 7 + 3 + 2);  // each prompt once
  at::NoGradGuard no_grad;
  const at::Tensor hidden = m.forward_shared_hidden(s.ids, s.rows, at::Tensor());
  REQUIRE(hidden.sizes() == (std::vector<std::int64_t>{s.ids.size(0), d.d_model}));
  const at::Tensor logits = at::linear(hidden, m.lm_head_compute_weight());
  for (std::size_t b = 0; b < s.seqs.size(); ++b) {
    INFO("sequence " << b);
    const at::Tensor mine = logits.index_select(0, at::tensor(s.rows[b], at::kLong));
    CHECK(max_abs_diff(mine, full_logits(m, s.seqs[b])) <= packed_atol);
  }
  // Chosen rows, a shared one twice: the same rows of the whole.
  const at::Tensor rows = at::tensor(std::vector<std::int64_t>{5, 21, 5, 0, 12}, at::kLong);
  CHECK(max_abs_diff(m.forward_shared_hidden(s.ids, s.rows, rows), hidden.index_select(0, rows)) <= packed_atol);
}

TEST_CASE("shared prompts give the gradients of each sequence packed whole", "[model][packed]") {
  for (const bool bf16 : {false, true}) {
    INFO("bf16 " << bf16);
    const model_dims d = small_dims();
    auto [a, b] = twin_models(d, 17, bf16);
    const shared_input s = shared_prompts(d.vocab);
    const packed_input p = pack(s.seqs);
    // Every sequence's every position weighed by a fixed random tensor, read through each
    // sequence's rows on the shared side (a shared row's gradient sums over its readers).
    const at::Tensor w = at::randn({p.ids.size(0), d.vocab}, at::detail::getDefaultCPUGenerator());
    std::vector<std::int64_t> read;
    for (const auto& r : s.rows) read.insert(read.end(), r.begin(), r.end());
    const at::Tensor read_rows = at::tensor(read, at::kLong);
    (at::linear(a.forward_shared_hidden(s.ids, s.rows, read_rows), a.lm_head_compute_weight()) * w).sum().backward();
    (b.forward_packed(p.ids, p.lens, at::Tensor()) * w).sum().backward();
    check_same_gradients(a, b);
  }
}

TEST_CASE("forward_shared_hidden refuses a row read at two positions, an unread row and rows out of range",
          "[model][packed]") {
  const model_dims d = small_dims();
  const policy_model m(d, 3);
  const at::Tensor ids = at::tensor(std::vector<std::int64_t>{1, 2, 3, 4}, at::kLong);
  using rows = std::vector<std::vector<std::int64_t>>;
  CHECK_NOTHROW(m.forward_shared_hidden(ids, rows{{0, 1, 2}, {0, 1, 3}}, at::Tensor()));
  CHECK_THROWS_AS(m.forward_shared_hidden(ids, rows{{0, 1, 2}, {1, 0, 3}}, at::Tensor()), c10::Error);  // 0 at 0 and 1
  CHECK_THROWS_AS(m.forward_shared_hidden(ids, rows{{0, 1, 2}}, at::Tensor()), c10::Error);             // 3 unread
  CHECK_THROWS_AS(m.forward_shared_hidden(ids, rows{{0, 1, 2, 4}, {3}}, at::Tensor()), c10::Error);     // 4 >= S
  CHECK_THROWS_AS(m.forward_shared_hidden(ids, rows{{0, 1}, {}, {2, 3}}, at::Tensor()), c10::Error);    // empty
  CHECK_THROWS_AS(m.forward_shared_hidden(ids, rows{}, at::Tensor()), c10::Error);
  CHECK_THROWS_AS(m.forward_shared_hidden(ids, rows{{0, 1}, {2, 3}}, at::tensor(std::vector<std::int64_t>{4}, at::kLong)),
                  c10::Error);
}
