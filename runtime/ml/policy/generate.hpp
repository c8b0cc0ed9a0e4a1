#pragma once

// Batched generation with continuous batching: a generator owns a kv_cache, admits groups of
// samples, prefills each group's prompt once (siblings fork the prompt's KV), and advances all
// live samples by one token per step(); finished samples leave the batch at once and queued
// groups take their place. A finished sample's KV can be parked and a later request that
// extends its tokens (the next turn of a multi-turn episode) continues from it, prefilling only
// the new tokens. Called from one thread (a rollout worker).

#include "runtime/ml/policy/kv_cache.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/policy/prefix_cache.hpp"
#include "runtime/ml/policy/sampler.hpp"

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

namespace sorl::ml {

/// Where a generator gets drafts for speculative decoding (ARCHITECTURE.md §6 WAR): a
/// deterministic function of text already generated, never of the verification's random
/// numbers. The generator tells it what every sample emits; it answers draft() calls. The
/// rollout worker's is the suffix-tree drafter (actors/suffix_index/suffix_drafter.hpp).
class draft_source {
 public:
  virtual ~draft_source() = default;
  /// Sample `sample` (its random stream) of request `request_id` joins the batch after
  /// `prompt` (the whole prompt, a parked prefix included).
  virtual void start(std::uint64_t request_id, std::int64_t sample, const std::vector<std::int32_t>& prompt) = 0;
  /// The tokens the sample emitted in one step, in order.
  virtual void extend(std::uint64_t request_id, std::int64_t sample, const std::int32_t* tokens,
                      std::size_t n) = 0;
  /// Writes at most max_tokens (>= 1) proposed next tokens of the sample into `out`
  /// (cleared first; empty = no draft).
  virtual void draft(std::uint64_t request_id, std::int64_t sample, std::int32_t max_tokens,
                     std::vector<std::int32_t>& out) = 0;
  /// The sample left the batch: `completed` when it finished by eos, stop or length (its
  /// text is a whole response), false for an abort.
  virtual void finish(std::uint64_t request_id, std::int64_t sample, bool completed) = 0;
};

/// Speculative decoding counters of a generator since construction (or take_speculation_stats).
struct speculation_stats {
  std::int64_t verify_steps = 0;     ///< steps whose decode pass verified at least one draft
  std::int64_t plain_steps = 0;      ///< steps with live samples and no draft
  std::int64_t draft_calls = 0;      ///< draft_source::draft calls
  std::int64_t draft_ns = 0;         ///< time in those calls, ns
  std::int64_t drafted_tokens = 0;   ///< draft tokens fed to the model
  std::int64_t accepted_tokens = 0;  ///< draft tokens that were emitted
  std::int64_t decode_tokens = 0;    ///< tokens emitted by decode rows (prefill rows excluded)
  std::int64_t decode_ns = 0;        ///< time of steps' decode work (drafts, passes, sampling), ns
};

/// Limits of a generator.
struct generator_options {
  /// Most samples decoding at once; a group is admitted whole when it fits (FIFO).
  std::int64_t max_batch = 64;
  kv_cache_options cache{};
  /// A step whose longest admitted prefill has at least this many new tokens runs the live
  /// samples' one-token decodes and the prefills as two forward passes, so that the decode
  /// rows are not padded to the prefill's length (forward_cached pads every query to the
  /// longest); shorter prefills share the decodes' pass, where the padding costs less than a
  /// second pass (bench/decode_bench --mixed measures both). Tokens, >= 2.
  std::int64_t separate_prefill_tokens = 16;
  /// Drafts for speculative decoding; null = plain decoding. Not owned; must outlive the
  /// generator.
  draft_source* drafts = nullptr;
  /// Longest draft per sample and step, tokens, >= 1 (with drafts).
  std::int32_t max_draft_tokens = 16;
  /// Prefix KV cache (runtime/ml/policy/prefix_cache.hpp): tokens of KV kept, in whole cache
  /// blocks, from admitted prompts and finished samples, so that a later prompt with the same start
  /// prefills only what follows it. 0 = off. >= 0.
  std::int64_t prefix_cache_tokens = 0;
  /// With the prefix cache: a queued prompt that shares whole blocks beyond its cached prefix
  /// with a prompt admitted in the same step waits one step, then finds those blocks cached,
  /// instead of prefilling them a second time in the same pass (requests behind it are
  /// admitted meanwhile). At high load a step admits many prompts at once, and prompts of one
  /// family (a shared system prompt) otherwise all miss together.
  bool defer_shared_prefill = true;
};

/// Where the prompt tokens of admitted requests came from, since construction (or
/// take_prefill_stats). A group's prompt counts once: its siblings fork one sequence.
struct prefill_stats {
  std::int64_t requests = 0;         ///< admitted requests (groups)
  std::int64_t prompt_tokens = 0;    ///< their prompts' tokens
  std::int64_t parked_tokens = 0;    ///< of them, continued from parked KV (kv_reuse::from)
  std::int64_t hit_tokens = 0;       ///< of them, served by the prefix cache
  std::int64_t computed_tokens = 0;  ///< of them, prefilled: the rest
  std::int64_t evicted_blocks = 0;   ///< prefix-cache blocks dropped to stay within its budget
  std::int64_t invalidated_blocks = 0;  ///< prefix-cache blocks dropped by a weight change
  std::int64_t cached_blocks = 0;    ///< prefix-cache blocks held now (not reset)

  /// Adds the counters of a later reading; cached_blocks becomes the later one's.
  prefill_stats& operator+=(const prefill_stats& o) noexcept {
    requests += o.requests;
    prompt_tokens += o.prompt_tokens;
    parked_tokens += o.parked_tokens;
    hit_tokens += o.hit_tokens;
    computed_tokens += o.computed_tokens;
    evicted_blocks += o.evicted_blocks;
    invalidated_blocks += o.invalidated_blocks;
    cached_blocks = o.cached_blocks;
    return *this;
  }
};

/// Handle of a parked KV sequence (see generator); 0 = none. Never reused by a generator.
using parked_kv = std::uint64_t;

/// How a request uses KV across requests (multi-turn continuation).
struct kv_reuse {
  /// Park each sample's KV when it finishes by eos, stop or length (not abort, not when the
  /// step throws): its generation_result::parked names it.
  bool park = false;
  /// A parked sequence whose tokens are a strict prefix of the new prompt; the request takes
  /// it over (the handle is spent at submit) and prefills only the prompt's remaining tokens.
  /// Siblings of a group fork it. 0 = prefill the whole prompt.
  parked_kv from = 0;
  /// Admission order: a queued request with a higher priority is admitted before those with
  /// a lower one, first come first served among equals. A rollout worker gives a later turn
  /// the number of turns its episode has done, so that episodes far along finish first and
  /// the step's tail (its last episode) ends sooner. 0 = plain FIFO.
  std::int64_t priority = 0;
};

/// Speculative decoding of one sample.
struct sample_speculation {
  std::int64_t drafted_tokens = 0;   ///< draft tokens verified for this sample
  std::int64_t accepted_tokens = 0;  ///< of them, emitted
  std::int64_t verify_steps = 0;     ///< decode steps that verified a draft for it
  std::int64_t plain_steps = 0;      ///< decode steps without one
  std::int64_t draft_calls = 0;      ///< draft_source::draft calls for it
  std::int64_t draft_ns = 0;         ///< time in those calls, ns
  /// Tokens emitted in its verifying steps and those steps' wall time, ns; likewise in its
  /// decode steps without a draft: its own decoding speed with and without speculation.
  std::int64_t verify_tokens = 0, verify_ns = 0, plain_tokens = 0, plain_ns = 0;
};

/// One finished sample of a request.
struct generation_result {
  std::uint64_t request_id = 0;
  std::int64_t sample_index = 0;        ///< its random stream: 0..group_size-1, or the given stream
  std::int64_t prompt_tokens = 0;
  /// Of prompt_tokens, those this sample did not prefill: parked KV, prefix-cache hits, and
  /// for every sibling but the group's first (sample of streams[0]) the whole prompt, whose
  /// KV it forks. Summed over results, prompt_tokens - cached_tokens is the prefill computed.
  std::int64_t cached_tokens = 0;
  std::vector<std::int32_t> tokens;     ///< completion, EOS / stop-completing token included
  std::vector<float> logprobs;          ///< training log-prob of each token (sampler.hpp)
  finish_reason reason = finish_reason::length;
  /// The sample's parked KV when its request asked for kv_reuse::park, else 0. It caches
  /// prompt + tokens minus the last token (sampled, never fed): prompt_tokens + tokens.size()
  /// - 1 positions. The caller submits a continuation from it or release()s it.
  parked_kv parked = 0;
  sample_speculation speculation;  ///< all 0 without generator_options::drafts
};

/// Continuous-batching sampler over a policy_model.
///
/// Speculative decoding (generator_options::drafts, while speculating() is on). A live sample
/// with a draft d_1..d_k feeds [its last token, d_1..d_k] in the step's decode pass and gets
/// k + 1 logits rows. Position j's token is drawn exactly as plain decoding draws it: one
/// uniform from the sample's own stream, inverse CDF of sampling_distribution (temperature,
/// top-k, top-p). If it equals d_{j+1} the draft token is accepted and position j + 1 is
/// read; otherwise it is emitted and the step ends for the sample; after a fully accepted
/// draft, row k gives one more token. This is the exact rule for deterministic drafts
/// (Leviathan et al. 2023, arXiv 2211.17192, with a point-mass draft; Chen et al. 2023): the
/// draw equals d with probability q(d), and given that it does not, it is distributed as q
/// with d removed and renormalised, because the same uniform lands uniformly in the rest of
/// the CDF. As a consequence a sample emits the very tokens plain decoding would emit from
/// the same logits: speculation changes the number of forward passes, not the rollout (up
/// to the last-bit differences between a k + 1-row pass and one-row passes, which sampler.hpp
/// discusses for batch composition). Log-probs are recorded as the plain path records them.
/// Drafts are clamped to the tokens still allowed (max_new_tokens minus one, and the context
/// up to max_seq); an eos or stop string inside an accepted draft ends the sample there; the
/// KV of rejected positions is truncated. The model must outlive the generator and
/// must not change weights while samples are in flight (their KV would mix two versions).
/// Parked KV and prefix-cache entries were computed under the weights of their time: whoever
/// changes the model's weights calls set_weights_version() with the change
/// (worker_core::weights_changed does), or a later continuation or cache hit would attend to
/// keys and values of the old policy. Parked sequences hold
/// cache blocks until they are continued, released, or the generator is destroyed.
class generator {
 public:
  /// Throws std::invalid_argument for max_batch < 1, bad cache options, or drafts with
  /// max_draft_tokens < 1.
  explicit generator(const policy_model& model, generator_options opts = {});
  ~generator();
  generator(const generator&) = delete;
  generator& operator=(const generator&) = delete;

  /// Queues a request of `group_size` samples of `prompt` (token ids, 1 <= size < max_seq).
  /// Sample i draws from sampler_rng(params.seed, i), so its tokens do not depend on the other
  /// requests in flight (up to the floating-point caveat in sampler.hpp). `detokenize` is
  /// needed when params.stop_strings is non-empty. Returns the request id.
  /// Throws std::invalid_argument for bad params, an empty or too long prompt, token ids
  /// outside the vocabulary, or group_size outside [1, max_batch]; and, for reuse.from, an
  /// unknown (released or spent) handle or parked tokens that are not a strict prefix of
  /// `prompt` (the message names both lengths and the first mismatch). On a throw the
  /// parked sequence stays parked.
  std::uint64_t submit(std::vector<std::int32_t> prompt, const sampling_params& params,
                       std::int64_t group_size = 1, detokenize_fn detokenize = {}, kv_reuse reuse = {});
  /// As above with explicit random streams: sibling i draws from sampler_rng(params.seed,
  /// streams[i]) and comes back with sample_index = streams[i]. A rollout worker that holds
  /// only some samples of a group passes their indices, so each sample's tokens are the same
  /// whichever worker generates it. Throws std::invalid_argument also for negative or
  /// repeated streams.
  std::uint64_t submit(std::vector<std::int32_t> prompt, const sampling_params& params,
                       std::vector<std::int64_t> streams, detokenize_fn detokenize = {},
                       kv_reuse reuse = {});

  /// Frees a parked sequence's cache blocks. Returns false (and does nothing) for 0 or a
  /// handle that is not parked (already released, or spent by a continuation).
  bool release(parked_kv handle);
  /// Frees every parked sequence; call it whenever the model's weights change.
  void release_all_parked();
  /// Parked sequences held now.
  std::int64_t parked_count() const noexcept;
  /// The model's weights are now `version`: frees every parked sequence and drops every
  /// prefix-cache entry of another version (their KV was computed under other weights).
  /// Call it with every weight change, between steps.
  void set_weights_version(std::uint64_t version);
  /// The prefix cache; null when generator_options::prefix_cache_tokens is 0.
  const prefix_cache* prefixes() const noexcept { return prefix_.get(); }
  /// Reads and resets the prefill counters.
  prefill_stats take_prefill_stats() noexcept;

  /// Admits queued groups that fit, runs the forward pass (prefill of admitted prompts, or of
  /// a continuation's new tokens, and one decode token for every live sample; one pass, or
  /// two, see generator_options::separate_prefill_tokens) and samples one token for each.
  /// Returns the samples that finished in this step (empty when idle).
  std::vector<generation_result> step();
  /// Calls step() until nothing is queued or live; returns every finished sample in order.
  std::vector<generation_result> run_until_idle();
  /// Cancels a request: its live and queued samples come back now with finish_reason::abort
  /// and the tokens generated so far; nothing is parked, and the parked sequence a queued
  /// continuation took over is freed. Unknown or finished ids return nothing.
  std::vector<generation_result> abort(std::uint64_t request_id);

  std::int64_t live_samples() const noexcept;
  /// Progress of one live sample: (request id, sample_index, tokens generated so far).
  struct sample_progress {
    std::uint64_t request_id = 0;
    std::int64_t sample_index = 0;
    std::int64_t tokens = 0;
  };
  /// Every live (admitted, unfinished) sample; for timing messages while decoding goes on.
  std::vector<sample_progress> progress() const;
  std::int64_t queued_requests() const noexcept;
  bool idle() const noexcept { return live_samples() == 0 && queued_requests() == 0; }
  const kv_cache& cache() const noexcept;

  /// Turns speculation on or off for later steps (with generator_options::drafts; a no-op
  /// without). On by default when drafts are given. The load-aware switch of the rollout
  /// worker calls it.
  void set_speculating(bool on) noexcept { speculating_ = on; }
  /// The longest draft of later steps, tokens; values below 1 read as 1.
  void set_max_draft_tokens(std::int32_t k) noexcept { opts_.max_draft_tokens = k < 1 ? 1 : k; }
  bool speculating() const noexcept { return speculating_ && opts_.drafts != nullptr; }
  /// Reads and resets the speculation counters.
  speculation_stats take_speculation_stats() noexcept;

 private:
  struct request;
  struct sample;
  struct parked_seq {
    seq_id seq = -1;
    std::vector<std::int32_t> tokens;  // what the sequence caches
  };
  generation_result finish(sample& s, finish_reason reason);
  /// Whether queued request `r` would prefill whole blocks that a request of `admitted`
  /// prefills in the same pass (generator_options::defer_shared_prefill).
  bool shares_uncached_prefill(const request& r, const std::vector<std::shared_ptr<request>>& admitted,
                               std::vector<std::int32_t>& scratch) const;
  void drop_request_kv(request& r);

  const policy_model& model_;
  generator_options opts_;
  std::unique_ptr<kv_cache> cache_;
  std::unique_ptr<prefix_cache> prefix_;  // after cache_: destroyed first, it drops references
  std::deque<std::shared_ptr<request>> queue_;
  std::vector<std::unique_ptr<sample>> live_;
  std::uint64_t next_request_ = 1;
  std::unordered_map<parked_kv, parked_seq> parked_;
  parked_kv next_parked_ = 1;
  bool speculating_ = true;
  speculation_stats spec_;
  prefill_stats prefill_;
};

}  // namespace sorl::ml
