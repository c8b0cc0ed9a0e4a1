#include "runtime/ml/policy/sampler.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sorl::ml;

namespace {

// log of a known distribution: softmax(logits) = (0.1, 0.2, 0.3, 0.4).
const std::vector<float> known = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};

constexpr int draws = 20000;

std::vector<int> histogram(const std::vector<float>& logits, const sampling_params& p, std::uint64_t seed) {
  std::vector<int> counts(logits.size(), 0);
  sampler_rng rng(seed);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<std::size_t>(sample_token(logits.data(), 4, p, rng).token)];
  return counts;
}

// Pearson's chi-square of observed counts against expected probabilities; a count where the
// expected probability is 0 makes it infinite.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs) {
  double chi = 0.0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * draws;
    if (e == 0.0) {
      if (counts[i] != 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

// Upper 0.1% points of the chi-square distribution: a correct sampler fails a given fixed-seed
// test with probability 1e-3 (it is deterministic, so once it passes it keeps passing).
constexpr double chi2_999_df1 = 10.83;
constexpr double chi2_999_df2 = 13.82;
constexpr double chi2_999_df3 = 16.27;

sampling_params params(double temperature, std::int64_t top_k = 0, double top_p = 1.0) {
  sampling_params p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

}  // namespace

TEST_CASE("plain sampling follows softmax(logits) (chi-square)", "[sampler]") {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  const auto counts = histogram(known, params(1.0f), 1);
  CHECK(chi_square(counts, p) < chi2_999_df3);
  // The test has power: the uniform distribution is rejected by far.
  CHECK(chi_square(counts, {0.25, 0.25, 0.25, 0.25}) > 10 * chi2_999_df3);
}

TEST_CASE("temperature 0.5 squares and renormalises the probabilities (chi-square)", "[sampler]") {
  const std::vector<double> p = {1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30};
  const auto dist = sampling_distribution(known.data(), 4, params(0.5f));
  REQUIRE(dist.size() == 4);
  CHECK(dist[0].token == 3);
  CHECK(dist[0].prob == Approx(16.0 / 30).margin(1e-6));
  CHECK(dist[3].prob == Approx(1.0 / 30).margin(1e-6));
  const auto counts = histogram(known, params(0.5f), 2);
  CHECK(chi_square(counts, p) < chi2_999_df3);
  CHECK(chi_square(counts, {0.1, 0.2, 0.3, 0.4}) > 10 * chi2_999_df3);
}

TEST_CASE("top-k 2 keeps the two most probable tokens (chi-square)", "[sampler]") {
  const auto dist = sampling_distribution(known.data(), 4, params(1.0f, 2));
  REQUIRE(dist.size() == 2);
  CHECK(dist[0].token == 3);
  CHECK(dist[0].prob == Approx(4.0 / 7).margin(1e-6));
  CHECK(dist[1].token == 2);
  CHECK(dist[1].prob == Approx(3.0 / 7).margin(1e-6));
  const auto counts = histogram(known, params(1.0f, 2), 3);
  CHECK(counts[0] == 0);
  CHECK(counts[1] == 0);
  CHECK(chi_square({counts[2], counts[3]}, {3.0 / 7, 4.0 / 7}) < chi2_999_df1);
  // The test has power: the untruncated distribution is rejected by far.
  CHECK(chi_square(counts, {0.1, 0.2, 0.3, 0.4}) > 10 * chi2_999_df3);
}

TEST_CASE("top-p 0.8 keeps the smallest set whose mass reaches 0.8 (chi-square)", "[sampler]") {
  // Sorted masses 0.4, 0.3, 0.2, 0.1: the mass before 0.2 is 0.7 < 0.8, before 0.1 it is 0.9.
  const auto dist = sampling_distribution(known.data(), 4, params(1.0f, 0, 0.8f));
  REQUIRE(dist.size() == 3);
  CHECK(dist[2].token == 1);
  CHECK(dist[2].prob == Approx(2.0 / 9).margin(1e-6));
  const auto counts = histogram(known, params(1.0f, 0, 0.8f), 4);
  CHECK(counts[0] == 0);
  CHECK(chi_square({counts[1], counts[2], counts[3]}, {2.0 / 9, 3.0 / 9, 4.0 / 9}) < chi2_999_df2);
  // top-p 0.6 keeps 0.4 and 0.3 only.
  CHECK(sampling_distribution(known.data(), 4, params(1.0f, 0, 0.6f)).size() == 2);
}

TEST_CASE("top-k applies before top-p: top-k 2 then top-p 0.5 keeps only the most probable token",
          "[sampler]") {
  // top-k 2 keeps masses (0.4, 0.3), renormalised (4/7, 3/7); 4/7 = 0.571 already reaches 0.5,
  // so the nucleus is token 3 alone. In the other order top-p 0.5 of the full distribution
  // needs 0.4 + 0.3 (0.4 < 0.5) and top-k 2 then keeps both: tokens 3 and 2, (4/7, 3/7).
  const auto dist = sampling_distribution(known.data(), 4, params(1.0, 2, 0.5));
  REQUIRE(dist.size() == 1);
  CHECK(dist[0].token == 3);
  CHECK(dist[0].prob == 1.0);
  const auto counts = histogram(known, params(1.0, 2, 0.5), 5);
  CHECK(counts == std::vector<int>{0, 0, 0, draws});
}

TEST_CASE("top-p 0.8 of probabilities (0.3, 0.1, 0.1, 0.5) keeps tokens 3 and 0 and never draws token 1",
          "[sampler]") {
  const std::vector<double> want = {0.3, 0.1, 0.1, 0.5};
  std::vector<float> logits;
  for (const double q : want) logits.push_back(static_cast<float>(std::log(q)));
  // The exact processed distribution of these fp32 logits, in long double: what the sampler
  // must reproduce to double rounding (1e-12). It differs from the ideal (0.625, 0.375) only by
  // the fp32 rounding of the logits (relative 2^-24 per logit).
  long double w[4], total = 0.0L;
  for (int i = 0; i < 4; ++i) total += w[i] = std::exp(static_cast<long double>(logits[i]) - logits[3]);
  const long double kept = w[3] + w[0];
  REQUIRE(kept / total >= 0.8L);  // the prefix {3, 0} does reach 0.8 for these logits

  const auto dist = sampling_distribution(logits.data(), 4, params(1.0, 0, 0.8));
  REQUIRE(dist.size() == 2);
  CHECK(dist[0].token == 3);
  CHECK(dist[1].token == 0);
  CHECK(dist[0].prob == Approx(0.625).margin(1e-7));
  CHECK(dist[1].prob == Approx(0.375).margin(1e-7));
  CHECK(std::fabs(dist[0].prob - static_cast<double>(w[3] / kept)) < 1e-12);
  CHECK(std::fabs(dist[1].prob - static_cast<double>(w[0] / kept)) < 1e-12);

  // 100000 draws: token 1 (and 2) never; token 3 at 0.625 with standard error
  // sqrt(0.625 · 0.375 / 1e5) = 0.00153, so ±0.008 is more than 5 standard errors.
  constexpr int n = 100000;
  int counts[4] = {0, 0, 0, 0};
  sampler_rng rng(2024);
  for (int i = 0; i < n; ++i) ++counts[sample_token(logits.data(), 4, params(1.0, 0, 0.8), rng).token];
  CHECK(counts[1] == 0);
  CHECK(counts[2] == 0);
  CHECK(std::fabs(counts[3] / double(n) - 0.625) < 0.008);
  CHECK(std::fabs(counts[0] / double(n) - 0.375) < 0.008);

  // The test has power: 0.8 rounded to fp32 (0.800000011920929) lies above the mass of {3, 0}
  // and keeps a third token, token 1 (the lower id of the tied pair).
  const auto rounded = sampling_distribution(logits.data(), 4, params(1.0, 0, static_cast<double>(0.8f)));
  REQUIRE(rounded.size() == 3);
  CHECK(rounded[2].token == 1);
}

TEST_CASE("a top-p boundary that is exact in real numbers is met exactly", "[sampler]") {
  // Ten equal logits: each token has mass 1/10. Summing 0.1 eight times in double gives
  // 0.7999999999999999 < 0.8, which would keep a ninth token; the mass W_8 / S = 8 / 10 is
  // the double 0.8 itself.
  const std::vector<float> equal(10, 0.25f);
  CHECK(sampling_distribution(equal.data(), 10, params(1.0, 0, 0.8)).size() == 8);
  CHECK(sampling_distribution(equal.data(), 10, params(1.0, 0, 0.3)).size() == 3);
  CHECK(sampling_distribution(equal.data(), 10, params(1.0, 0, 0.7)).size() == 7);
  // Just above a boundary needs the next token; the kept tokens are the lowest ids.
  const auto nine = sampling_distribution(equal.data(), 10, params(1.0, 0, 0.8000000000000002));
  REQUIRE(nine.size() == 9);
  for (std::size_t i = 0; i < nine.size(); ++i) {
    CHECK(nine[i].token == static_cast<std::int32_t>(i));
    CHECK(nine[i].prob == 1.0 / 9);
  }
  // Four equal logits and top-p 0.5: exactly two, each renormalised to exactly 0.5.
  const std::vector<float> four(4, -3.0f);
  const auto half = sampling_distribution(four.data(), 4, params(0.7, 0, 0.5));
  REQUIRE(half.size() == 2);
  CHECK(half[0].prob == 0.5);
  CHECK(half[1].prob == 0.5);
}

TEST_CASE("temperatures between 0 and min_temperature are refused, and the floor itself samples finitely",
          "[sampler]") {
  CHECK_THROWS_WITH(validate(params(1e-40)), Catch::Contains("temperature"));
  CHECK_THROWS_WITH(validate(params(0.0099)), Catch::Contains("[0.01, inf)"));
  CHECK_NOTHROW(validate(params(0.0)));
  CHECK_NOTHROW(validate(params(min_temperature)));
  // At the floor, logits 0..3 are 100 nats apart per unit: the argmax has probability
  // 1 / (1 + e^-100 + ...) = 1 in double and the log-probs are finite: 0 for token 3 and
  // exactly -100 for token 2.
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f};
  const auto dist = sampling_distribution(logits.data(), 4, params(min_temperature));
  REQUIRE(dist.size() == 4);  // e^-300 is still a double
  CHECK(dist[0].token == 3);
  CHECK(dist[0].prob == 1.0);
  CHECK(training_logprob(logits.data(), 4, min_temperature, 3) == Approx(0.0).margin(1e-12));
  CHECK(training_logprob(logits.data(), 4, min_temperature, 2) == Approx(-100.0).epsilon(1e-12));
  CHECK(std::isfinite(training_logprob(logits.data(), 4, min_temperature, 0)));
}

TEST_CASE("greedy edge cases pick the argmax: temperature 0, top-k 1, top-p <= 0", "[sampler]") {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f};
  for (const sampling_params& p : {params(0.0f), params(1.0f, 1), params(1.0f, 0, 0.0f), params(1.0f, 0, -0.5f),
                                   params(3.0f, 1, 0.0f)}) {
    const auto dist = sampling_distribution(logits.data(), 4, p);
    REQUIRE(dist.size() == 1);
    CHECK(dist[0].token == 1);
    CHECK(dist[0].prob == 1.0);
    sampler_rng rng(5);
    for (int i = 0; i < 50; ++i) CHECK(sample_token(logits.data(), 4, p, rng).token == 1);
  }
  // Ties go to the lower id.
  const std::vector<float> tie = {1.0f, 3.0f, 3.0f, 0.0f};
  CHECK(sampling_distribution(tie.data(), 4, params(0.0f))[0].token == 1);
}

TEST_CASE("top-k at or above the vocabulary changes nothing", "[sampler]") {
  for (const std::int64_t k : {4, 5, 1000}) {
    sampler_rng a(9), b(9);
    for (int i = 0; i < 200; ++i)
      CHECK(sample_token(known.data(), 4, params(0.7f, k), a).token ==
            sample_token(known.data(), 4, params(0.7f, 0), b).token);
  }
  CHECK(sampling_distribution(known.data(), 4, params(1.0f, 0, 1.0f)).size() == 4);
  CHECK(sampling_distribution(known.data(), 4, params(1.0f, 0, 1.5f)).size() == 4);
}

TEST_CASE("log-probs are log_softmax(logits / T) over the full vocabulary", "[sampler]") {
  // At T = 0.5 the full-vocabulary probabilities are (1, 4, 9, 16) / 30, whatever the truncation.
  const double full[4] = {1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30};
  for (const sampling_params& p : {params(0.5f), params(0.5f, 2), params(0.5f, 0, 0.3f), params(0.5f, 1)}) {
    sampler_rng rng(1);
    for (int i = 0; i < 20; ++i) {
      const sampled_token t = sample_token(known.data(), 4, p, rng);
      CHECK(t.logprob == Approx(std::log(full[t.token])).margin(1e-6));
    }
  }
  CHECK(training_logprob(known.data(), 4, 0.5f, 0) == Approx(std::log(1.0 / 30)).margin(1e-6));
  // Greedy reports the temperature-1 log-prob.
  sampler_rng rng(1);
  const sampled_token g = sample_token(known.data(), 4, params(0.0f), rng);
  CHECK(g.token == 3);
  CHECK(g.logprob == Approx(std::log(0.4)).margin(1e-6));
  CHECK_THROWS_AS(training_logprob(known.data(), 4, 1.0f, 4), std::invalid_argument);
}

TEST_CASE("masked tokens are never sampled and NaN logits are rejected", "[sampler]") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> masked = {-inf, 0.0f, -inf, 0.0f};
  sampler_rng rng(3);
  for (int i = 0; i < 200; ++i) {
    const auto t = sample_token(masked.data(), 4, params(1.0f), rng);
    CHECK((t.token == 1 || t.token == 3));
    CHECK(t.logprob == Approx(std::log(0.5)).margin(1e-6));
  }
  const std::vector<float> nan = {0.0f, std::nanf(""), 1.0f, 2.0f};
  CHECK_THROWS_WITH(sampling_distribution(nan.data(), 4, params(1.0f)), Catch::Contains("logits[1] is NaN"));
  const std::vector<float> overflowed = {0.0f, inf, 1.0f, 2.0f};
  CHECK_THROWS_WITH(sampling_distribution(overflowed.data(), 4, params(1.0)),
                    Catch::Contains("logits[1] is +inf"));
  const std::vector<float> none = {-inf, -inf};
  CHECK_THROWS_WITH(sampling_distribution(none.data(), 2, params(1.0f)), Catch::Contains("-inf"));
}

TEST_CASE("invalid sampling params are rejected naming the field", "[sampler]") {
  CHECK_THROWS_WITH(validate(params(-1.0f)), Catch::Contains("temperature"));
  CHECK_THROWS_WITH(validate(params(1.0f, -1)), Catch::Contains("top_k"));
  CHECK_THROWS_WITH(validate(params(1.0f, 0, std::nanf(""))), Catch::Contains("top_p"));
  sampling_params p;
  p.max_new_tokens = 0;
  CHECK_THROWS_WITH(validate(p), Catch::Contains("max_new_tokens"));
  p = sampling_params{};
  p.stop_strings = {""};
  CHECK_THROWS_WITH(validate(p), Catch::Contains("stop_strings"));
}

TEST_CASE("a seeded stream repeats exactly and streams of one seed differ", "[sampler]") {
  sampler_rng a(42, 0), b(42, 0), c(42, 1), d(43, 0);
  int same_c = 0, same_d = 0;
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t x = a.next_u64();
    CHECK(x == b.next_u64());
    same_c += x == c.next_u64();
    same_d += x == d.next_u64();
  }
  CHECK(same_c == 0);
  CHECK(same_d == 0);
  sampler_rng u(7);
  double sum = 0.0;
  for (int i = 0; i < 10000; ++i) {
    const double v = u.uniform();
    REQUIRE(v >= 0.0);
    REQUIRE(v < 1.0);
    sum += v;
  }
  // Mean of 10^4 uniforms: standard error 0.0029; 0.01 is > 3 standard errors.
  CHECK(sum / 10000 == Approx(0.5).margin(0.01));
}

TEST_CASE("EOS as the very first token finishes with reason eos", "[sampler]") {
  sampling_params p;
  p.eos_token_ids = {2, 9};
  p.max_new_tokens = 1;  // eos outranks length on the same token
  const stop_checker s(p, {});
  CHECK(s.check({9}) == finish_reason::eos);
  CHECK(s.check({}) == std::nullopt);
}

TEST_CASE("max_new_tokens is reached exactly", "[sampler]") {
  sampling_params p;
  p.max_new_tokens = 3;
  p.eos_token_ids = {0};
  const stop_checker s(p, {});
  CHECK(s.check({5}) == std::nullopt);
  CHECK(s.check({5, 6}) == std::nullopt);
  CHECK(s.check({5, 6, 7}) == finish_reason::length);
  CHECK(s.check({5, 6, 0}) == finish_reason::eos);
}

TEST_CASE("a stop string spanning tokens finishes with reason stop", "[sampler]") {
  sampling_params p;
  p.stop_strings = {"\n\n", "END"};
  const detokenize_fn bytes = [](const std::vector<std::int32_t>& t) {
    return std::string(t.begin(), t.end());
  };
  const stop_checker s(p, bytes);
  CHECK(s.check({'a', '\n'}) == std::nullopt);
  CHECK(s.check({'a', '\n', '\n'}) == finish_reason::stop);
  CHECK(s.check({'E', 'N'}) == std::nullopt);
  CHECK(s.check({'E', 'N', 'D'}) == finish_reason::stop);
  CHECK_THROWS_AS(stop_checker(p, {}), std::invalid_argument);
  CHECK(std::string(to_string(finish_reason::abort)) == "abort");
}

TEST_CASE("the sampling order is logit descending then token id, for ties, signed zeros and -inf", "[sampler]") {
  // A vocabulary the size of SmolLM2's with many exact ties (logits on a 1/8 grid), both zeros
  // and -inf: the kept tokens must come in the order of the comparison the rule states.
  const std::int64_t vocab = 49152;
  std::vector<float> logits(static_cast<std::size_t>(vocab));
  std::uint64_t state = 7;
  for (auto& x : logits) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<std::int64_t>((state >> 33) % 161) - 80) / 8.0f;
  }
  logits[5] = -0.0f;
  logits[6] = 0.0f;
  logits[7] = -std::numeric_limits<float>::infinity();
  logits[100] = 12.0f;
  sampling_params p;
  p.temperature = 2.0;
  const auto dist = sampling_distribution(logits.data(), vocab, p);
  std::vector<std::int32_t> want(static_cast<std::size_t>(vocab));
  for (std::int32_t t = 0; t < vocab; ++t)
    want[static_cast<std::size_t>(t)] = t;
  std::sort(want.begin(), want.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  want.pop_back();  // -inf has weight 0 and is not kept
  REQUIRE(dist.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    if (dist[i].token != want[i])
      FAIL("position " << i << ": token " << dist[i].token << ", expected " << want[i]);
  CHECK(dist.front().token == 100);
  // top-k keeps the same first k in the same order.
  p.top_k = 1000;
  const auto top = sampling_distribution(logits.data(), vocab, p);
  REQUIRE(top.size() == 1000);
  for (std::size_t i = 0; i < top.size(); ++i)
    CHECK(top[i].token == want[i]);
}
