#include "runtime/ml/policy/generate.hpp"

#include "tests/ml/policy_test_util.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <map>
#include <stdexcept>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::full_logits;
using sorl::ml::test::small_dims;
using sorl::ml::test::small_init_std;
using sorl::ml::test::tokens;

namespace {

sampling_params greedy(std::int64_t max_new) {
  sampling_params p;
  p.temperature = 0.0f;
  p.max_new_tokens = max_new;
  return p;
}

sampling_params sampled(std::uint64_t seed, std::int64_t max_new, float temperature = 1.0f) {
  sampling_params p;
  p.temperature = temperature;
  p.max_new_tokens = max_new;
  p.seed = seed;
  return p;
}

std::int32_t argmax_last(const policy_model& m, const std::vector<std::int32_t>& toks) {
  const at::Tensor l = full_logits(m, toks);
  return static_cast<std::int32_t>(l[l.size(0) - 1].argmax().item<std::int64_t>());
}

// Results keyed by (request, sample).
std::map<std::pair<std::uint64_t, std::int64_t>, generation_result> by_id(std::vector<generation_result> rs) {
  std::map<std::pair<std::uint64_t, std::int64_t>, generation_result> out;
  for (auto& r : rs) out[{r.request_id, r.sample_index}] = std::move(r);
  return out;
}

}  // namespace

TEST_CASE("greedy generation follows the argmax of the full forward", "[generate]") {
  const policy_model m(small_dims(), 21, small_init_std);
  const std::vector<std::int32_t> prompt = tokens(5, 40, 1);
  generator g(m);
  g.submit(prompt, greedy(12));
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 1);
  CHECK(out[0].reason == finish_reason::length);
  REQUIRE(out[0].tokens.size() == 12);
  std::vector<std::int32_t> seq = prompt;
  for (const std::int32_t t : out[0].tokens) {
    CHECK(t == argmax_last(m, seq));
    seq.push_back(t);
  }
}

TEST_CASE("EOS as the very first token finishes with one token and reason eos", "[generate]") {
  const policy_model m(small_dims(), 22, small_init_std);
  const std::vector<std::int32_t> prompt = tokens(6, 40, 2);
  sampling_params p = greedy(10);
  p.eos_token_ids = {argmax_last(m, prompt)};
  generator g(m);
  g.submit(prompt, p, 3);
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 3);
  for (const auto& r : out) {
    CHECK(r.reason == finish_reason::eos);
    CHECK(r.tokens == p.eos_token_ids);
    CHECK(r.prompt_tokens == 6);
    const at::Tensor l = full_logits(m, prompt);
    CHECK(r.logprobs[0] == Approx(at::log_softmax(l[5], -1)[p.eos_token_ids[0]].item<double>()).margin(1e-5));
  }
  CHECK(g.idle());
  CHECK(g.cache().num_sequences() == 0);
  CHECK(g.cache().blocks_in_use() == 0);
}

TEST_CASE("max_new_tokens is reached exactly with reason length", "[generate]") {
  const policy_model m(small_dims(), 23, small_init_std);
  generator g(m);
  g.submit(tokens(4, 40, 3), sampled(5, 7), 2);
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 2);
  for (const auto& r : out) {
    CHECK(r.reason == finish_reason::length);
    CHECK(r.tokens.size() == 7);
    CHECK(r.logprobs.size() == 7);
  }
}

TEST_CASE("a sample stops at the model's context with reason length", "[generate]") {
  model_dims d = small_dims();
  d.max_seq = 16;
  const policy_model m(d, 24, small_init_std);
  generator g(m);
  g.submit(tokens(10, 40, 4), sampled(1, 100));
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 1);
  CHECK(out[0].reason == finish_reason::length);
  CHECK(out[0].tokens.size() == 6);  // positions 10..15
  CHECK_THROWS_AS(g.submit(tokens(16, 40, 5), sampled(1, 1)), std::invalid_argument);
}

TEST_CASE("sampled log-probs equal the learner's log_softmax(logits / T)", "[generate]") {
  const policy_model m(small_dims(), 25, small_init_std);
  const std::vector<std::int32_t> prompt = tokens(5, 40, 6);
  generator g(m);
  g.submit(prompt, sampled(77, 10, 0.7f));
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 1);
  std::vector<std::int32_t> seq = prompt;
  seq.insert(seq.end(), out[0].tokens.begin(), out[0].tokens.end());
  const at::Tensor lp = at::log_softmax(full_logits(m, seq) / 0.7, -1);
  for (std::size_t i = 0; i < out[0].tokens.size(); ++i)
    CHECK(out[0].logprobs[i] ==
          Approx(lp[static_cast<std::int64_t>(4 + i)][out[0].tokens[i]].item<double>()).margin(1e-4));
}

TEST_CASE("a sample's tokens do not depend on its batch mates", "[generate]") {
  const policy_model m(small_dims(), 26, small_init_std);
  const std::vector<std::int32_t> prompt = tokens(7, 40, 7);
  generator alone(m);
  const auto id = alone.submit(prompt, sampled(1234, 15), 3);
  const auto ref = by_id(alone.run_until_idle());

  // The same request among others that start earlier and later, with other lengths.
  generator busy(m);
  busy.submit(tokens(3, 40, 8), sampled(1, 4), 2);
  busy.submit(tokens(11, 40, 9), sampled(2, 30), 1);
  busy.step();
  busy.step();
  const auto id2 = busy.submit(prompt, sampled(1234, 15), 3);
  busy.step();
  busy.submit(tokens(2, 40, 10), sampled(3, 9), 4);
  const auto got = by_id(busy.run_until_idle());
  for (std::int64_t i = 0; i < 3; ++i) {
    const auto& a = ref.at({id, i});
    const auto& b = got.at({id2, i});
    CHECK(a.tokens == b.tokens);
    for (std::size_t j = 0; j < a.logprobs.size(); ++j) CHECK(a.logprobs[j] == Approx(b.logprobs[j]).margin(1e-5));
  }
  // Different streams of a group give different completions (10^-20-ish chance otherwise).
  CHECK(ref.at({id, 0}).tokens != ref.at({id, 1}).tokens);
}

TEST_CASE("groups are admitted whole when the batch has room", "[generate]") {
  const policy_model m(small_dims(), 27, small_init_std);
  generator_options o;
  o.max_batch = 4;
  generator g(m, o);
  g.submit(tokens(3, 40, 11), sampled(1, 3), 3);
  g.submit(tokens(3, 40, 12), sampled(2, 3), 3);
  g.step();
  CHECK(g.live_samples() == 3);
  CHECK(g.queued_requests() == 1);
  g.step();
  g.step();  // the first group reaches 3 tokens and leaves
  CHECK(g.live_samples() == 0);
  g.step();
  CHECK(g.live_samples() == 3);
  CHECK_THROWS_WITH(g.submit(tokens(3, 40, 13), sampled(1, 3), 5), Catch::Contains("group_size 5"));
}

TEST_CASE("queued requests are admitted by priority, first come first served among equals", "[generate]") {
  const policy_model m(small_dims(), 27, small_init_std);
  generator_options o;
  o.max_batch = 1;
  generator g(m, o);
  auto submit = [&](std::int32_t seed, std::int64_t priority) {
    return g.submit(tokens(3, 40, seed), greedy(1), 1, {}, kv_reuse{false, 0, priority});
  };
  const auto a = submit(11, 0);
  const auto b = submit(12, 0);
  const auto c = submit(13, 2);
  const auto d = submit(14, 2);
  const auto e = submit(15, 1);
  std::vector<std::uint64_t> order;
  while (!g.idle())
    for (const auto& r : g.step()) order.push_back(r.request_id);
  CHECK(order == std::vector<std::uint64_t>{c, d, e, a, b});
}

TEST_CASE("a stop string ends generation with reason stop", "[generate]") {
  const policy_model m(small_dims(), 28, small_init_std);
  const std::vector<std::int32_t> prompt = tokens(4, 40, 14);
  const detokenize_fn letters = [](const std::vector<std::int32_t>& t) {
    std::string s;
    for (const auto x : t) s += static_cast<char>('a' + x % 26);
    return s;
  };
  generator g(m);
  g.submit(prompt, greedy(8));
  const auto free_run = g.run_until_idle();
  REQUIRE(free_run[0].tokens.size() == 8);
  // Stop on the text of generated tokens 2 and 3: the sample ends right after token 3.
  sampling_params p = greedy(8);
  const std::string text = letters(free_run[0].tokens);
  p.stop_strings = {text.substr(1, 2)};
  g.submit(prompt, p, 1, letters);
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 1);
  CHECK(out[0].reason == finish_reason::stop);
  const std::size_t first = text.find(text.substr(1, 2));  // an earlier occurrence stops sooner
  CHECK(out[0].tokens.size() == first + 2);
  CHECK_THROWS_AS(g.submit(prompt, p), std::invalid_argument);  // stop strings need a detokenizer
}

TEST_CASE("abort returns the tokens generated so far and frees the cache", "[generate]") {
  const policy_model m(small_dims(), 29, small_init_std);
  generator g(m);
  const auto a = g.submit(tokens(5, 40, 15), sampled(1, 50), 2);
  const auto b = g.submit(tokens(5, 40, 16), sampled(2, 50), 1);
  g.step();
  g.step();
  g.step();
  const auto queued = g.submit(tokens(5, 40, 17), sampled(3, 50), 64);  // cannot fit yet
  const auto out = g.abort(a);
  REQUIRE(out.size() == 2);
  for (const auto& r : out) {
    CHECK(r.reason == finish_reason::abort);
    CHECK(r.tokens.size() == 3);
  }
  const auto q = g.abort(queued);
  CHECK(q.size() == 64);
  CHECK(q[0].tokens.empty());
  CHECK(g.abort(12345).empty());
  CHECK(g.live_samples() == 1);
  const auto rest = g.abort(b);
  CHECK(rest.size() == 1);
  CHECK(g.idle());
  CHECK(g.cache().blocks_in_use() == 0);
}

namespace {

// A chat's next prompt: everything the sample cached plus its last token and an observation.
std::vector<std::int32_t> next_turn(std::vector<std::int32_t> prompt, const generation_result& r,
                                    std::uint32_t salt) {
  prompt.insert(prompt.end(), r.tokens.begin(), r.tokens.end());
  const std::vector<std::int32_t> obs = tokens(9, 40, salt);
  prompt.insert(prompt.end(), obs.begin(), obs.end());
  return prompt;
}

kv_reuse parking(parked_kv from = 0) { return kv_reuse{true, from}; }

}  // namespace

TEST_CASE("a greedy multi-turn continuation yields the same tokens as re-prefilling each turn", "[generate]") {
  const policy_model m(small_dims(), 30, small_init_std);
  generator kept(m);
  std::vector<std::int32_t> prompt = tokens(6, 40, 18);
  parked_kv kv = 0;
  for (std::uint32_t turn = 0; turn < 3; ++turn) {
    kept.submit(prompt, greedy(5), 1, {}, parking(kv));
    const auto got = kept.run_until_idle();
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].parked != 0);
    generator fresh(m);
    fresh.submit(prompt, greedy(5));
    const auto ref = fresh.run_until_idle();
    CHECK(got[0].tokens == ref[0].tokens);
    CHECK(got[0].prompt_tokens == static_cast<std::int64_t>(prompt.size()));
    kv = got[0].parked;
    prompt = next_turn(prompt, got[0], 19 + turn);
  }
  CHECK(kept.parked_count() == 1);
  CHECK(kept.release(kv));
  CHECK(kept.cache().blocks_in_use() == 0);
}

TEST_CASE("a sampled group continued from parked KV matches a fresh prefill of the whole chat", "[generate]") {
  // Continuation log-probs are not bit-exact: the parked prefix was computed by a prefill and
  // one-token decodes, a fresh prefill computes it in one pass, and GEMMs over other row counts
  // and attention over other key splits round differently in fp32 (|d logit| ~ 1e-6 seen).
  // 1e-5 on log-probs of magnitude ~1-5 holds with room and catches any wrong KV or position.
  const policy_model m(small_dims(), 31, small_init_std);
  generator kept(m);
  const std::vector<std::int32_t> first = tokens(7, 40, 22);
  kept.submit(first, sampled(5, 4), 1, {}, parking());
  // A batch mate that keeps decoding while the continuation is prefilled next to it.
  kept.submit(tokens(4, 40, 23), sampled(6, 30), 1);
  std::vector<generation_result> turn1;
  while (turn1.empty()) turn1 = kept.step();
  REQUIRE(turn1[0].parked != 0);
  const std::vector<std::int32_t> second = next_turn(first, turn1[0], 24);
  const auto id = kept.submit(second, sampled(7, 6), 3, {}, parking(turn1[0].parked));
  CHECK(kept.parked_count() == 0);  // spent at submit
  const auto got = by_id(kept.run_until_idle());
  generator fresh(m);
  const auto fid = fresh.submit(second, sampled(7, 6), 3);
  const auto ref = by_id(fresh.run_until_idle());
  for (std::int64_t i = 0; i < 3; ++i) {
    const auto& a = got.at({id, i});
    const auto& b = ref.at({fid, i});
    CHECK(a.tokens == b.tokens);
    REQUIRE(a.logprobs.size() == b.logprobs.size());
    for (std::size_t j = 0; j < a.logprobs.size(); ++j) CHECK(a.logprobs[j] == Approx(b.logprobs[j]).margin(1e-5));
    CHECK(a.parked != 0);  // every sibling parks its own fork
  }
  CHECK(kept.parked_count() == 3);
  kept.release_all_parked();
  CHECK(kept.parked_count() == 0);
  CHECK(kept.cache().blocks_in_use() == 0);
}

TEST_CASE("a prompt that does not extend the parked tokens is refused and the KV stays parked", "[generate]") {
  const policy_model m(small_dims(), 32, small_init_std);
  generator g(m);
  const std::vector<std::int32_t> prompt = tokens(6, 40, 25);
  g.submit(prompt, greedy(3), 1, {}, parking());
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 1);
  const parked_kv kv = out[0].parked;
  REQUIRE(kv != 0);
  // Cached: the prompt and the first two tokens; the third was sampled, never fed.
  std::vector<std::int32_t> cached = prompt;
  cached.insert(cached.end(), out[0].tokens.begin(), out[0].tokens.end() - 1);
  std::vector<std::int32_t> changed = next_turn(prompt, out[0], 26);
  changed[3] = (changed[3] + 1) % 40;
  CHECK_THROWS_WITH(g.submit(changed, greedy(3), 1, {}, parking(kv)),
                    Catch::Contains("(8 tokens) is not a prefix of the prompt (18 tokens): position 3"));
  CHECK_THROWS_WITH(g.submit(cached, greedy(3), 1, {}, parking(kv)),
                    Catch::Contains("caches 8 tokens; the prompt of 8 tokens must extend it"));
  CHECK_THROWS_WITH(g.submit(prompt, greedy(3), 1, {}, parking(kv + 1)), Catch::Contains("is not parked"));
  CHECK(g.parked_count() == 1);
  std::vector<std::int32_t> longer = cached;
  longer.push_back(out[0].tokens.back());
  g.submit(longer, greedy(3), 1, {}, parking(kv));  // still there, and now spent
  CHECK_THROWS_WITH(g.submit(longer, greedy(3), 1, {}, parking(kv)), Catch::Contains("is not parked"));
  CHECK_FALSE(g.release(kv));
}

TEST_CASE("release and abort free every block of parked and continued KV", "[generate]") {
  const policy_model m(small_dims(), 33, small_init_std);
  generator g(m);
  REQUIRE(g.cache().blocks_in_use() == 0);
  const std::vector<std::int32_t> prompt = tokens(20, 40, 27);  // spans two 16-token blocks
  g.submit(prompt, sampled(1, 3), 2, {}, parking());
  const auto out = g.run_until_idle();
  REQUIRE(out.size() == 2);
  CHECK(g.cache().blocks_in_use() >= 2);
  CHECK(g.release(out[0].parked));
  CHECK_FALSE(g.release(out[0].parked));
  // A queued continuation that is aborted frees the sequence it took over.
  const auto filler = g.submit(tokens(3, 40, 28), sampled(2, 50), 64);  // fills the batch: the next one waits
  g.step();
  const auto queued = g.submit(next_turn(prompt, out[1], 29), sampled(3, 5), 1, {}, parking(out[1].parked));
  CHECK(g.queued_requests() == 1);
  CHECK(g.abort(queued).size() == 1);
  g.abort(filler);
  CHECK(g.cache().blocks_in_use() == 0);
  // So does a live one, and it parks nothing.
  g.submit(prompt, sampled(4, 2), 1, {}, parking());
  const auto again = g.run_until_idle();
  const auto live = g.submit(next_turn(prompt, again[0], 30), sampled(5, 50), 2, {}, parking(again[0].parked));
  g.step();
  CHECK(g.live_samples() == 2);
  for (const auto& r : g.abort(live)) CHECK(r.parked == 0);
  CHECK(g.parked_count() == 0);
  CHECK(g.cache().blocks_in_use() == 0);
  CHECK(g.cache().num_sequences() == 0);
}

TEST_CASE("a long prefill next to decoding samples gives the same tokens in one forward pass or two", "[generate]") {
  // Two passes change only which rows share a GEMM and the padding of the decode rows'
  // attention: tokens equal, log-probs within fp32 rounding (1e-5, as for batch mates).
  const policy_model m(small_dims(), 34, small_init_std);
  std::map<std::pair<std::uint64_t, std::int64_t>, generation_result> runs[2];
  for (const std::int64_t separate : {2, 1000}) {
    generator_options o;
    o.separate_prefill_tokens = separate;
    generator g(m, o);
    g.submit(tokens(3, 40, 31), sampled(8, 20), 3);
    g.step();
    g.step();
    g.submit(tokens(30, 40, 32), sampled(9, 10), 2);  // admitted next to 3 decoding samples
    g.submit(tokens(5, 40, 33), sampled(10, 10), 1);
    runs[separate == 2 ? 0 : 1] = by_id(g.run_until_idle());
  }
  REQUIRE(runs[0].size() == 6);
  for (const auto& [key, a] : runs[0]) {
    const auto& b = runs[1].at(key);
    CHECK(a.tokens == b.tokens);
    for (std::size_t j = 0; j < a.logprobs.size(); ++j) CHECK(a.logprobs[j] == Approx(b.logprobs[j]).margin(1e-5));
  }
  generator_options bad;
  bad.separate_prefill_tokens = 1;
  CHECK_THROWS_WITH(generator(m, bad), Catch::Contains("separate_prefill_tokens must be >= 2"));
}
