#pragma once

// Prompts and reference answers from a user's JSONL file.

#include "runtime/ml/tasks/tasks.hpp"

#include <functional>
#include <memory>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sorl::ml {

class reward_process;

/// One record of a JSONL dataset.
struct jsonl_record {
  std::string prompt;
  std::string answer;
  std::size_t line = 0; ///< 1-based line in its file
  /// The record's "entry" value as JSON text (reasoning-gym's whole entry, as scripts/fetch-data
  /// writes it), "" when absent; sent to a reward command.
  std::string entry_json;
  std::vector<std::int64_t> numbers; ///< countdown match: entry.metadata.numbers
  std::int64_t target = 0;           ///< countdown match: entry.metadata.target
};

/// Reads a JSONL dataset: one JSON object per line,
///
///     {"prompt": "12+34=", "answer": "46"}
///
/// - "prompt": a non-empty string, the text the policy continues.
/// - "answer": a string, or an integer (stored as its decimal text); non-empty after
///   trimming. With `match == answer_match::integer` it must be in
///   `parse_integer_answer` format.
/// - "entry": optional, any JSON value; with `match == answer_match::countdown` an object
///   whose "metadata" has "numbers" (integers) and "target" (an integer).
/// - other fields are ignored; blank (whitespace-only) lines are skipped but counted.
/// Throws task_data_error naming the file and 1-based line for an unreadable file, a
/// line that isn't a JSON object, a missing field, a field of the wrong type, a prompt of
/// `context_tokens` tokens or more (counted by `prompt_tokens`, else by
/// encode_single_turn_prompt with the byte tokenizer; only when context_tokens > 0), and a
/// file without records (line 0).
std::vector<jsonl_record> load_jsonl(
  const std::string& path, answer_match match, std::int64_t context_tokens = 0,
  const std::function<std::int64_t(const std::string&)>& prompt_tokens = {});

/// The "jsonl" single-turn task.
///
/// Splits: with `eval_path`, train is all of `path` and eval all of `eval_path`.
/// Otherwise the records of `path` are split by a content hash of their prompt text, an
/// `eval_fraction` share to eval, so identical prompts always land in the same split
/// (the partition doesn't depend on the seed). Index i of a split is its i-th record in
/// file order; the seed is unused (the dataset is fixed; shuffling is the trainer's).
///
/// Scoring: exact mode — reward 1 when the completion equals the answer after trimming
/// ASCII whitespace on both; integer mode — as "arithmetic"; otherwise 0 with a reason.
/// first_number, last_number and countdown modes — reasoning-gym's rules (answer_match). With a reward
/// command (jsonl_options::reward), its scorer process decides instead, started at the first
/// score() and shared by copies of the task; a failed call throws reward_failed_error
/// (runtime/ml/tasks/reward_process.hpp), which the rollout worker records as a failed reward.
class jsonl_task final : public single_turn_task {
public:
  /// Loads the file(s). Throws task_data_error (see load_jsonl) and std::invalid_argument
  /// for an empty path, an eval_fraction outside [0, 1) or a reward command that
  /// reward_process refuses.
  jsonl_task(const jsonl_options& options, double eval_fraction);

  std::string_view name() const override;
  std::optional<std::uint64_t> size(task_split split) const override;
  task_prompt prompt(task_split split, std::uint64_t index) const override;
  reward_result score(const task_prompt& prompt, std::string_view completion) const override;
  /// Integer, first_number and last_number modes: the answer (an integer) shifted by a nonzero offset in
  /// [-10, 10] (first_number: a non-integer answer gets another record's). Otherwise: the
  /// answer of another train record whose answer differs (never an eval answer: these
  /// feed training), or "" if there is none.
  std::optional<std::string> wrong_completion(const task_prompt& prompt,
                                              std::uint64_t seed) const override;

  /// The records of `split`, in file order.
  const std::vector<jsonl_record>& records(task_split split) const;

private:
  jsonl_options options_;
  std::shared_ptr<reward_process> scorer_; ///< with a reward command
  std::vector<jsonl_record> train_;
  std::vector<jsonl_record> eval_;
};

} // namespace sorl::ml
