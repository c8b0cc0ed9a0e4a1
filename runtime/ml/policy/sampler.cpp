#include "runtime/ml/policy/sampler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace sorl::ml {

const char* to_string(finish_reason r) noexcept {
  switch (r) {
    case finish_reason::eos: return "eos";
    case finish_reason::length: return "length";
    case finish_reason::stop: return "stop";
    case finish_reason::abort: return "abort";
  }
  return "?";
}

void validate(const sampling_params& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0 ||
      (p.temperature > 0.0 && p.temperature < min_temperature))
    throw std::invalid_argument(fmt::format(
        "sampling_params.temperature must be 0 (greedy) or in [{}, inf), got {}", min_temperature,
        p.temperature));
  if (p.top_k < 0)
    throw std::invalid_argument(fmt::format("sampling_params.top_k must be >= 0, got {}", p.top_k));
  if (std::isnan(p.top_p)) throw std::invalid_argument("sampling_params.top_p is NaN");
  if (p.max_new_tokens < 1)
    throw std::invalid_argument(
        fmt::format("sampling_params.max_new_tokens must be >= 1, got {}", p.max_new_tokens));
  for (const auto& s : p.stop_strings)
    if (s.empty()) throw std::invalid_argument("sampling_params.stop_strings holds an empty string");
}

// ---------------------------------------------------------------------------------------------
// sampler_rng

namespace {

std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

}  // namespace

sampler_rng::sampler_rng(std::uint64_t seed, std::uint64_t stream) noexcept {
  // splitmix64 is a bijection of its state, so distinct streams of one seed start from
  // distinct states.
  std::uint64_t x = seed;
  std::uint64_t mixed = splitmix64(x) + stream;
  for (auto& w : s_) w = splitmix64(mixed);
}

std::uint64_t sampler_rng::next_u64() noexcept {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double sampler_rng::uniform() noexcept {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

// ---------------------------------------------------------------------------------------------
// distributions

namespace {

std::int32_t argmax(const float* logits, std::int64_t vocab) {
  std::int64_t best = -1;
  for (std::int64_t i = 0; i < vocab; ++i) {
    // NaN, or +inf (an overflowed model: inf - inf would make every weight NaN).
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
      throw std::invalid_argument(
          fmt::format("logits[{}] is {}", i, std::isnan(logits[i]) ? "NaN" : "+inf"));
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  if (logits[best] == -std::numeric_limits<float>::infinity())
    throw std::invalid_argument("every logit is -inf: nothing to sample");
  return static_cast<std::int32_t>(best);
}

}  // namespace

namespace {

/// Sorts `keys` ascending by their high 32 bits, stably: an LSD radix sort in three passes of
/// 11, 11 and 10 bits (linear time; a comparison sort of a 49,152-token vocabulary per sampled
/// token was a third of a decode step). Keys that arrive in ascending order of their low word
/// (token ids) therefore come out in ascending order of the whole key.
void radix_sort_by_high_word(std::vector<std::uint64_t>& keys) {
  std::vector<std::uint64_t> buffer(keys.size());
  std::vector<std::uint64_t>* from = &keys;
  std::vector<std::uint64_t>* to = &buffer;
  for (const auto& [shift, bits] : {std::pair{32, 11}, std::pair{43, 11}, std::pair{54, 10}}) {
    const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
    std::vector<std::size_t> start((std::size_t{1} << bits) + 1, 0);
    for (const std::uint64_t key : *from)
      ++start[((key >> shift) & mask) + 1];
    for (std::size_t d = 1; d < start.size(); ++d)
      start[d] += start[d - 1];
    for (const std::uint64_t key : *from)
      (*to)[start[(key >> shift) & mask]++] = key;
    std::swap(from, to);
  }
  if (from != &keys)
    keys.swap(*from);
}

}  // namespace

std::vector<token_prob> sampling_distribution(const float* logits, std::int64_t vocab,
                                              const sampling_params& p) {
  validate(p);
  if (vocab < 1) throw std::invalid_argument(fmt::format("vocab must be >= 1, got {}", vocab));
  const std::int32_t best = argmax(logits, vocab);  // also rejects NaN / all -inf
  if (p.temperature == 0.0 || p.top_k == 1 || p.top_p <= 0.0) return {{best, 1.0}};

  const double inv_t = 1.0 / p.temperature;
  const double zmax = static_cast<double>(logits[best]) * inv_t;
  // The order is logit descending, ties by token id ascending: a strict total order, so any
  // correct sort gives the same sequence. Ranking one 64-bit key per token (the logit's bits
  // mapped to an unsigned order, then the id) in linear time replaces a comparison sort through
  // the logits. Dividing by a positive temperature keeps the order, so ranking raw logits is
  // exact.
  std::vector<std::uint64_t> keys(static_cast<std::size_t>(vocab));
  for (std::int64_t t = 0; t < vocab; ++t) {
    const float f = logits[t] == 0.0f ? 0.0f : logits[t];  // -0 ties with +0, as == says
    std::uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    // Unsigned order of the float's value (NaN is refused above), then inverted: descending.
    const std::uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    keys[static_cast<std::size_t>(t)] =
      (static_cast<std::uint64_t>(~ascending) << 32) | static_cast<std::uint32_t>(t);
  }
  const std::int64_t k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  if (k == vocab)
    radix_sort_by_high_word(keys);
  else
    std::partial_sort(keys.begin(), keys.begin() + k, keys.end());
  std::vector<std::int32_t> order(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < k; ++i)
    order[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(keys[static_cast<std::size_t>(i)] & 0xffffffffu);

  // Weights and their prefix sums W_j in kept order (see the file comment for the rule).
  std::vector<token_prob> out;
  out.reserve(order.size());
  std::vector<double> prefix;
  prefix.reserve(order.size());
  double sum = 0.0;
  for (const std::int32_t t : order) {
    const double w = std::exp(static_cast<double>(logits[t]) * inv_t - zmax);
    if (w == 0.0) break;  // -inf logits, or underflow: every later weight is 0 too
    out.push_back({t, w});
    sum += w;
    prefix.push_back(sum);
  }
  std::size_t keep = out.size();
  if (p.top_p < 1.0) {
    // Smallest prefix whose mass W_j / S reaches top_p (Holtzman et al. 2020, eq. 2). The last
    // prefix is S itself, mass exactly 1, so some j always qualifies.
    keep = 1;
    while (prefix[keep - 1] / sum < p.top_p) ++keep;
  }
  out.resize(keep);
  const double kept_mass = prefix[keep - 1];
  for (auto& tp : out) tp.prob /= kept_mass;
  return out;
}

double training_logprob(const float* logits, std::int64_t vocab, double temperature,
                        std::int32_t token) {
  if (token < 0 || token >= vocab)
    throw std::invalid_argument(fmt::format("token {} outside [0, {})", token, vocab));
  const double inv_t = temperature > 0.0 ? 1.0 / temperature : 1.0;
  double zmax = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < vocab; ++i) zmax = std::max(zmax, static_cast<double>(logits[i]) * inv_t);
  double sum = 0.0;
  for (std::int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) * inv_t - zmax);
  return static_cast<double>(logits[token]) * inv_t - zmax - std::log(sum);
}

sampled_token sample_token(const float* logits, std::int64_t vocab, const sampling_params& p,
                           sampler_rng& rng) {
  const std::vector<token_prob> dist = sampling_distribution(logits, vocab, p);
  const double u = rng.uniform();
  std::int32_t token = dist.back().token;  // if rounding leaves u past the last edge
  double acc = 0.0;
  for (const auto& tp : dist) {
    acc += tp.prob;
    if (u < acc) {
      token = tp.token;
      break;
    }
  }
  return {token, static_cast<float>(training_logprob(logits, vocab, p.temperature, token))};
}

void verify_draft(const float* rows, std::int64_t vocab, const std::int32_t* draft, std::size_t k,
                  const sampling_params& p, sampler_rng& rng, std::vector<sampled_token>& out) {
  for (std::size_t j = 0; j <= k; ++j) {
    out.push_back(sample_token(rows + static_cast<std::int64_t>(j) * vocab, vocab, p, rng));
    if (j < k && out.back().token != draft[j]) return;
  }
}

// ---------------------------------------------------------------------------------------------
// stop_checker

stop_checker::stop_checker(const sampling_params& p, detokenize_fn detokenize)
    : eos_(p.eos_token_ids),
      stops_(p.stop_strings),
      max_new_tokens_(p.max_new_tokens),
      detokenize_(std::move(detokenize)) {
  if (!stops_.empty() && !detokenize_)
    throw std::invalid_argument("stop_checker: stop strings need a detokenize function");
}

std::optional<finish_reason> stop_checker::check(const std::vector<std::int32_t>& completion) const {
  if (completion.empty()) return std::nullopt;
  if (std::find(eos_.begin(), eos_.end(), completion.back()) != eos_.end()) return finish_reason::eos;
  if (!stops_.empty()) {
    const std::string text = detokenize_(completion);
    for (const auto& s : stops_)
      if (text.find(s) != std::string::npos) return finish_reason::stop;
  }
  if (static_cast<std::int64_t>(completion.size()) >= max_new_tokens_) return finish_reason::length;
  return std::nullopt;
}

}  // namespace sorl::ml
