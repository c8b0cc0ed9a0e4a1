#include "runtime/ml/generate.hpp"

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
