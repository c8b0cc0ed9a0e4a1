#pragma once

// Tasks with verifiable rewards: the interfaces rollout workers and the trainer use,
// the plain option structs the TOML layer fills, and the task factory.
//
// Built-in tasks (each in its own header):
//   "arithmetic"    single-turn, generated      runtime/ml/tasks/tasks_arithmetic.hpp
//   "number_guess"  multi-turn environment      runtime/ml/tasks/environments.hpp
//   "file_search"   multi-turn environment      runtime/ml/tasks/file_search.hpp
//   "jsonl"         single-turn, user dataset   runtime/ml/tasks/jsonl_task.hpp
//
// Rewards are in [0, 1]. Model output is untrusted: a malformed completion or action
// never throws, it scores 0 and says why in `reason`. Exceptions are for the caller's
// mistakes (std::invalid_argument, std::out_of_range, std::logic_error) and for bad input
// files (task_data_error).

#include "runtime/ml/formats/tokenizer.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// The part of a task a prompt comes from. The two splits never share a problem
/// (see each task for what "problem" means), so eval accuracy measures prompts the
/// policy was not trained on.
enum class task_split { train, eval };

/// "train" or "eval".
std::string_view to_string(task_split split);

/// One prompt of a single-turn task.
struct task_prompt {
  task_split split = task_split::train;
  std::uint64_t index = 0; ///< position in its split; with the task, determines the prompt
  std::string prompt;      ///< the text the policy continues (encoded after BOS)
  std::string reference;   ///< the reference answer, in the task's answer format
};

/// A verifiable reward with the reason it was given.
struct reward_result {
  double reward = 0.0; ///< in [0, 1]
  std::string reason;  ///< short, valid UTF-8 (safe to put into JSON logs)
};

/// A supervised example for the warm start: `completion` is what the policy should emit
/// after `prompt`, without the EOS the caller appends.
struct demonstration {
  std::string prompt;
  std::string completion;
  bool correct = true; ///< false for the deliberately wrong share
};

/// A single-turn task: prompt → completion → reward. Immutable and thread-safe: one
/// instance serves all workers.
class single_turn_task {
public:
  virtual ~single_turn_task() = default;

  /// The factory name ("arithmetic", "jsonl").
  virtual std::string_view name() const = 0;

  /// Number of prompts in `split`, or nullopt when prompts are generated without bound
  /// (then every index is valid, and indices map to a seeded random stream).
  virtual std::optional<std::uint64_t> size(task_split split) const = 0;

  /// Prompt `index` of `split`; a pure function of the task's options, split and index.
  /// Throws std::out_of_range when `index >= size(split)` or the split is empty.
  virtual task_prompt prompt(task_split split, std::uint64_t index) const = 0;

  /// Scores `completion` (the decoded generated text before the stop token, EOS or
  /// `<|end_turn|>` excluded; special tokens skipped) against `prompt`. Never throws on
  /// model output. Whether a rollout truncated at max_new_tokens counts as a failure is
  /// the caller's choice (the learner's overlong handling); this sees only text.
  virtual reward_result score(const task_prompt& prompt, std::string_view completion) const
    = 0;

  /// A plausible wrong completion for `prompt` (scores 0), deterministic in `seed`; for
  /// the wrong share of demonstrations. std::nullopt when the task has no wrong answer of
  /// the kind it demonstrates for this prompt (arithmetic's dropped carries on an addition
  /// that does not carry): that demonstration stays correct.
  virtual std::optional<std::string> wrong_completion(const task_prompt& prompt,
                                                      std::uint64_t seed) const = 0;
};

/// What one environment step returns.
struct env_step {
  std::string observation; ///< text of the next user turn (empty once done)
  double reward = 0.0;     ///< in [0, 1]; nonzero only on the final step
  bool done = false;       ///< the episode is over: no further step is allowed
  std::string reason;      ///< why this feedback / reward (valid UTF-8)
};

/// One episode's state of a multi-turn environment. Not thread-safe: one per episode.
class environment {
public:
  virtual ~environment() = default;

  /// Starts a new episode (discarding any running one); returns the first observation.
  virtual std::string reset(std::uint64_t seed) = 0;

  /// Applies the policy's action (the assistant turn's text, markers excluded). Never
  /// throws on malformed actions: they cost a turn and get feedback saying why.
  /// Throws std::logic_error if no episode is running (before reset or after done).
  virtual env_step step(std::string_view action) = 0;

  /// Actions taken in the current episode.
  virtual int turns() const = 0;
};

/// A multi-turn task: a source of environments and of the episode seeds of each split.
/// Immutable and thread-safe.
class multi_turn_task {
public:
  virtual ~multi_turn_task() = default;

  /// The factory name ("number_guess", "file_search").
  virtual std::string_view name() const = 0;

  /// A fresh environment; call `reset(episode_seed(...))` on it.
  virtual std::unique_ptr<environment> make_environment() const = 0;

  /// The reset seed of episode `index` of `split`. Distinct (split, index) pairs give
  /// distinct seeds for index < 2^63 (a bijective mix), so eval seeds are never train seeds.
  virtual std::uint64_t episode_seed(task_split split, std::uint64_t index) const = 0;

  /// The most actions an episode allows (the rollout's turn budget).
  virtual int max_turns() const = 0;

  /// A demonstration episode for the environment reset with `seed`: alternating user
  /// observations and assistant actions, ending with the last action (the final
  /// feedback is not part of it). `correct` picks an expert policy, otherwise the task's
  /// wrong one (number_guess's ignores the feedback; file_search's follows `wrong_episodes`),
  /// which may still succeed.
  virtual std::vector<chat_message> demonstrate(std::uint64_t seed, bool correct) const = 0;
};

/// Thrown when a task's input file is unreadable or malformed. The message starts with
/// "<path>:<line>: " (line 0 when the error concerns the whole file).
class task_data_error : public std::runtime_error {
public:
  /// `line` 0 for whole-file errors.
  task_data_error(std::string path, std::size_t line, const std::string& what);

  /// The file concerned.
  const std::string& path() const noexcept { return path_; }
  /// 1-based line number, 0 for whole-file errors.
  std::size_t line() const noexcept { return line_; }

private:
  std::string path_;
  std::size_t line_;
};

// -- options (filled by the config layer; validated by make_task) ------------------------

/// Options of the "arithmetic" task (runtime/ml/tasks/tasks_arithmetic.hpp).
struct arithmetic_options {
  int min_digits = 1;          ///< digits per operand, at least 1
  int max_digits = 2;          ///< at most 9, so products fit in int64
  std::string operators = "+"; ///< non-empty subset of "+-*/"
  bool allow_negative = true;  ///< for '-': when false, operands are ordered so a-b >= 0
  /// What a wrong demonstration answers: "near" (the result shifted by 1..10 either way)
  /// or "dropped_carry" (an addition that carries answered with its carries dropped,
  /// `sum_without_carries`; every other problem has no wrong answer and is demonstrated
  /// correctly).
  std::string wrong_answers = "near";
};

/// Options of the "number_guess" environment (runtime/ml/tasks/environments.hpp).
struct number_guess_options {
  std::int64_t lo = 1;   ///< smallest possible hidden number
  std::int64_t hi = 100; ///< largest possible hidden number (>= lo, hi - lo < 2^62)
  int max_turns = 10;    ///< guesses allowed; >= 1
};

/// Options of the "file_search" environment (runtime/ml/tasks/file_search.hpp).
struct file_search_options {
  int depth = 2;                 ///< levels of directories below "/"; the key is at the deepest; 1..4
  int max_dirs = 2;              ///< subdirectories per directory above the deepest level: 1..max_dirs; 1..8
  int max_files = 2;             ///< files per directory: 1..max_files; 1..8
  int max_turns = 60;            ///< actions allowed; >= 1
  /// Transcript budget, tokens (file_search_environment counts them); >= 64. Keep it at most
  /// the model's max_seq minus max_new_tokens so that the last action fits the context.
  std::int64_t max_episode_tokens = 1536;
  double detour_rate = 0.1;      ///< demonstrations: the expert's detour probability per action, in [0, 1]
  /// What the warm start's wrong demonstrations do: "wander" (a policy that ignores the
  /// tree, usually until the budget runs out) or "give_up" (the expert, which answers
  /// "not found" instead of leaving the first deepest directory it searched in vain; an
  /// episode whose key is in that directory stays correct). runtime/ml/tasks/file_search.hpp.
  std::string wrong_episodes = "wander";
  /// With `wrong_episodes = "give_up"`: the share of the wrong demonstrations that wander
  /// instead, answering "not found" when they answer (1 turn in 40). A warm start taught a
  /// few of them samples wandering episodes itself, which mostly run into the turn or token
  /// budget: a long tail of episode lengths (docs/notebook/2026-12-file-search-agent.md measures one).
  /// In [0, 1]; must be 0 with "wander".
  double wander_share = 0.0;
  /// Bytes (= tokens with the byte tokenizer) of documentation that opens every episode's
  /// first observation, in [0, 65536]; 0 = none. Each episode draws one of
  /// `preamble_families` texts from its seed, the way an agent's prompt opens with the tool
  /// or repository description of its task family: episodes of one family share that prefix
  /// of their chat (and so its KV), those of different families share nothing past the first
  /// block. The text says nothing about the episode's tree. With a preamble,
  /// `max_episode_tokens` must leave at least 64 tokens past the first observation.
  std::int64_t preamble_bytes = 0;
  /// Distinct preambles, in [1, 65536] (file_search_preamble).
  std::int64_t preamble_families = 16;
};

/// How a "jsonl" task compares a completion with the reference answer. The reasoning modes
/// score the completion's answer: the text of its last `<answer>...</answer>` when it has
/// one, else the whole completion (reasoning-gym's convention), with reasoning-gym's own rules
/// (runtime/ml/tasks/reasoning_checks.hpp: completion_answer and the scores).
enum class answer_match {
  exact,   ///< equal after trimming ASCII whitespace on both sides
  integer, ///< `parse_integer_answer` format, equal values (references checked at load)
  /// gsm_symbolic's rule: the answer's first number equals the reference's value: 1, a
  /// different number 0.01, no number 0 (first_number_score)
  first_number,
  /// the answer's last number equals the reference's value: 1, a different number 0.01, no
  /// number 0 (last_number_score): for responses that reason before they answer
  last_number,
  /// countdown's rule against the record's "entry" (metadata.numbers, metadata.target,
  /// checked at load): 1 for an expression using exactly those numbers with the target's
  /// value, else 0.05 / 0.01 (countdown_score)
  countdown,
};

/// Rewards from a scorer subprocess instead of a built-in match
/// (runtime/ml/tasks/reward_process.hpp): each completion is sent with its prompt, the record's
/// answer and its "entry" (the record's own JSON value of that name, null when absent). A failed
/// call (a crash, a timeout, a malformed or out-of-range reply, the scorer's own error) is a failed
/// reward, never a 0.
struct jsonl_reward_command {
  std::vector<std::string> argv;   ///< empty = score with `match`
  std::int64_t timeout_ms = 30000; ///< per call, the scorer's start-up included; > 0
};

/// Options of the "jsonl" task (runtime/ml/tasks/jsonl_task.hpp).
struct jsonl_options {
  std::string path;      ///< the dataset; required
  std::string eval_path; ///< optional held-out dataset; when set, it is the whole eval split
  answer_match match = answer_match::exact;
  /// The policy's context (max_seq), tokens. A prompt that takes this many tokens or more
  /// (<|bos|> and its bytes, as the rollout worker encodes it) leaves no room to generate, so
  /// the file is refused at load time, naming the line; 0 = not checked.
  std::int64_t context_tokens = 0;
  /// Counts a prompt's tokens as the policy's prompt format encodes it (the check above);
  /// empty = the byte tokenizer's single-turn encoding (encode_single_turn_prompt).
  std::function<std::int64_t(const std::string&)> prompt_tokens;
  jsonl_reward_command reward;
};

/// Everything `make_task` needs; only the struct for the named task is read.
struct task_options {
  std::uint64_t seed = 0; ///< selects the generated prompts / episode seeds
  /// Share of the problem space held out for the eval split, in [0, 1). 0 leaves the eval
  /// split empty. Ignored by "jsonl" when `jsonl.eval_path` is set, and by "number_guess",
  /// whose splits are disjoint seed streams.
  double eval_fraction = 0.1;
  arithmetic_options arithmetic;
  number_guess_options number_guess;
  file_search_options file_search;
  jsonl_options jsonl;
};

/// A task of either kind; exactly one of the pointers is set.
struct any_task {
  std::shared_ptr<const single_turn_task> single_turn;
  std::shared_ptr<const multi_turn_task> multi_turn;

  /// Whether this is a multi-turn task (`multi_turn` set).
  bool is_multi_turn() const noexcept { return multi_turn != nullptr; }
  /// The task's factory name; "" when neither pointer is set.
  std::string_view name() const;
};

/// Builds the task called `name` ("arithmetic", "number_guess", "file_search" or "jsonl") from `options`.
/// Throws std::invalid_argument for an unknown name (listing the known ones) or an
/// invalid option (naming it), and task_data_error for an unreadable/malformed dataset.
any_task make_task(std::string_view name, const task_options& options);

/// The names `make_task` accepts.
std::vector<std::string> task_names();

/// Whether `make_task(name, ...)` builds a multi-turn task ("number_guess", "file_search"),
/// known without building it (which reads a jsonl task's data); false for the single-turn
/// tasks and for names make_task does not know.
bool is_multi_turn_task(std::string_view name) noexcept;

// -- answer format ----------------------------------------------------------------------

/// Result of `parse_integer_answer`: a value, or the reason there is none.
struct integer_answer {
  std::optional<std::int64_t> value;
  std::string error; ///< set when `value` is empty
};

/// Parses the strict integer answer format used by "arithmetic", "number_guess" and
/// "jsonl" in integer mode: optional ASCII whitespace (space, \t, \n, \r), then a
/// canonical decimal integer `-?(0|[1-9][0-9]*)` that fits in int64 and isn't "-0",
/// then optional ASCII whitespace — nothing else (no '+', no leading zeros, no text).
integer_answer parse_integer_answer(std::string_view text);

/// `text` without leading and trailing ASCII whitespace (space, \t, \n, \r).
std::string_view trim_ascii_whitespace(std::string_view text);

/// `text` quoted for a reason string: at most `max_bytes` bytes (then "..."), UTF-8
/// sanitized, control characters escaped.
std::string quote_for_reason(std::string_view text, std::size_t max_bytes = 40);

// -- demonstrations for the supervised warm start ---------------------------------------

/// `count` demonstrations from prompts first_index, first_index+1, ... of `split`.
/// Exactly round(count * wrong_fraction) of them, at positions drawn from `seed`, carry
/// `task.wrong_completion` instead of the reference. Throws std::invalid_argument if
/// wrong_fraction is outside [0, 1]; std::out_of_range as `task.prompt` does.
std::vector<demonstration> make_demonstrations(const single_turn_task& task, task_split split,
                                               std::uint64_t first_index, std::size_t count,
                                               double wrong_fraction, std::uint64_t seed);

/// A demonstration episode of a multi-turn task.
struct episode_demonstration {
  std::vector<chat_message> chat; ///< see multi_turn_task::demonstrate
  /// False when it was drawn wrong and its episode fails; a wrong draw that succeeds anyway
  /// (a wanderer's lucky answer, a file_search "give_up" episode whose key was in the first
  /// directory searched) is as correct as the expert's.
  bool correct = true;
};

/// `count` demonstration episodes, episode seeds first_index, ... of `split`; exactly
/// round(count * wrong_fraction) of them, at positions drawn from `seed`, are drawn wrong
/// (`multi_turn_task::demonstrate` with correct = false). Each drawn-wrong episode is replayed
/// in a fresh environment to see whether it fails. Throws std::invalid_argument if
/// wrong_fraction is outside [0, 1].
std::vector<episode_demonstration>
make_episode_demonstrations(const multi_turn_task& task, task_split split,
                            std::uint64_t first_index, std::size_t count,
                            double wrong_fraction, std::uint64_t seed);

} // namespace sorl::ml
