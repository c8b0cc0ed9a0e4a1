#pragma once

// The rollout protocol's plain structs (messages/rollout.capnp decoded): what the trainer,
// the scheduler and the rollout workers exchange, free of Cap'n Proto, CAF and libtorch, so that
// the scheduler's and the trainer's cores and shells can read them without the worker's ML
// headers. The worker's logic on them is in actors/rollout/worker_core.hpp; their translation
// to and from the messages is actors/rollout/rollout_wire.hpp.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/ml/policy/sampler.hpp" // ml::finish_reason (no torch)
#include "runtime/ml/tasks/tasks.hpp"     // ml::task_split (no torch)

namespace sorl::rollout {

/// What speculative decoding did for one rollout (mirrors msg::SpeculationCounts).
struct speculation_counts {
  uint32_t verify_steps = 0;    ///< decode steps that verified a draft for it
  uint32_t plain_steps = 0;     ///< decode steps without a draft
  uint32_t drafted_tokens = 0;  ///< draft tokens verified
  uint32_t accepted_tokens = 0; ///< of them, emitted
  uint32_t draft_calls = 0;     ///< drafter calls made for it
  uint64_t draft_ns = 0;        ///< time in those calls, ns
  /// Tokens it emitted in decode steps that verified a draft for it, and those steps' wall
  /// time summed (the time the rollout waited on them), ns; likewise without a draft. Their
  /// ratios are the rollout's own decoding speed with and without speculation.
  uint32_t verify_tokens = 0;
  uint64_t verify_ns = 0;
  uint32_t plain_tokens = 0;
  uint64_t plain_ns = 0;

  speculation_counts& operator+=(const speculation_counts& o) {
    verify_steps += o.verify_steps;
    plain_steps += o.plain_steps;
    drafted_tokens += o.drafted_tokens;
    accepted_tokens += o.accepted_tokens;
    draft_calls += o.draft_calls;
    draft_ns += o.draft_ns;
    verify_tokens += o.verify_tokens;
    verify_ns += o.verify_ns;
    plain_tokens += o.plain_tokens;
    plain_ns += o.plain_ns;
    return *this;
  }
};

/// Where one rollout's prompt tokens came from, over all its turns (mirrors
/// msg::PrefillCounts; runtime/ml/policy/generate.hpp generation_result::cached_tokens).
struct prefill_counts {
  uint32_t prompt_tokens = 0;  ///< prompt tokens of its turns (a turn's prompt is the chat so far)
  /// Of them, not prefilled by it: parked KV of its previous turn, prefix-cache hits, and a
  /// group prompt a sibling prefilled. prompt_tokens - cached_tokens were computed for it.
  uint32_t cached_tokens = 0;
  /// Prefix-cache blocks the worker evicted to stay within its budget since the previous
  /// rollout it finished: summed over a step's rollouts, the step's evictions.
  uint32_t evicted_blocks = 0;

  prefill_counts& operator+=(const prefill_counts& o) {
    prompt_tokens += o.prompt_tokens;
    cached_tokens += o.cached_tokens;
    evicted_blocks += o.evicted_blocks;
    return *this;
  }
};

/// One rollout to generate (mirrors msg::GenerateRequest).
struct rollout_request {
  uint64_t request_id = 0;
  uint64_t step = 0;
  uint64_t group_id = 0;
  uint32_t sample_index = 0; ///< the sampler stream: tokens never depend on batch mates
  ml::task_split split = ml::task_split::train;
  uint64_t task_index = 0;
  uint64_t seed = 0;          ///< the group's seed
  uint64_t weight_version = 0;
  uint32_t max_new_tokens = 16; ///< per turn
  double temperature = 1.0;   ///< 0 = greedy; double end to end (runtime/ml/policy/sampler.hpp)
  double top_p = 1.0;
  uint32_t top_k = 0;
  /// The lost worker the scheduler placed this request on before (empty on a first
  /// placement); the worker only passes it on to the trajectory.
  std::string replaced_from;
};

enum class event_kind { start, chunk, finish };

/// Timing of a rollout on the worker's clock.
struct rollout_event {
  uint64_t request_id = 0;
  uint64_t step = 0;
  uint64_t group_id = 0;
  event_kind kind = event_kind::start;
  int64_t ns = 0;            ///< worker clock, nanoseconds
  uint32_t tokens = 0;       ///< response tokens so far
  ml::finish_reason reason = ml::finish_reason::length; ///< for finish
};

/// Whether a finished rollout carries a trainable result (mirrors msg::RolloutStatus).
enum class rollout_status {
  ok,            ///< served and scored
  failed,        ///< could not be served; never trained on
  reward_failed, ///< generated, but the scorer / environment threw or the reward is not finite
};

/// A finished rollout.
struct rollout_result {
  rollout_request request;
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  std::vector<uint8_t> loss_mask;     ///< per response token, 1 = sampled by the policy
  std::vector<float> logprobs;        ///< per response token (0 where mask = 0)
  double reward = 0.0;                ///< in [0, 1]; 0 when status is not ok
  std::string reward_reason;
  rollout_status status = rollout_status::ok;
  std::string failure;                ///< why, when status is not ok
  ml::finish_reason finish = ml::finish_reason::length;
  uint32_t turns = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  /// Speculative decoding of this rollout, over all its turns (runtime/ml/policy/generate.hpp);
  /// all 0 with rollout.speculative = "off".
  speculation_counts speculation;
  /// Its prompt tokens and how many were served from cached KV.
  prefill_counts prefill;
};

/// A RolloutEvent as read: the core's event plus what only the message carries.
struct event_record {
  rollout_event event;
  std::string worker;     ///< the sending worker's name
  uint32_t in_flight = 0; ///< requests the worker holds after this event
};

/// A Trajectory as read: the finished rollout plus what only the message carries. Of
/// result.request only request_id, step, group_id, sample_index and replaced_from travel.
struct trajectory_record {
  rollout_result result;
  std::string worker;          ///< the worker that generated it
  uint64_t weight_version = 0; ///< the version the worker held when it sent the trajectory
};

/// An AbortRollouts: stop these rollouts of `step` now.
struct abort_request {
  uint64_t step = 0;
  std::vector<uint64_t> request_ids;
  std::string reason;
};

} // namespace sorl::rollout
