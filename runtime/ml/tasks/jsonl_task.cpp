#include "runtime/ml/tasks/jsonl_task.hpp"

#include "runtime/ml/tasks/reasoning_checks.hpp"
#include "runtime/ml/tasks/reward_process.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/tasks/tasks_random.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace sorl::ml {

namespace {

using json = nlohmann::json;

std::string json_type_name(const json& j) {
  if (j.is_number_float())
    return "a non-integer number";
  return std::string("a ") + j.type_name();
}

/// A JSON integer (or an integer's decimal string, as some generators write them).
std::optional<std::int64_t> json_integer(const json& j) {
  if (j.is_number_integer())
    return j.get<std::int64_t>();
  if (j.is_string()) {
    const integer_answer parsed = parse_integer_answer(j.get<std::string>());
    return parsed.value;
  }
  return std::nullopt;
}

} // namespace

std::vector<jsonl_record> load_jsonl(const std::string& path, answer_match match,
                                     std::int64_t context_tokens,
                                     const std::function<std::int64_t(const std::string&)>& prompt_tokens) {
  const byte_tokenizer tok;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw task_data_error(path, 0, std::string("cannot open: ") + std::strerror(errno));
  std::vector<jsonl_record> records;
  std::string line;
  std::size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (trim_ascii_whitespace(line).empty())
      continue;
    const auto fail = [&](const std::string& what) { throw task_data_error(path, line_no, what); };
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail(std::string("invalid JSON: ") + e.what());
    }
    if (!j.is_object())
      fail("expected a JSON object, got " + json_type_name(j));
    jsonl_record rec;
    rec.line = line_no;

    const auto prompt = j.find("prompt");
    if (prompt == j.end())
      fail("missing field \"prompt\"");
    if (!prompt->is_string())
      fail("field \"prompt\" must be a string, got " + json_type_name(*prompt));
    rec.prompt = prompt->get<std::string>();
    if (rec.prompt.empty())
      fail("field \"prompt\" is empty");
    if (context_tokens > 0) {
      const auto n = prompt_tokens
                       ? prompt_tokens(rec.prompt)
                       : static_cast<std::int64_t>(encode_single_turn_prompt(tok, rec.prompt).size());
      if (n >= context_tokens)
        fail("field \"prompt\" takes " + std::to_string(n) + " tokens, which leaves no room to "
             "generate in the model's context of " + std::to_string(context_tokens) + " tokens");
    }

    const auto answer = j.find("answer");
    if (answer == j.end())
      fail("missing field \"answer\"");
    if (answer->is_string())
      rec.answer = answer->get<std::string>();
    else if (answer->is_number_integer()) // signed or unsigned; dump() is its decimal text
      rec.answer = answer->dump();
    else
      fail("field \"answer\" must be a string or an integer, got " + json_type_name(*answer));
    if (trim_ascii_whitespace(rec.answer).empty())
      fail("field \"answer\" is empty");
    if (match == answer_match::integer) {
      const integer_answer parsed = parse_integer_answer(rec.answer);
      if (!parsed.value)
        fail("field \"answer\" is not an integer answer (integer match mode): " + parsed.error);
    }
    const auto entry = j.find("entry");
    if (entry != j.end() && !entry->is_null())
      rec.entry_json = entry->dump(-1, ' ', false, json::error_handler_t::replace);
    if (match == answer_match::countdown) {
      const json* md = nullptr;
      if (entry != j.end() && entry->is_object() && entry->contains("metadata")
          && (*entry)["metadata"].is_object())
        md = &(*entry)["metadata"];
      if (!md || !md->contains("numbers") || !(*md)["numbers"].is_array() || !md->contains("target"))
        fail("the countdown match needs field \"entry\" with metadata.numbers (an array) and "
             "metadata.target, as scripts/fetch-data writes them");
      for (const auto& x : (*md)["numbers"]) {
        const auto v = json_integer(x);
        if (!v)
          fail("field \"entry.metadata.numbers\" holds " + json_type_name(x) + ", not an integer");
        rec.numbers.push_back(*v);
      }
      const auto t = json_integer((*md)["target"]);
      if (!t)
        fail("field \"entry.metadata.target\" is " + json_type_name((*md)["target"]) + ", not an integer");
      rec.target = *t;
    }
    records.push_back(std::move(rec));
  }
  if (in.bad())
    throw task_data_error(path, line_no, std::string("read error: ") + std::strerror(errno));
  if (records.empty())
    throw task_data_error(path, 0, "no records (the file is empty or blank)");
  return records;
}

jsonl_task::jsonl_task(const jsonl_options& options, double eval_fraction) : options_(options) {
  if (options.path.empty())
    throw std::invalid_argument("jsonl task: option \"path\" is required");
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
    throw std::invalid_argument("jsonl task: eval_fraction must be in [0, 1), got "
                                + std::to_string(eval_fraction));
  if (!options.reward.argv.empty()) {
    reward_process_options ro;
    ro.argv = options.reward.argv;
    ro.timeout_ms = options.reward.timeout_ms;
    scorer_ = std::make_shared<reward_process>(std::move(ro));
  }
  auto records =
    load_jsonl(options.path, options.match, options.context_tokens, options.prompt_tokens);
  if (!options.eval_path.empty()) {
    train_ = std::move(records);
    eval_ = load_jsonl(options.eval_path, options.match, options.context_tokens,
                       options.prompt_tokens);
    return;
  }
  for (auto& rec : records) {
    if (detail::split_of(detail::hash_text(rec.prompt), eval_fraction) == task_split::eval)
      eval_.push_back(std::move(rec));
    else
      train_.push_back(std::move(rec));
  }
}

std::string_view jsonl_task::name() const {
  return "jsonl";
}

const std::vector<jsonl_record>& jsonl_task::records(task_split split) const {
  return split == task_split::eval ? eval_ : train_;
}

std::optional<std::uint64_t> jsonl_task::size(task_split split) const {
  return records(split).size();
}

task_prompt jsonl_task::prompt(task_split split, std::uint64_t index) const {
  const auto& recs = records(split);
  if (index >= recs.size())
    throw std::out_of_range("jsonl task: index " + std::to_string(index) + " out of range for the "
                            + std::string(to_string(split)) + " split of size "
                            + std::to_string(recs.size()));
  task_prompt out;
  out.split = split;
  out.index = index;
  out.prompt = recs[index].prompt;
  out.reference = recs[index].answer;
  return out;
}

reward_result jsonl_task::score(const task_prompt& prompt, std::string_view completion) const {
  // The scorer process and the countdown rule need the record's entry, not only its answer.
  const auto record = [&]() -> const jsonl_record& {
    const auto& recs = records(prompt.split);
    if (prompt.index >= recs.size())
      throw std::out_of_range("jsonl task: scoring index " + std::to_string(prompt.index)
                              + " of the " + std::string(to_string(prompt.split))
                              + " split of size " + std::to_string(recs.size()));
    return recs[prompt.index];
  };
  if (scorer_) {
    const jsonl_record& rec = record();
    reward_request item;
    item.prompt = rec.prompt;
    item.completion = std::string(completion);
    item.answer = rec.answer;
    item.entry_json = rec.entry_json;
    return to_reward_result(scorer_->score({item}).at(0));
  }
  if (options_.match == answer_match::first_number || options_.match == answer_match::last_number
      || options_.match == answer_match::countdown) {
    const std::string answer = completion_answer(completion);
    double r = 0.0;
    if (options_.match == answer_match::first_number) {
      r = first_number_score(answer, prompt.reference);
    } else if (options_.match == answer_match::last_number) {
      r = last_number_score(answer, prompt.reference);
    } else {
      const jsonl_record& rec = record();
      r = countdown_score(answer, rec.numbers, rec.target);
    }
    if (r == 1.0)
      return {1.0, "correct"};
    return {r, "wrong answer: got " + quote_for_reason(answer) + ", expected "
                 + quote_for_reason(trim_ascii_whitespace(prompt.reference))};
  }
  if (options_.match == answer_match::integer) {
    const integer_answer got = parse_integer_answer(completion);
    if (!got.value)
      return {0.0, got.error};
    const integer_answer want = parse_integer_answer(prompt.reference);
    if (!want.value)
      return {0.0, "reference is not an integer: " + quote_for_reason(prompt.reference)};
    if (*got.value != *want.value)
      return {0.0, "wrong answer: got " + std::to_string(*got.value) + ", expected "
                     + std::to_string(*want.value)};
    return {1.0, "correct"};
  }
  const std::string_view got = trim_ascii_whitespace(completion);
  if (got.empty())
    return {0.0, "empty completion"};
  const std::string_view want = trim_ascii_whitespace(prompt.reference);
  if (got != want)
    return {0.0, "wrong answer: got " + quote_for_reason(got) + ", expected "
                   + quote_for_reason(want)};
  return {1.0, "correct"};
}

std::optional<std::string> jsonl_task::wrong_completion(const task_prompt& prompt,
                                                       std::uint64_t seed) const {
  detail::split_mix rng(detail::mix64(seed ^ detail::hash_text(prompt.prompt)));
  if (options_.match == answer_match::integer || options_.match == answer_match::first_number
      || options_.match == answer_match::last_number) {
    const integer_answer ref = parse_integer_answer(prompt.reference);
    if (ref.value || options_.match == answer_match::integer)
      return std::to_string(detail::wrong_integer_near(ref.value.value_or(0), rng));
  }
  // Another train record's answer: a plausible output in the dataset's own style, and
  // never an eval answer (demonstrations are training data). Random probes first, so
  // generating many demonstrations doesn't scan the dataset for each.
  const std::string_view want = trim_ascii_whitespace(prompt.reference);
  if (train_.empty())
    return "";
  for (int probe = 0; probe < 64; ++probe) {
    const auto& rec = train_[rng.below(train_.size())];
    if (trim_ascii_whitespace(rec.answer) != want)
      return rec.answer;
  }
  for (const auto& rec : train_)
    if (trim_ascii_whitespace(rec.answer) != want)
      return rec.answer;
  return "";
}

} // namespace sorl::ml
