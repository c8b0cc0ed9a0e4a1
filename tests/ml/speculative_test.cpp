// Speculative decoding: exact verification of deterministic drafts (sampler.hpp verify_draft)
// and the generator's draft path (generate.hpp), against plain sampling.

#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/policy/sampler.hpp"

#include "tests/ml/policy_test_util.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::small_dims;
using sorl::ml::test::small_init_std;
using sorl::ml::test::tokens;

namespace {

// ---- A synthetic Markov "model": the logits after token a are table[a], whatever came before.

constexpr std::int64_t V = 8;

std::vector<float> markov_table() {
  std::vector<float> t(static_cast<std::size_t>(V * V));
  std::uint32_t x = 99;
  for (float& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>((x >> 8) % 1000) / 250.0f;  // logits in [0, 4)
  }
  return t;
}

const float* row_after(const std::vector<float>& table, std::int32_t a) { return table.data() + a * V; }

// q(b | a) under p, as a dense vector.
std::vector<double> dense(const std::vector<float>& table, std::int32_t a, const sampling_params& p) {
  std::vector<double> q(static_cast<std::size_t>(V), 0.0);
  for (const token_prob& tp : sampling_distribution(row_after(table, a), V, p)) q[static_cast<std::size_t>(tp.token)] = tp.prob;
  return q;
}

enum class adversary { most_likely, least_likely, random };

// The deterministic draft an adversary proposes after `last`: k tokens, chained.
std::vector<std::int32_t> adversary_draft(adversary a, const std::vector<float>& table, std::int32_t last,
                                          std::size_t k, const sampling_params& p, std::mt19937& draft_rng) {
  std::vector<std::int32_t> d;
  for (std::size_t i = 0; i < k; ++i) {
    const std::vector<float> row(row_after(table, last), row_after(table, last) + V);
    std::int32_t t = 0;
    if (a == adversary::random) {
      t = static_cast<std::int32_t>(draft_rng() % V);
    } else {
      // By raw logit: "least likely" is outside every top-k / top-p set.
      const auto it = a == adversary::most_likely ? std::max_element(row.begin(), row.end())
                                                   : std::min_element(row.begin(), row.end());
      t = static_cast<std::int32_t>(it - row.begin());
    }
    (void)p;
    d.push_back(t);
    last = t;
  }
  return d;
}

// Chi-square critical value at significance 1e-3 (Wilson-Hilferty, z = 3.0902).
double chi2_critical(double df) {
  const double z = 3.0902, h = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
}

// ---- Drafters for the generator.

// Knows every sample's plain output and drafts its true continuation (`skew` added to each
// token id mod vocab makes it always wrong instead); optionally ignores max_tokens.
struct scripted_drafts : draft_source {
  std::map<std::pair<std::uint64_t, std::int64_t>, std::vector<std::int32_t>> truth;
  std::map<std::pair<std::uint64_t, std::int64_t>, std::vector<std::int32_t>> seen;
  std::int32_t skew = 0;
  bool overlong = false;      // return 40 tokens whatever max_tokens says
  bool random = false;        // random tokens instead
  std::mt19937 rng{17};
  std::int64_t vocab = 40;
  std::int64_t starts = 0, finishes = 0, completed = 0;
  std::vector<std::pair<std::int32_t, std::int64_t>> asked;  // (max_tokens, tokens seen so far)

  void start(std::uint64_t r, std::int64_t s, const std::vector<std::int32_t>&) override {
    ++starts;
    seen[{r, s}];
  }
  void extend(std::uint64_t r, std::int64_t s, const std::int32_t* t, std::size_t n) override {
    auto& v = seen.at({r, s});
    v.insert(v.end(), t, t + n);
  }
  void draft(std::uint64_t r, std::int64_t s, std::int32_t max_tokens, std::vector<std::int32_t>& out) override {
    out.clear();
    const auto& got = seen.at({r, s});
    asked.emplace_back(max_tokens, static_cast<std::int64_t>(got.size()));
    const std::size_t n = overlong ? 40 : static_cast<std::size_t>(max_tokens);
    const auto it = truth.find({r, s});
    for (std::size_t i = 0; i < n; ++i) {
      std::int32_t t = 0;
      if (random) {
        t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(vocab));
      } else {
        const std::size_t at = got.size() + i;
        t = it != truth.end() && at < it->second.size() ? it->second[at] : static_cast<std::int32_t>(i % 7);
        t = static_cast<std::int32_t>((t + skew) % vocab);
      }
      out.push_back(t);
    }
  }
  void finish(std::uint64_t, std::int64_t, bool done) override {
    ++finishes;
    completed += done ? 1 : 0;
  }
};

using results = std::map<std::pair<std::uint64_t, std::int64_t>, generation_result>;

results by_id(std::vector<generation_result> rs) {
  results out;
  for (auto& r : rs) out[{r.request_id, r.sample_index}] = std::move(r);
  return out;
}

sampling_params params(double temperature, std::uint64_t seed, std::int64_t max_new) {
  sampling_params p;
  p.temperature = temperature;
  p.seed = seed;
  p.max_new_tokens = max_new;
  return p;
}

// Two requests (groups of 3 and 1) through a generator, plain or with `drafts`.
results run(const policy_model& m, const sampling_params& p, draft_source* drafts, speculation_stats* stats = nullptr,
            std::int64_t max_draft = 4) {
  generator_options o;
  o.drafts = drafts;
  o.max_draft_tokens = static_cast<std::int32_t>(max_draft);
  generator g(m, o);
  g.submit(tokens(6, 40, 3), p, 3);
  sampling_params p2 = p;
  p2.seed = p.seed + 1;
  g.submit(tokens(9, 40, 4), p2, 1);
  auto out = by_id(g.run_until_idle());
  if (stats != nullptr) *stats = g.take_speculation_stats();
  CHECK(g.cache().blocks_in_use() == 0);
  return out;
}

std::map<std::pair<std::uint64_t, std::int64_t>, std::vector<std::int32_t>> token_map(const results& r) {
  std::map<std::pair<std::uint64_t, std::int64_t>, std::vector<std::int32_t>> out;
  for (const auto& [k, v] : r) out[k] = v.tokens;
  return out;
}

void check_same(const results& got, const results& ref) {
  REQUIRE(got.size() == ref.size());
  for (const auto& [k, r] : ref) {
    const generation_result& g = got.at(k);
    CHECK(g.tokens == r.tokens);
    CHECK(g.reason == r.reason);
    REQUIRE(g.logprobs.size() == r.logprobs.size());
    // A k + 1-row pass and one-row passes round differently in the last bits (sampler.hpp).
    for (std::size_t j = 0; j < r.logprobs.size(); ++j) CHECK(g.logprobs[j] == Approx(r.logprobs[j]).margin(1e-5));
  }
}

}  // namespace

TEST_CASE("verify_draft samples exactly the plain distribution under adversarial drafts", "[speculative]") {
  const std::vector<float> table = markov_table();
  std::vector<sampling_params> settings;
  for (const double t : {0.6, 1.0, 1.7}) settings.push_back(params(t, 0, 8));
  settings.push_back(params(1.0, 0, 8));
  settings.back().top_k = 3;
  settings.push_back(params(0.8, 0, 8));
  settings.back().top_p = 0.7;
  const int n = 30000;
  for (const sampling_params& p : settings) {
    for (const adversary a : {adversary::most_likely, adversary::least_likely, adversary::random}) {
      CAPTURE(p.temperature, p.top_k, p.top_p, static_cast<int>(a));
      std::mt19937 draft_rng(7);
      std::vector<double> hist(static_cast<std::size_t>(V * V), 0.0);
      std::int64_t first_drafted = 0, first_accepted = 0;
      double expected_accept = 0.0;
      for (int trial = 0; trial < n; ++trial) {
        sampler_rng rng(12345, static_cast<std::uint64_t>(trial));
        sampler_rng plain_rng(12345, static_cast<std::uint64_t>(trial));
        std::vector<std::int32_t> emitted;
        std::int32_t last = 0;
        bool first_call = true;
        while (emitted.size() < 3) {
          const std::vector<std::int32_t> d = adversary_draft(a, table, last, 2, p, draft_rng);
          std::vector<float> rows(row_after(table, last), row_after(table, last) + V);
          for (const std::int32_t t : d) rows.insert(rows.end(), row_after(table, t), row_after(table, t) + V);
          std::vector<sampled_token> out;
          verify_draft(rows.data(), V, d.data(), d.size(), p, rng, out);
          REQUIRE(!out.empty());
          REQUIRE(out.size() <= d.size() + 1);
          if (first_call) {
            ++first_drafted;
            first_accepted += out[0].token == d[0] ? 1 : 0;
            expected_accept += dense(table, last, p)[static_cast<std::size_t>(d[0])];
            first_call = false;
          }
          for (const sampled_token& t : out) {
            // Bit-identical to plain sampling with the same stream.
            const sampled_token ref = sample_token(row_after(table, last), V, p, plain_rng);
            REQUIRE(t.token == ref.token);
            REQUIRE(t.logprob == ref.logprob);
            emitted.push_back(t.token);
            last = t.token;
          }
        }
        hist[static_cast<std::size_t>(emitted[0] * V + emitted[1])] += 1;
      }
      // Chi-square of the first two tokens against q(t1 | 0) q(t2 | t1); cells below 5
      // expected are pooled; impossible cells must stay empty.
      const std::vector<double> q0 = dense(table, 0, p);
      double chi2 = 0, pooled_obs = 0, pooled_exp = 0;
      int cells = 0;
      for (std::int32_t t1 = 0; t1 < V; ++t1) {
        const std::vector<double> q1 = dense(table, t1, p);
        for (std::int32_t t2 = 0; t2 < V; ++t2) {
          const double e = n * q0[static_cast<std::size_t>(t1)] * q1[static_cast<std::size_t>(t2)];
          const double o = hist[static_cast<std::size_t>(t1 * V + t2)];
          if (e == 0.0) {
            REQUIRE(o == 0.0);
          } else if (e < 5.0) {
            pooled_obs += o;
            pooled_exp += e;
          } else {
            chi2 += (o - e) * (o - e) / e;
            ++cells;
          }
        }
      }
      if (pooled_exp > 0) {
        chi2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
        ++cells;
      }
      CHECK(chi2 < chi2_critical(cells - 1));
      // The first draft token is accepted with probability q(d): binomial, within 5 sigma.
      const double mean = expected_accept / static_cast<double>(first_drafted);
      const double sd = std::sqrt(std::max(mean * (1 - mean), 1e-12) / static_cast<double>(first_drafted));
      CHECK(std::abs(static_cast<double>(first_accepted) / static_cast<double>(first_drafted) - mean) <=
            5 * sd + 1e-12);
      if (a == adversary::least_likely && (p.top_k > 0 || p.top_p < 1)) CHECK(first_accepted == 0);
    }
  }
}

TEST_CASE("speculative generation emits the plain tokens with right wrong and random drafts", "[speculative]") {
  const policy_model m(small_dims(), 41, small_init_std);
  std::vector<sampling_params> settings{params(0.0, 1, 12), params(0.7, 2, 12), params(1.0, 3, 12),
                                        params(1.4, 4, 12)};
  settings.push_back(params(1.0, 5, 12));
  settings.back().top_k = 5;
  settings.push_back(params(0.9, 6, 12));
  settings.back().top_p = 0.8;
  for (const sampling_params& p : settings) {
    CAPTURE(p.temperature, p.top_k, p.top_p);
    const results plain = run(m, p, nullptr);
    for (int mode = 0; mode < 3; ++mode) {
      CAPTURE(mode);
      scripted_drafts d;
      d.truth = token_map(plain);
      d.skew = mode == 1 ? 1 : 0;
      d.random = mode == 2;
      speculation_stats st;
      const results got = run(m, p, &d, &st);
      check_same(got, plain);
      CHECK(st.verify_steps > 0);
      CHECK(d.starts == 4);
      CHECK(d.finishes == 4);
      CHECK(d.completed == 4);
      std::int64_t drafted = 0, accepted = 0;
      for (const auto& [k, r] : got) {
        drafted += r.speculation.drafted_tokens;
        accepted += r.speculation.accepted_tokens;
        // What the draft source saw is exactly what was emitted.
        CHECK(d.seen.at(k) == r.tokens);
        // Every token but the prefill's came from a verifying or a plain decode step, each
        // step timed.
        CHECK(r.speculation.verify_tokens + r.speculation.plain_tokens == static_cast<std::int64_t>(r.tokens.size()) - 1);
        CHECK((r.speculation.verify_steps == 0) == (r.speculation.verify_ns == 0));
        CHECK((r.speculation.plain_steps == 0) == (r.speculation.plain_ns == 0));
      }
      CHECK(drafted == st.drafted_tokens);
      CHECK(accepted == st.accepted_tokens);
      if (mode == 0) {
        CHECK(accepted == drafted);  // the true continuation is always accepted
        // 12 tokens: the first from the prefill, then two steps of 4 drafts + 1 (token 11),
        // then no room for a draft before the last token: a plain step.
        CHECK(st.verify_steps == 2);
        CHECK(st.plain_steps == 1);
      }
      if (mode == 1) CHECK(accepted == 0);
    }
  }
}

TEST_CASE("speculation stops at an eos inside an accepted draft and clamps drafts to the budget", "[speculative]") {
  const policy_model m(small_dims(), 42, small_init_std);
  sampling_params p = params(0.0, 1, 12);
  const results free_run = run(m, p, nullptr);
  // An eos id that the first sample emits at position 4 (and not before).
  const std::vector<std::int32_t>& t = free_run.begin()->second.tokens;
  std::size_t at = 4;
  while (std::find(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(at), t[at]) != t.begin() + static_cast<std::ptrdiff_t>(at)) ++at;
  p.eos_token_ids = {t[at]};
  const results plain = run(m, p, nullptr);
  CHECK(plain.begin()->second.reason == finish_reason::eos);
  CHECK(plain.begin()->second.tokens.size() == at + 1);
  scripted_drafts d;
  d.truth = token_map(free_run);  // drafts run past the eos
  d.overlong = true;              // and ignore max_tokens
  const results got = run(m, p, &d, nullptr, 16);
  check_same(got, plain);
  // Every draft request left room for the last token within max_new_tokens.
  for (const auto& [max_tokens, used] : d.asked) {
    CHECK(max_tokens >= 1);
    CHECK(max_tokens <= 12 - used - 1);
  }
}

TEST_CASE("speculation at the context limit and with empty drafts matches plain decoding", "[speculative]") {
  sorl::ml::model_dims dims = small_dims();
  dims.max_seq = 16;
  const policy_model m(dims, 43, small_init_std);
  const sampling_params p = params(1.0, 9, 100);
  generator plain_gen(m);
  plain_gen.submit(tokens(10, 40, 5), p, 2);
  const results plain = by_id(plain_gen.run_until_idle());
  for (const auto& [k, r] : plain) CHECK(r.tokens.size() == 6);  // positions 10..15
  scripted_drafts d;
  d.truth = token_map(plain);
  d.overlong = true;
  generator_options o;
  o.drafts = &d;
  o.max_draft_tokens = 16;
  generator g(m, o);
  g.submit(tokens(10, 40, 5), p, 2);
  check_same(by_id(g.run_until_idle()), plain);
  for (const auto& [max_tokens, used] : d.asked) CHECK(10 + used + max_tokens <= 16);
  CHECK(g.cache().blocks_in_use() == 0);

  // A source that never drafts: plain steps only.
  struct silent : draft_source {
    void start(std::uint64_t, std::int64_t, const std::vector<std::int32_t>&) override {}
    void extend(std::uint64_t, std::int64_t, const std::int32_t*, std::size_t) override {}
    void draft(std::uint64_t, std::int64_t, std::int32_t, std::vector<std::int32_t>& out) override { out.clear(); }
    void finish(std::uint64_t, std::int64_t, bool) override {}
  } quiet;
  speculation_stats st;
  const policy_model m2(small_dims(), 44, small_init_std);
  check_same(run(m2, params(0.8, 3, 10), &quiet, &st), run(m2, params(0.8, 3, 10), nullptr));
  CHECK(st.verify_steps == 0);
  CHECK(st.plain_steps == 9);
  CHECK(st.draft_calls > 0);
  // Switched off, the source is not asked at all.
  generator_options off;
  off.drafts = &d;
  generator g2(m2, off);
  g2.set_speculating(false);
  d.asked.clear();
  g2.submit(tokens(5, 40, 1), params(0.8, 3, 10), 1);
  g2.run_until_idle();
  CHECK(d.asked.empty());
  CHECK(g2.take_speculation_stats().verify_steps == 0);
}

TEST_CASE("parked KV after speculative turns continues as after plain turns", "[speculative]") {
  const policy_model m(small_dims(), 45, small_init_std);
  const sampling_params p = params(0.9, 11, 7);
  auto two_turns = [&](draft_source* drafts) {
    generator_options o;
    o.drafts = drafts;
    generator g(m, o);
    const std::vector<std::int32_t> first = tokens(6, 40, 8);
    g.submit(first, p, 2, {}, kv_reuse{true, 0});
    auto turn1 = g.run_until_idle();
    std::sort(turn1.begin(), turn1.end(), [](const auto& a, const auto& b) { return a.sample_index < b.sample_index; });
    std::vector<std::int32_t> second = first;
    second.insert(second.end(), turn1[0].tokens.begin(), turn1[0].tokens.end());
    const std::vector<std::int32_t> env = tokens(3, 40, 9);
    second.insert(second.end(), env.begin(), env.end());
    g.release(turn1[1].parked);
    sampling_params p2 = p;
    p2.seed = 12;
    g.submit(second, p2, 1, {}, kv_reuse{false, turn1[0].parked});
    auto turn2 = g.run_until_idle();
    CHECK(g.cache().blocks_in_use() == 0);
    turn1.insert(turn1.end(), turn2.begin(), turn2.end());
    return turn1;
  };
  const auto plain = two_turns(nullptr);
  scripted_drafts d;
  d.random = true;
  d.vocab = 40;
  const auto spec = two_turns(&d);
  REQUIRE(spec.size() == plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CHECK(spec[i].tokens == plain[i].tokens);
    for (std::size_t j = 0; j < plain[i].logprobs.size(); ++j)
      CHECK(spec[i].logprobs[j] == Approx(plain[i].logprobs[j]).margin(1e-5));
  }
}
