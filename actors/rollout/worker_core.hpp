#pragma once

// The rollout worker's logic, free of CAF (ARCHITECTURE.md §3 step 3): continuous batching of
// rollout requests over the bf16 policy, prompt prefill once per group of siblings that
// arrive together, reward scoring for single-turn tasks and environment stepping for
// multi-turn ones, and worker-clock timing events for every rollout. A multi-turn rollout
// keeps its KV between turns (generator parked KV): each later turn prefills only the
// environment's tokens and the previous action's last token, not the whole transcript.
//
// Token layout of a rollout (the same as the warm start's, runtime/ml/train/sft.hpp):
//   single-turn  prompt = the prompt format's single_turn(prompt text) (runtime/ml/formats/
//                prompt_format.hpp: <|bos|> + its bytes in sorl's byte format, one user
//                message of the chat template for a Hugging Face model); response = sampled
//                tokens (the stop token kept)
//   multi-turn   prompt = encode_chat(first observation, generation prompt); response = every
//                token after it: sampled action tokens (mask 1) and the environment's
//                <|user|> observation <|end_turn|> <|assistant|> tokens (mask 0)
// Response tokens are exactly the sampled ids, never a re-encoding of decoded text.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/rollout/rollout_types.hpp"
#include "actors/rollout/speculation_switch.hpp"
#include "actors/suffix_index/suffix_drafter.hpp"
#include "runtime/ml/formats/prompt_format.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/tasks/tasks.hpp"

namespace sorl {
struct experiment_config;
}

namespace sorl::rollout {

/// Steady-clock nanoseconds; injectable for tests.
using clock_fn = std::function<int64_t()>;

/// rollout.speculative: suffix speculative decoding off, always on, or chosen per batch size
/// by measured throughput (speculation_switch.hpp).
enum class speculation_mode { off, on, automatic };

struct worker_options {
  int64_t max_batch = 64;   ///< samples decoding at once
  speculation_mode speculative = speculation_mode::off;
  /// The drafter's trees and draft rule (actors/suffix_index/suffix_drafter.hpp); its
  /// draft.max_tokens is the longest draft per step.
  suffix_index::drafter_options drafter{};
  /// A chunk event every this many generated tokens of a rollout (and at every turn end),
  /// so the SAGC controller sees long rollouts while they run; 0 = only at turn ends.
  int64_t chunk_tokens = 16;
  /// Prefix KV cache of the worker's generator (runtime/ml/policy/prefix_cache.hpp), bytes of KV:
  /// prompts that start like an earlier prompt or finished turn of the same weights prefill
  /// only the rest. 0 = off.
  int64_t prefix_cache_bytes = 256ll << 20;
  /// Where the policy, its KV cache and the sampler's logits live (runtime/ml/policy/device.hpp).
  c10::Device device = c10::kCPU;
  clock_fn clock;           ///< default: std::chrono::steady_clock
};

/// The worker's options from a loaded (validated) experiment: `[rollout] max_batch`,
/// `chunk_tokens`, `prefix_cache_bytes`, `speculative`, the draft_* / suffix_* keys and
/// `device` (run.device when empty); the clock stays the default. Raises
/// std::invalid_argument naming the key when this libtorch lacks the device.
worker_options worker_options_from(const experiment_config& cfg);

/// The token ids of the first prompt a worker builds for task `index` of `split`, exactly as
/// worker_core::enqueue does (the layouts at the top of this file): what the scheduler's
/// cache-aware placement matches against the workers' prefix caches. Multi-turn tasks build a
/// fresh environment for the first observation. Raises what the task, the environment or the
/// format raises (an unknown index, a reset that throws).
std::vector<int32_t> first_prompt_tokens(const ml::any_task& task, const ml::prompt_format& format,
                                         ml::task_split split, uint64_t index);

/// Owns the rollout copy of the policy (bf16 weights), a generator and the task. Called on
/// one thread (the actor's).
class worker_core {
public:
  /// Builds a bf16 model of `dims` (weights arrive by sync before the first request) that
  /// speaks `format`. Raises std::invalid_argument for an empty task, and for a multi-turn
  /// task with a format other than sorl's byte format (environments speak its turn layout).
  worker_core(const ml::model_dims& dims, ml::any_task task, worker_options opts = {},
              ml::prompt_format format = ml::prompt_format::byte_level());
  ~worker_core();

  /// The rollout weights, on worker_options::device. Never change weights while rollouts are
  /// in flight.
  ml::policy_model& model();
  /// The contiguous bf16 host tensors the sync path writes a new version into, in
  /// model().parameters() order, before it calls weights_changed(): the parameters themselves
  /// on the CPU; with the model on a device, a host copy of them that weights_changed()
  /// uploads (the delta codec applies into host memory).
  const std::vector<ml::named_tensor>& sync_targets() const;
  /// Uploads sync_targets() to the device when they are a host copy, frees any parked KV and
  /// drops the prefix cache (both computed under the old weights: the generator's weight
  /// version advances) and rebuilds the model's compute image. Raises
  /// std::logic_error while rollouts are in flight.
  void weights_changed();

  /// Prefix KV cache budget in tokens: prefix_cache_bytes over the fp32 KV bytes of one
  /// token of `dims` (n_layers × 2 × n_kv_heads × head_dim × 4).
  static int64_t prefix_cache_tokens(const ml::model_dims& dims, int64_t bytes);
  /// The generator's prefill counters since the last call (runtime/ml/policy/generate.hpp).
  ml::prefill_stats take_prefill_stats();

  /// Queues a rollout and emits its start event. Siblings queued before the next step() are
  /// prefilled once. A request that cannot be served (its prompt does not fit max_seq, an
  /// unknown prompt index, an environment whose reset throws) is not dropped: the next step()
  /// returns it as a failed result (status failed, the reason in `failure`, finish reason
  /// abort) with its start and finish events. Raises std::invalid_argument only for a
  /// request id already held.
  void enqueue(const rollout_request& r);

  /// Answers a request the caller refuses (e.g. weights of another version) with a failed
  /// result from the next step(), with start and finish events, exactly as enqueue() does for
  /// a request it cannot serve.
  void reject(const rollout_request& r, const std::string& why);

  /// Admits queued rollouts and advances every live one by one token; returns the rollouts
  /// that finished (reward scored, environment stepped to the end) and the failed ones
  /// (requests refused, and rollouts whose generator submission threw). A scorer or
  /// environment that throws, or a non-finite reward, gives status reward_failed.
  std::vector<rollout_result> step();

  /// Aborts every rollout (queued or live): they come back with finish_reason::abort,
  /// reward 0, after any finished result step() has not returned yet.
  std::vector<rollout_result> abort_all();

  /// Aborts the given rollouts (deadline mode, ARCHITECTURE.md §6 SAGC baseline): their KV blocks
  /// are freed at once and they come back with finish_reason::abort, reward 0, and a finish
  /// event. Siblings submitted to the generator together with an aborted rollout (one group
  /// prefill) are aborted with it; the trainer only aborts every unfinished rollout of a step,
  /// so that never takes a rollout it still waits for. Unknown ids are ignored.
  std::vector<rollout_result> abort(const std::vector<uint64_t>& request_ids);

  /// KV cache blocks referenced by live or parked sequences or by the prefix cache (the
  /// prefix cache's alone when nothing is decoding or between turns).
  int64_t kv_blocks_in_use() const;
  /// KV cache blocks the prefix cache holds (0 with it off).
  int64_t prefix_cached_blocks() const;

  /// Events since the last call, in order.
  std::vector<rollout_event> take_events();

  bool idle() const;
  /// The sampling parameters turn `turn` (0-based) of request `r` is generated with: the
  /// request's temperature, top-p and top-k unchanged, its per-turn budget, a per-turn seed and
  /// the task's stop tokens.
  ml::sampling_params sampling_for(const rollout_request& r, uint32_t turn) const;

  /// Rollouts held (queued, live, or between turns).
  size_t in_flight() const {
    return rollouts_.size();
  }

  /// Lines for the worker's log since the last call: the load-aware switch's changes of
  /// choice with the throughputs they rest on (speculation_mode::automatic only).
  std::vector<std::string> take_log();
  /// The drafter's counters since the last call (global tree size, evictions); nullopt
  /// with speculation off.
  std::optional<suffix_index::drafter_stats> take_drafter_stats();

  /// The sampled tokens of every generator sample (one per rollout turn) that finished
  /// completed, not aborted, in step() since the last call, in order: the responses the
  /// suffix-index keeper shares with the other workers. They accumulate until taken; the
  /// shell takes them after every step(). Always empty with speculation off.
  std::vector<std::vector<int32_t>> take_finished_turns();
  /// Finished responses other workers generated, into the drafter's global tree
  /// (suffix_drafter::add_response). A response with a token id outside [0, vocab) of the
  /// model is skipped, never thrown on; so are empty ones. Returns how many were taken; 0
  /// with speculation off, which keeps no tree.
  size_t add_peer_responses(const std::vector<std::vector<int32_t>>& responses);
  /// Whether the worker keeps suffix trees and drafts (speculation on or auto).
  bool drafting() const noexcept {
    return drafts_ != nullptr;
  }

private:
  struct rollout_state;
  void submit_turn(rollout_state& st);
  void flush_pending();
  bool finish_turn(rollout_state& st, const ml::generation_result& g);
  void fail(rollout_state& st, const std::string& why);
  /// Takes a new rollout into rollouts_ and emits its start event.
  rollout_state& hold(std::unique_ptr<rollout_state> st);
  rollout_result finalize(rollout_state& st, ml::finish_reason reason);
  /// Moves the generator's prefill counters into prefill_; returns the evictions moved.
  int64_t absorb_prefill_stats();

  ml::any_task task_;
  ml::byte_tokenizer tok_; ///< multi-turn: encode_chat's layout
  ml::prompt_format format_;
  worker_options opts_;
  std::unique_ptr<ml::policy_model> model_;
  std::vector<ml::named_tensor> host_weights_; ///< the sync targets of a model on a device
  class draft_adapter;
  std::unique_ptr<draft_adapter> drafts_;   ///< null with speculation off
  std::unique_ptr<speculation_switch> switch_; ///< null with speculation off
  std::unique_ptr<ml::generator> gen_;
  std::map<uint64_t, std::unique_ptr<rollout_state>> rollouts_; ///< by request id
  std::vector<uint64_t> pending_;                               ///< request ids to submit
  std::map<std::pair<uint64_t, int64_t>, uint64_t> by_gen_;     ///< (gen id, stream) → request
  std::map<uint64_t, int64_t> chunked_;                         ///< request → tokens last reported
  std::vector<rollout_event> events_;
  std::vector<rollout_result> ready_; ///< finished or failed, returned by the next step()
  std::vector<std::vector<int32_t>> finished_turns_; ///< for take_finished_turns()
  uint64_t weights_version_ = 0;                     ///< the generator's, one per change
  ml::prefill_stats prefill_;                        ///< accumulated for take_prefill_stats()
};

} // namespace sorl::rollout
