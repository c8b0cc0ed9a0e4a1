#pragma once

// Held-out evaluation of a policy on a task: generate completions (or whole multi-turn
// episodes) for a block of prompts of one split through the batched generator, score them with
// the task's verifiable reward, and summarise. Used at the end of the supervised warm start
// (sft.hpp) and by anything that wants "how good is this checkpoint" as one number.
//
// Prompt encoding (shared with sft.hpp, so that what is trained is what is evaluated):
//   single-turn   <|bos|> prompt-text            → completion-text <|eos|>
//   multi-turn    encode_chat(chat, add_generation_prompt = true)
//                                                 → action-text <|end_turn|>
// Single-turn completions stop at <|eos|>; multi-turn actions stop at <|end_turn|> (or <|eos|>).

#include "runtime/ml/formats/prompt_format.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/policy/sampler.hpp"
#include "runtime/ml/tasks/tasks.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace sorl::ml {

/// What evaluate() runs. Plain data with defaults that suit the built-in tasks.
struct eval_options {
  /// Split to draw prompts / episode seeds from; eval = held out from training.
  task_split split = task_split::eval;
  /// Prompts (single-turn) or episodes (multi-turn) to evaluate, >= 0. For a split of finite
  /// size the block is clamped to the prompts that exist from first_index on.
  std::int64_t count = 200;
  /// Index in the split of the first prompt / episode.
  std::uint64_t first_index = 0;
  /// Generation budget per completion (single-turn) or per action (multi-turn), tokens, >= 1.
  /// The stop token counts against it.
  std::int64_t max_new_tokens = 16;
  /// Most sequences decoding at once (generator max_batch), >= 1. All prompts are submitted at
  /// once; the generator admits them as slots free up.
  std::int64_t batch = 64;
  /// Greedy decoding (temperature 0) when true; otherwise plain sampling at `temperature`
  /// (no top-k / top-p), the distribution RL rollouts draw from.
  bool greedy = true;
  /// Sampling temperature when !greedy, in [min_temperature, inf) (runtime/ml/policy/sampler.hpp).
  double temperature = 1.0;
  /// Seed of the sampling streams when !greedy; each prompt (and each turn of an episode) gets
  /// its own stream derived from (seed, index, turn), so results do not depend on `batch`.
  std::uint64_t seed = 0;
  /// How many of the evaluated prompts to keep verbatim in eval_report::samples (the first
  /// ones, in index order), >= 0.
  std::int64_t keep_samples = 0;
  /// What a reward that cannot be computed does: the task's score (or the environment's
  /// step) throws, as a reward process's failed item does (runtime/ml/tasks/reward_process.hpp), or
  /// returns a reward that is not finite. false: the prompt counts in
  /// eval_report::reward_failures and is left out of accuracy and mean reward, as training
  /// masks it out ([algorithm] on_reward_failure = "mask"). true: evaluate throws
  /// eval_reward_failed naming the prompt ("fail").
  bool fail_on_reward_failure = false;
};

/// Thrown by evaluate when a reward cannot be computed and eval_options::fail_on_reward_failure
/// is set; what() names the prompt (or episode), its split and why.
class eval_reward_failed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One evaluated prompt or episode, for display and debugging.
struct eval_sample {
  std::uint64_t index = 0;   ///< index in the split
  std::string prompt;        ///< single-turn: the prompt text; multi-turn: the first observation
  /// Single-turn: the decoded completion (special tokens skipped). Multi-turn: the actions
  /// joined by " | ".
  std::string completion;
  double reward = 0.0;       ///< in [0, 1]; 0 when reward_failed
  std::string reason;        ///< the task's reason for the reward, or why it failed
  bool reward_failed = false;  ///< no reward: the task's score or environment failed
  int turns = 1;             ///< actions taken (1 for single-turn)
  std::int64_t response_tokens = 0;  ///< generated tokens, stop tokens included
};

/// Summary of one evaluate() call.
struct eval_report {
  std::int64_t count = 0;            ///< prompts / episodes evaluated (0: empty split block)
  /// Of them, those whose reward could not be computed (see
  /// eval_options::fail_on_reward_failure); the others are the scored ones.
  std::int64_t reward_failures = 0;
  std::int64_t correct = 0;          ///< scored ones with reward == 1
  /// correct / scored ones, in [0, 1] (0 when none was scored).
  double accuracy = 0.0;
  double mean_reward = 0.0;          ///< mean reward of the scored ones, in [0, 1] (0 when none)
  /// Mean generated tokens per prompt (single-turn) or per episode, summed over its turns
  /// (multi-turn); stop tokens included.
  double mean_response_tokens = 0.0;
  double mean_turns = 1.0;           ///< mean actions per episode (1 for single-turn)
  /// Completions / actions that hit max_new_tokens or the model's context without a stop
  /// token; they are still scored on their text (which usually makes them wrong).
  std::int64_t truncated = 0;
  double seconds = 0.0;              ///< wall time of the evaluation, s
  double tokens_per_second = 0.0;    ///< generated tokens / seconds
  std::vector<eval_sample> samples;  ///< the first eval_options::keep_samples, in index order
};

/// Evaluates `model` on `count` prompts of `task` starting at `first_index` of `split`: one
/// completion per prompt, decoded with the tokenizer (special tokens skipped) and scored by
/// task.score. Malformed outputs score 0 (the task's rule); a score that throws is a reward
/// failure (eval_options::fail_on_reward_failure). Runs under no-grad; the model's
/// weights must not change during the call. Throws std::invalid_argument for bad options
/// (count < 0, max_new_tokens < 1, batch < 1, temperature < min_temperature when sampling) or
/// a prompt that does not fit the model's context (max_seq), what task.prompt throws, and
/// eval_reward_failed.
eval_report evaluate(const policy_model& model, const tokenizer& tok, const single_turn_task& task,
                     const eval_options& opts = {});

/// Evaluates `model` on `count` whole episodes of `task` (episode seeds first_index.. of
/// `split`): all episodes advance together, one batched generation per turn, each episode
/// continuing from its KV of the previous turn (generator parked KV); each action is
/// the assistant turn's decoded text and the observation comes back as the next user turn,
/// until the environment says done or after task.max_turns() actions. An episode whose chat
/// no longer fits the context (max_seq - 1 tokens before an action) ends unsuccessfully there.
/// The episode's reward is the sum of its step rewards (1 when the goal was reached); a step
/// that throws ends the episode as a reward failure. Same errors as the single-turn overload.
eval_report evaluate(const policy_model& model, const tokenizer& tok, const multi_turn_task& task,
                     const eval_options& opts = {});

/// Evaluates with `format`'s prompt encoding and stop tokens
/// (runtime/ml/formats/prompt_format.hpp): sorl's byte format as the tokenizer overloads do (either
/// kind of task); a Hugging Face format encodes each single-turn prompt as one user message of its
/// chat template and stops at its end-of-turn and eos tokens. Throws as the overloads above, and
/// std::invalid_argument for a multi-turn task with a Hugging Face format.
eval_report evaluate(const policy_model& model, const prompt_format& format, const any_task& task,
                     const eval_options& opts = {});

/// Dispatches on the kind of `task`. Throws std::invalid_argument for an empty any_task.
eval_report evaluate(const policy_model& model, const tokenizer& tok, const any_task& task,
                     const eval_options& opts = {});

}  // namespace sorl::ml
