#pragma once

// Token sampling for rollouts: temperature, top-k, top-p (nucleus), greedy; a per-request
// random stream; stop conditions. Plain C++ on one row of fp32 logits at a time (no torch), so
// a request's samples are computed the same way whatever else shares its batch.
//
// Log-probs and truncation. Every sampled token carries
//     logprob = log_softmax(logits / temperature)[token]      (full vocabulary, no truncation)
// which is the log-probability the learner recomputes for the same token (the "training
// distribution"). The token itself is drawn from the *processed* distribution q: the training
// distribution p restricted to the top-k / top-p set and renormalised, so
// q(token) = p(token) / p(kept set) >= p(token), and tokens outside the kept set have
// q = 0 < p. With top_k = 0 (or >= vocab) and top_p >= 1, q = p and rollouts are exactly
// on-policy; with truncation the rollout is slightly off-policy for p, by a factor of
// 1 / p(kept set) on each kept token, which the learner's importance ratio against these
// log-probs does not see. Greedy decoding (temperature 0) reports log_softmax(logits) (i.e.
// temperature 1), since logits / 0 is undefined.
//
// Batch independence. Each sample owns a sampler_rng seeded from (request seed, sample index),
// draws exactly one uniform per token, and reads only its own logits row, so its tokens do not
// depend on its batch mates — up to floating point: the logits themselves can differ in the
// last bits when the batch composition changes (different matmul blocking), which flips a
// token only when a uniform lands within ~1e-6 of a boundary of the cumulative distribution.

// Precision and the top-p boundary. Temperature and top-p are doubles from the configuration to
// this file: a value the user writes (0.8) is compared as that double, never as its fp32
// neighbour (0.800000011920929, which would keep a token whose boundary is exactly 0.8). The
// top-p rule, exactly: sort the candidates (the top-k set, or the whole vocabulary) by
// descending logit, ties to the lower id; weigh them w_i = exp((l_i - l_max) / T) in double;
// with prefix sums W_j = w_1 + ... + w_j (added in that order, so W_n = S is the total) the
// mass of the first j tokens is W_j / S, one correctly rounded division, and the kept set is
// the smallest prefix with W_j / S >= top_p. Because the mass is not accumulated from
// separately rounded probabilities (where 0.1 + ... + 0.1, eight times, is 0.7999999999999999),
// a boundary that is exact in real numbers is met exactly whenever the weights sum exactly
// (equal logits, as in tests): 8 of 10 equal logits have mass fl(8 / 10) = 0.8 = top_p. Every
// step is a fixed sequence of IEEE double operations, so the kept set is the same on every
// run and platform. The kept tokens are renormalised as q_i = w_i / W_j.
//
// Temperature range. A temperature is 0 (greedy) or at least min_temperature. Smaller positive
// values cannot be computed in fp32 on the learner's side: it divides fp32 logits by T, and as
// T falls the quotients and the gradient (proportional to 1 / T) overflow (T = 1e-40 rounds to
// an fp32 denormal and gives NaN log-probs). The floor is the one vLLM applies.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace sorl::ml {

/// Why a sample stopped.
enum class finish_reason : std::uint8_t {
  eos,     ///< sampled one of sampling_params::eos_token_ids (kept as the last token)
  length,  ///< reached max_new_tokens, or the model's context (max_seq)
  stop,    ///< the decoded completion contains a stop string (completing token kept)
  abort,   ///< cancelled by the caller
};

/// "eos", "length", "stop" or "abort".
const char* to_string(finish_reason r) noexcept;

/// Smallest positive temperature (see the file comment): 0 < T < min_temperature is refused.
inline constexpr double min_temperature = 0.01;

/// How one request samples and when it stops.
struct sampling_params {
  /// Softmax temperature: 0 = greedy (argmax, lowest id on ties), else in
  /// [min_temperature, inf). Double, so the value arrives as the user wrote it.
  double temperature = 1.0;
  /// Keep the k most probable tokens; 0 or >= vocab = off, 1 = greedy. Must be >= 0.
  std::int64_t top_k = 0;
  /// Keep the smallest most-probable set whose probability reaches top_p (after top-k; the
  /// exact rule is in the file comment); >= 1 = off; <= 0 keeps only the most probable token
  /// (greedy). Must not be NaN. Double, so 0.8 is compared as 0.8.
  double top_p = 1.0;
  /// Completion budget in tokens, >= 1.
  std::int64_t max_new_tokens = 256;
  /// Tokens that end the completion with finish_reason::eos (EOS, end-of-turn markers).
  std::vector<std::int32_t> eos_token_ids;
  /// Strings that end the completion with finish_reason::stop once the decoded completion
  /// contains one; needs a detokenizer. Empty strings are not allowed.
  std::vector<std::string> stop_strings;
  /// Seed of the request's random streams; sample i of a group uses stream i.
  std::uint64_t seed = 0;
};

/// Throws std::invalid_argument naming the field: temperature not finite, negative, or in
/// (0, min_temperature); top_k < 0, top_p NaN, max_new_tokens < 1, an empty stop string.
void validate(const sampling_params& p);

/// Per-sample pseudo-random stream: xoshiro256** (Blackman & Vigna 2018) seeded through
/// splitmix64 from (seed, stream). Same numbers on every platform and compiler.
class sampler_rng {
 public:
  explicit sampler_rng(std::uint64_t seed, std::uint64_t stream = 0) noexcept;
  /// Next 64 random bits.
  std::uint64_t next_u64() noexcept;
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept;

 private:
  std::uint64_t s_[4];
};

/// One token of a processed distribution.
struct token_prob {
  std::int32_t token;
  double prob;
};

/// The processed sampling distribution q of one logits row (see the file comment for the exact
/// top-p rule): the kept tokens in descending probability (ties: lower id first),
/// probabilities summing to 1 (up to double rounding), none of them 0.
/// Greedy cases (temperature 0, top_k 1, top_p <= 0) give the single argmax token. Speculative
/// verification must accept drafts against exactly this distribution.
/// logits: `vocab` fp32 values, -inf allowed (masked tokens). Time O(vocab) without top-k (the
/// ranking is a radix sort), O(vocab log k) with it. Throws std::invalid_argument for
/// vocab < 1, a NaN or +inf logit, or every logit -inf; and what validate() throws.
std::vector<token_prob> sampling_distribution(const float* logits, std::int64_t vocab,
                                              const sampling_params& p);

/// log_softmax(logits / temperature)[token] over the full vocabulary, computed in double;
/// temperature 0 is read as 1. Throws std::invalid_argument for a token outside [0, vocab).
double training_logprob(const float* logits, std::int64_t vocab, double temperature,
                        std::int32_t token);

/// A sampled token and its training_logprob.
struct sampled_token {
  std::int32_t token;
  float logprob;
};

/// Draws one token from sampling_distribution(logits, vocab, p) by inverse CDF with one
/// rng.uniform() (always exactly one, greedy included, so a stream's position equals the
/// number of tokens drawn). Same errors as sampling_distribution.
sampled_token sample_token(const float* logits, std::int64_t vocab, const sampling_params& p,
                           sampler_rng& rng);

/// Exact verification of a deterministic draft (speculative decoding; the rule and why it is
/// exact are in generate.hpp). `rows`: k + 1 logits rows of `vocab` fp32 values, row j the
/// model's distribution after the context and draft[0..j). Position j draws with
/// sample_token (one uniform); the draw is appended to `out`; verification goes on to row
/// j + 1 only while the draw equals draft[j]. So 1..k + 1 tokens are appended, the stream
/// advances by as many uniforms, and they are the tokens sample_token would draw from the
/// same rows one at a time. Same errors as sample_token.
void verify_draft(const float* rows, std::int64_t vocab, const std::int32_t* draft, std::size_t k,
                  const sampling_params& p, sampler_rng& rng, std::vector<sampled_token>& out);

/// Turns completion token ids into text for stop-string matching (the tokenizer's decode).
using detokenize_fn = std::function<std::string(const std::vector<std::int32_t>&)>;

/// Decides after each new token whether a completion is finished, in priority order:
/// eos (last token is an EOS id) > stop (decoded completion contains a stop string) >
/// length (max_new_tokens reached). The context limit is the generator's business.
class stop_checker {
 public:
  /// Throws std::invalid_argument when p has stop strings but `detokenize` is empty.
  stop_checker(const sampling_params& p, detokenize_fn detokenize);
  /// `completion`: every token generated so far, the newest last. nullopt = keep going.
  /// Decodes the whole completion on each call: robust to tokens whose text changes once
  /// more bytes follow (partial UTF-8). TODO(perf): decode a bounded tail for long outputs.
  std::optional<finish_reason> check(const std::vector<std::int32_t>& completion) const;

 private:
  std::vector<std::int32_t> eos_;
  std::vector<std::string> stops_;
  std::int64_t max_new_tokens_;
  detokenize_fn detokenize_;
};

}  // namespace sorl::ml
