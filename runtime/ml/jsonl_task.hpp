#pragma once

// Prompts and reference answers from a user's JSONL file.

#include "runtime/ml/tasks.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sorl::ml {

/// One record of a JSONL dataset.
struct jsonl_record {
  std::string prompt;
  std::string answer;
  std::size_t line = 0; ///< 1-based line in its file
};

/// Reads a JSONL dataset: one JSON object per line,
///
///     {"prompt": "12+34=", "answer": "46"}
///
/// - "prompt": a non-empty string, the text the policy continues.
/// - "answer": a string, or an integer (stored as its decimal text); non-empty after
///   trimming. With `match == answer_match::integer` it must be in
///   `parse_integer_answer` format.
/// - other fields are ignored; blank (whitespace-only) lines are skipped but counted.
/// Throws task_data_error naming the file and 1-based line for an unreadable file, a
/// line that isn't a JSON object, a missing field, a field of the wrong type, a prompt of
/// `context_tokens` tokens or more (counted by encode_single_turn_prompt with the byte
/// tokenizer; only when context_tokens > 0), and a file without records (line 0).
std::vector<jsonl_record> load_jsonl(const std::string& path, answer_match match,
                                     std::int64_t context_tokens = 0);

/// The "jsonl" single-turn task.
///
/// Splits: with `eval_path`, train is all of `path` and eval all of `eval_path`.
/// Otherwise the records of `path` are split by a content hash of their prompt text, an
/// `eval_fraction` share to eval, so identical prompts always land in the same split
/// (the partition doesn't depend on the seed). Index i of a split is its i-th record in
/// file order; the seed is unused (the dataset is fixed; shuffling is the trainer's).
///
/// Scoring: exact mode — reward 1 when the completion equals the answer after trimming
/// ASCII whitespace on both; integer mode — as "arithmetic". Otherwise 0 with a reason.
class jsonl_task final : public single_turn_task {
public:
  /// Loads the file(s). Throws task_data_error (see load_jsonl) and std::invalid_argument
  /// for an empty path or an eval_fraction outside [0, 1).
  jsonl_task(const jsonl_options& options, double eval_fraction);

  std::string_view name() const override;
  std::optional<std::uint64_t> size(task_split split) const override;
  task_prompt prompt(task_split split, std::uint64_t index) const override;
  reward_result score(const task_prompt& prompt, std::string_view completion) const override;
  /// Integer mode: the answer shifted by a nonzero offset in [-10, 10]. Exact mode: the
  /// answer of another train record whose answer differs (never an eval answer: these
  /// feed training), or "" if there is none.
  std::optional<std::string> wrong_completion(const task_prompt& prompt,
                                              std::uint64_t seed) const override;

  /// The records of `split`, in file order.
  const std::vector<jsonl_record>& records(task_split split) const;

private:
  jsonl_options options_;
  std::vector<jsonl_record> train_;
  std::vector<jsonl_record> eval_;
};

} // namespace sorl::ml
