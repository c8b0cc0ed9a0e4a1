#pragma once

// Scoring a Hugging Face model directory (runtime/ml/formats/hf_model.hpp) on a held-out set of
// reasoning problems: each prompt rendered with the model's chat template as one user
// message (or as `<|bos|>` + text for a single-turn sorl policy's export,
// runtime/ml/formats/prompt_format.hpp), k completions sampled (or one greedy), each scored by a
// built-in checker (runtime/ml/tasks/reasoning_checks.hpp) on the answer it gives. `sorl eval` is
// the command line.

#include "runtime/ml/formats/chat_template.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/formats/hf_tokenizer.hpp"
#include "runtime/ml/formats/prompt_format.hpp"
#include "runtime/ml/tasks/reasoning_checks.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace sorl::ml {

/// How a completion's answer is scored against an item.
enum class answer_checker {
  exact,         ///< the answer equals the reference after trimming whitespace: 1, else 0
  first_number,  ///< first_number_score (gsm_symbolic's rule)
  last_number,   ///< last_number_score (the same on the answer's last number)
  countdown,     ///< countdown_score against the item's entry (metadata.numbers, .target)
};

/// "exact", "first_number", "last_number" or "countdown"; parse_answer_checker is its inverse and throws
/// std::invalid_argument naming the known names for anything else.
std::string_view to_string(answer_checker c) noexcept;
answer_checker parse_answer_checker(std::string_view name);

/// One held-out problem, as scripts/fetch-data writes it: "prompt", "answer" and, for the
/// countdown checker, "entry" (reasoning-gym's, with metadata.numbers and metadata.target).
struct eval_item {
  std::string prompt;
  std::string answer;
  std::vector<std::int64_t> numbers;  ///< countdown only
  std::int64_t target = 0;            ///< countdown only
  std::size_t line = 0;               ///< 1-based line in its file
};

/// Reads a JSONL file of eval_items. Throws std::runtime_error naming the file and line for
/// an unreadable file, a line that is not an object, a missing or mistyped field (an entry
/// without numbers / target when `checker` is countdown), or a file without items.
std::vector<eval_item> load_eval_items(const std::filesystem::path& path, answer_checker checker);


/// The score of one answer for `item` under `checker`, in [0, 1]; 1 means correct (countdown
/// and first_number give reasoning-gym's partial credits below 1).
double score_answer(answer_checker checker, const eval_item& item, std::string_view answer);

/// Options of evaluate_hf_model.
struct hf_eval_options {
  answer_checker checker = answer_checker::first_number;
  std::int64_t k = 1;              ///< completions per prompt; 1 = greedy, else sampled
  double temperature = 1.0;        ///< when k > 1
  std::int64_t max_new_tokens = 256;
  std::int64_t limit = 0;          ///< score the first `limit` items only; 0 = all
  std::int64_t max_batch = 16;     ///< completions decoded at once
  std::uint64_t seed = 1;
  /// Called after each prompt's completions are scored: (prompts done, prompts in all).
  std::function<void(std::int64_t, std::int64_t)> progress;
};

/// One prompt's result.
struct hf_eval_item_result {
  std::size_t line = 0;
  std::vector<std::string> completions;  ///< decoded, special tokens skipped
  std::vector<double> scores;            ///< one per completion
  std::vector<std::int64_t> lengths;     ///< completion lengths, tokens (the stop token included)
};

/// What evaluate_hf_model measured. pass@k counts a prompt solved when any of its k
/// completions scores 1 (the unbiased estimator of Chen et al. 2021 with n = k).
struct hf_eval_report {
  std::int64_t prompts = 0;
  std::int64_t k = 1;
  double accuracy = 0;          ///< share of all completions scoring 1
  double pass_at_k = 0;         ///< share of prompts with a completion scoring 1
  double mean_score = 0;        ///< mean score of all completions (partial credits included)
  double mean_length = 0;       ///< mean completion length, tokens
  double truncated = 0;         ///< share of completions that hit max_new_tokens
  double seconds = 0;           ///< wall clock of the decoding
  double tokens_per_second = 0; ///< completion tokens / seconds
  std::vector<hf_eval_item_result> items;
};

/// Aggregates per-item scores into a report's accuracy, pass@k, mean score and length (the
/// rest of the report is left as it is). Throws std::invalid_argument when an item has no
/// scores or its scores and lengths differ in number.
void summarize(hf_eval_report& report);

/// Decodes and scores `items` with `model`, each prompt encoded by `format.single_turn` (for a
/// Hugging Face model: one user message of its chat template, after the format's system
/// message); decoding stops at `format.stop_ids()`. Throws std::invalid_argument for bad
/// options or a prompt that does not fit the model's context.
hf_eval_report evaluate_hf_model(const policy_model& model, const prompt_format& format,
                                 const std::vector<eval_item>& items, const hf_eval_options& options);

}  // namespace sorl::ml
