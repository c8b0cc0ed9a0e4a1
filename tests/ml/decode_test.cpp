// Incremental decoding through the KV cache against the full (training) forward.
#include "runtime/ml/policy/kv_cache.hpp"
#include "runtime/ml/policy/model.hpp"

#include "tests/ml/policy_test_util.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::full_logits;
using sorl::ml::test::logits_atol;
using sorl::ml::test::max_abs_diff;
using sorl::ml::test::small_dims;
using sorl::ml::test::small_init_std;
using sorl::ml::test::tokens;

namespace {

kv_cache_options small_blocks() {
  kv_cache_options o;
  o.block_size = 4;  // small blocks: sequences here span several, and forks split them
  o.initial_blocks = 8;
  return o;
}

std::vector<std::int32_t> concat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("token-by-token decoding matches the full forward", "[decode]") {
  const policy_model m(small_dims(), 11, small_init_std);
  const std::vector<std::int32_t> toks = tokens(20, 40, 1);
  const at::Tensor ref = full_logits(m, toks);
  CHECK(ref.abs().max().item<double>() > 1.0);  // logits are not all near zero
  kv_cache c(m.dims(), small_blocks());
  const seq_id s = c.create();
  double worst = 0.0;
  for (std::size_t t = 0; t < toks.size(); ++t) {
    const at::Tensor row = m.forward_cached(c, {s}, {{toks[t]}});
    REQUIRE(row.sizes().vec() == std::vector<std::int64_t>{1, 40});
    worst = std::max(worst, max_abs_diff(row[0], ref[static_cast<std::int64_t>(t)]));
  }
  CHECK(worst < logits_atol);
  CHECK(c.length(s) == 20);
}

TEST_CASE("a ragged batch decodes like each sequence alone", "[decode]") {
  const policy_model m(small_dims(), 12, small_init_std);
  const std::vector<std::vector<std::int32_t>> prompts = {tokens(3, 40, 2), tokens(7, 40, 3), tokens(12, 40, 4)};
  const std::vector<std::vector<std::int32_t>> conts = {tokens(5, 40, 5), tokens(5, 40, 6), tokens(5, 40, 7)};
  kv_cache c(m.dims(), small_blocks());
  const std::vector<seq_id> s = {c.create(), c.create(), c.create()};
  const at::Tensor first = m.forward_cached(c, s, prompts);  // ragged prefill in one pass
  REQUIRE(first.size(0) == 3);
  std::vector<at::Tensor> rows(3);
  for (std::size_t i = 0; i < 3; ++i) rows[i] = first[static_cast<std::int64_t>(i)].unsqueeze(0);
  for (std::size_t t = 0; t < 5; ++t) {
    const at::Tensor step = m.forward_cached(c, s, {{conts[0][t]}, {conts[1][t]}, {conts[2][t]}});
    for (std::size_t i = 0; i < 3; ++i) rows[i] = at::cat({rows[i], step[static_cast<std::int64_t>(i)].unsqueeze(0)});
  }
  for (std::size_t i = 0; i < 3; ++i) {
    const auto full = concat(prompts[i], conts[i]);
    const at::Tensor ref = full_logits(m, full);
    const auto p = static_cast<std::int64_t>(prompts[i].size());
    // Rows: last prompt position, then each continuation token.
    CHECK(max_abs_diff(rows[i], ref.narrow(0, p - 1, 6)) < logits_atol);
  }
}

TEST_CASE("appending several tokens per sequence in one pass matches the full forward", "[decode]") {
  const policy_model m(small_dims(), 13, small_init_std);
  kv_cache c(m.dims(), small_blocks());
  const std::vector<seq_id> s = {c.create(), c.create(), c.create()};
  const std::vector<std::vector<std::int32_t>> prompts = {tokens(6, 40, 8), tokens(2, 40, 9), tokens(9, 40, 10)};
  m.forward_cached(c, s, prompts);
  const std::vector<std::vector<std::int32_t>> drafts = {tokens(1, 40, 11), tokens(4, 40, 12), tokens(3, 40, 13)};
  const at::Tensor all = m.forward_cached(c, s, drafts, logits_for::all);
  REQUIRE(all.size(0) == 8);
  std::int64_t row = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const at::Tensor ref = full_logits(m, concat(prompts[i], drafts[i]));
    const auto p = static_cast<std::int64_t>(prompts[i].size());
    const auto k = static_cast<std::int64_t>(drafts[i].size());
    CHECK(max_abs_diff(all.narrow(0, row, k), ref.narrow(0, p, k)) < logits_atol);
    row += k;
  }
  // logits_for::last on the same kind of call returns each sequence's last row.
  const at::Tensor last = m.forward_cached(c, s, {{1, 2}, {3}, {4, 5, 6}});
  REQUIRE(last.size(0) == 3);
  const at::Tensor ref2 = full_logits(m, concat(concat(prompts[2], drafts[2]), {4, 5, 6}));
  CHECK(max_abs_diff(last[2], ref2[ref2.size(0) - 1]) < logits_atol);
}

TEST_CASE("truncate then append equals direct decoding", "[decode]") {
  const policy_model m(small_dims(), 14, small_init_std);
  kv_cache c(m.dims(), small_blocks());
  const std::vector<std::int32_t> prompt = tokens(10, 40, 14);
  const std::vector<std::int32_t> wrong = tokens(5, 40, 15);
  const std::vector<std::int32_t> right = tokens(5, 40, 16);
  const seq_id s = c.create();
  const seq_id sib = c.fork(s);  // keep a sharer of the prompt's blocks around
  (void)sib;
  m.forward_cached(c, {s}, {prompt});
  const seq_id shared = c.fork(s);  // blocks 0..2 shared, the third one partial
  m.forward_cached(c, {s}, {wrong}, logits_for::all);
  c.truncate(s, 7);  // back into the middle of a block that `shared` still holds
  const std::vector<std::int32_t> tail = {prompt[7], prompt[8], prompt[9]};
  const at::Tensor got = m.forward_cached(c, {s}, {concat(tail, right)}, logits_for::all);
  const at::Tensor ref = full_logits(m, concat(prompt, right));
  CHECK(max_abs_diff(got, ref.narrow(0, 7, 8)) < logits_atol);
  // The sharer is untouched by s's writes and rollback.
  const at::Tensor other = m.forward_cached(c, {shared}, {wrong}, logits_for::all);
  CHECK(max_abs_diff(other, full_logits(m, concat(prompt, wrong)).narrow(0, 10, 5)) < logits_atol);
}

TEST_CASE("group prefill sharing gives the same logits as separate prefill", "[decode]") {
  const policy_model m(small_dims(), 15, small_init_std);
  const std::vector<std::int32_t> prompt = tokens(9, 40, 17);  // ends mid-block: siblings copy it
  kv_cache shared_cache(m.dims(), small_blocks());
  kv_cache separate_cache(m.dims(), small_blocks());
  const seq_id root = shared_cache.create();
  const at::Tensor prefill = m.forward_cached(shared_cache, {root}, {prompt});
  std::vector<seq_id> group = {root};
  for (int i = 0; i < 3; ++i) group.push_back(shared_cache.fork(root));
  CHECK(shared_cache.blocks_in_use() == 3);  // one prompt's worth for four samples
  std::vector<seq_id> alone;
  for (int i = 0; i < 4; ++i) alone.push_back(separate_cache.create());
  const at::Tensor separate = m.forward_cached(separate_cache, alone, {prompt, prompt, prompt, prompt});
  for (int i = 0; i < 4; ++i) CHECK(max_abs_diff(separate[i], prefill[0]) < logits_atol);
  for (std::uint32_t t = 0; t < 6; ++t) {
    std::vector<std::vector<std::int32_t>> next;
    for (std::uint32_t i = 0; i < 4; ++i) next.push_back(tokens(1, 40, 100 + 10 * t + i));
    const at::Tensor a = m.forward_cached(shared_cache, group, next);
    const at::Tensor b = m.forward_cached(separate_cache, alone, next);
    CHECK(max_abs_diff(a, b) < logits_atol);
  }
}

TEST_CASE("removing a finished sequence leaves the others' logits unchanged", "[decode]") {
  const policy_model m(small_dims(), 16, small_init_std);
  kv_cache c(m.dims(), small_blocks());
  std::vector<seq_id> s = {c.create(), c.create(), c.create()};
  std::vector<std::vector<std::int32_t>> seqs = {tokens(4, 40, 20), tokens(8, 40, 21), tokens(5, 40, 22)};
  m.forward_cached(c, s, seqs);
  for (std::uint32_t t = 0; t < 8; ++t) {
    if (t == 3) {  // the middle sequence finishes; a new one joins
      c.release(s[1]);
      s.erase(s.begin() + 1);
      seqs.erase(seqs.begin() + 1);
      s.push_back(c.create());
      seqs.push_back(tokens(6, 40, 23));
      m.forward_cached(c, {s.back()}, {seqs.back()});
    }
    std::vector<std::vector<std::int32_t>> next;
    for (std::size_t i = 0; i < s.size(); ++i) next.push_back(tokens(1, 40, 200 + 10 * t + static_cast<std::uint32_t>(i)));
    const at::Tensor got = m.forward_cached(c, s, next);
    for (std::size_t i = 0; i < s.size(); ++i) {
      seqs[i].push_back(next[i][0]);
      const at::Tensor ref = full_logits(m, seqs[i]);
      CHECK(max_abs_diff(got[static_cast<std::int64_t>(i)], ref[ref.size(0) - 1]) < logits_atol);
    }
  }
}

TEST_CASE("a bf16 rollout copy decodes like its own full forward", "[decode]") {
  const policy_model train(small_dims(), 17, small_init_std);
  const policy_model roll = train.clone(at::kBFloat16);
  kv_cache c(roll.dims(), small_blocks());
  const std::vector<std::int32_t> toks = tokens(12, 40, 30);
  const seq_id s = c.create();
  const at::Tensor a = roll.forward_cached(c, {s}, {{toks.begin(), toks.begin() + 6}}, logits_for::all);
  const at::Tensor b = roll.forward_cached(c, {s}, {{toks.begin() + 6, toks.end()}}, logits_for::all);
  CHECK(max_abs_diff(at::cat({a, b}), full_logits(roll, toks)) < logits_atol);
}

TEST_CASE("a Qwen2-style model (qkv bias, untied head) decodes like its full forward", "[decode]") {
  model_dims d = small_dims();
  d.qkv_bias = true;
  d.tie_embeddings = false;
  const policy_model m(d, 19, small_init_std);
  {
    at::NoGradGuard no_grad;  // nonzero biases, so that a dropped bias shows
    for (const auto& [name, t] : m.parameters())
      if (name.find(".bias") != std::string::npos) t.normal_(0.0, 0.5);
  }
  kv_cache c(d, small_blocks());
  const std::vector<std::int32_t> toks = tokens(10, 40, 31);
  const seq_id s = c.create();
  const at::Tensor a = m.forward_cached(c, {s}, {{toks.begin(), toks.begin() + 7}}, logits_for::all);
  const at::Tensor b = m.forward_cached(c, {s}, {{toks.begin() + 7, toks.end()}}, logits_for::all);
  CHECK(max_abs_diff(at::cat({a, b}), full_logits(m, toks)) < logits_atol);
}

TEST_CASE("both decode GEMM backends give the same logits", "[decode]") {
  policy_model m(small_dims(), 20, small_init_std);
  const std::vector<std::int32_t> toks = tokens(16, 40, 32);
  std::vector<at::Tensor> out;
  for (const decode_gemm g : {decode_gemm::automatic, decode_gemm::aten}) {
    m.set_decode_gemm(g);
    kv_cache c(m.dims(), small_blocks());
    const seq_id s = c.create();
    out.push_back(m.forward_cached(c, {s}, {toks}, logits_for::all));
  }
  CHECK(max_abs_diff(out[0], out[1]) < logits_atol);
}

TEST_CASE("a bf16 model decodes through bf16_linear like through its fp32 image", "[decode]") {
  policy_model master(small_dims(), 21, small_init_std);
  master.set_bf16_compute(true);
  policy_model m = master.clone(at::kBFloat16);
  const std::vector<std::int32_t> toks = tokens(16, 40, 33);
  const at::Tensor full = full_logits(master, toks);  // the learner's view of the same weights
  std::vector<at::Tensor> out;
  for (const decode_gemm g : {decode_gemm::automatic, decode_gemm::fp32_image, decode_gemm::aten}) {
    m.set_decode_gemm(g);
    kv_cache c(m.dims(), small_blocks());
    const seq_id s = c.create();
    at::Tensor prefill = m.forward_cached(c, {s}, {{toks.begin(), toks.begin() + 9}}, logits_for::all);
    std::vector<at::Tensor> rows = {prefill};
    for (std::size_t t = 9; t < toks.size(); ++t) rows.push_back(m.forward_cached(c, {s}, {{toks[t]}}));
    out.push_back(at::cat(rows));
    CHECK(max_abs_diff(out.back(), full) < logits_atol);
  }
  // Only the order of fp32 additions differs: the backends agree, and not by accident.
  CHECK(max_abs_diff(out[0], out[1]) < logits_atol);
  CHECK(max_abs_diff(out[0], out[2]) < logits_atol);
}

TEST_CASE("a decode profile adds up the time of each kind of operation", "[decode]") {
  policy_model m = policy_model(small_dims(), 22, small_init_std).clone(at::kBFloat16);
  decode_profile prof;
  m.set_decode_profile(&prof);
  kv_cache c(m.dims(), small_blocks());
  const seq_id s = c.create();
  m.forward_cached(c, {s}, {tokens(5, 40, 34)});
  m.forward_cached(c, {s}, {{3}});
  m.set_decode_profile(nullptr);
  m.forward_cached(c, {s}, {{4}});
  CHECK(prof.calls == 2);
  for (int k = 0; k < decode_profile::kinds; ++k) {
    INFO(decode_profile::name(k));
    CHECK(prof.seconds[k] > 0.0);
  }
  CHECK(std::string(decode_profile::name(decode_profile::lm_head)) == "lm head");
}

TEST_CASE("the cached forward rejects bad calls and leaves the cache as it was", "[decode]") {
  const policy_model m(small_dims(), 18);
  kv_cache c(m.dims(), small_blocks());
  const seq_id s = c.create();
  m.forward_cached(c, {s}, {{1, 2, 3}});
  CHECK_THROWS_WITH(m.forward_cached(c, {s}, {{40}}), Catch::Contains("token id 40"));
  CHECK_THROWS_WITH(m.forward_cached(c, {s, s}, {{1}, {2}}), Catch::Contains("appears twice"));
  CHECK_THROWS_WITH(m.forward_cached(c, {s}, {{}}), Catch::Contains("need >= 1"));
  CHECK_THROWS_WITH(m.forward_cached(c, {s}, {{1}, {2}}), Catch::Contains("token lists"));
  CHECK(c.length(s) == 3);
  model_dims other = small_dims();
  other.n_layers = 3;
  kv_cache wrong(other, small_blocks());
  const seq_id w = wrong.create();
  CHECK_THROWS_WITH(m.forward_cached(wrong, {w}, {{1}}), Catch::Contains("does not match"));
}

TEST_CASE("a sequence continued by a new turn gives the logits of a fresh prefill of the whole chat", "[decode]") {
  // What generator continuation does: turn 1 is a prefill and one-token decodes next to a batch
  // mate, turn 2 appends the last sampled token and an observation in one pass. Not bit-exact
  // against one fresh prefill: GEMMs over other row counts and attention over other key splits
  // round differently in fp32; logits_atol bounds it (max |d| ~1e-6 in practice).
  const policy_model m(small_dims(), 17, small_init_std);
  const std::vector<std::int32_t> prompt = tokens(7, 40, 40);
  const std::vector<std::int32_t> action = tokens(4, 40, 41);
  const std::vector<std::int32_t> obs = tokens(11, 40, 42);
  kv_cache c(m.dims(), small_blocks());
  const seq_id s = c.create(), mate = c.create();
  m.forward_cached(c, {s, mate}, {prompt, tokens(3, 40, 43)});
  for (std::size_t t = 0; t + 1 < action.size(); ++t) m.forward_cached(c, {s, mate}, {{action[t]}, {action[t]}});
  REQUIRE(c.length(s) == 10);
  const at::Tensor got =
      m.forward_cached(c, {mate, s}, {{action[0]}, concat({action.back()}, obs)}, logits_for::all).narrow(0, 1, 12);
  kv_cache fresh(m.dims(), small_blocks());
  const std::vector<std::int32_t> chat = concat(concat(prompt, action), obs);
  const at::Tensor ref = m.forward_cached(fresh, {fresh.create()}, {chat}, logits_for::all).narrow(0, 10, 12);
  const double diff = max_abs_diff(got, ref);
  INFO("max |d logit| " << diff);
  CHECK(diff < logits_atol);
  CHECK(max_abs_diff(got, full_logits(m, chat).narrow(0, 10, 12)) < logits_atol);
}
