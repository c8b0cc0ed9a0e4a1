#include "runtime/ml/train/hf_eval.hpp"

#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/tasks/reasoning_checks.hpp"
#include "runtime/ml/tasks/tasks.hpp"  // trim_ascii_whitespace

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <stdexcept>

namespace sorl::ml {

namespace {

std::int64_t json_int(const nlohmann::json& j) {
  if (j.is_number_integer()) return j.get<std::int64_t>();
  if (j.is_string()) return std::stoll(j.get<std::string>());
  throw std::invalid_argument("not an integer: " + j.dump());
}

}  // namespace

std::string_view to_string(answer_checker c) noexcept {
  switch (c) {
    case answer_checker::exact:
      return "exact";
    case answer_checker::first_number:
      return "first_number";
    case answer_checker::last_number:
      return "last_number";
    case answer_checker::countdown:
      return "countdown";
  }
  return "exact";
}

answer_checker parse_answer_checker(std::string_view name) {
  for (auto c : {answer_checker::exact, answer_checker::first_number, answer_checker::last_number,
                 answer_checker::countdown})
    if (name == to_string(c)) return c;
  throw std::invalid_argument(fmt::format(
      "unknown answer checker '{}' (known: exact, first_number, last_number, countdown)", name));
}

std::vector<eval_item> load_eval_items(const std::filesystem::path& path, answer_checker checker) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open", path.string()));
  std::vector<eval_item> out;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (trim_ascii_whitespace(line).empty()) continue;
    const auto where = fmt::format("{}:{}", path.string(), n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(fmt::format("{}: not valid JSON: {}", where, e.what()));
    }
    if (!j.is_object()) throw std::runtime_error(where + ": expected a JSON object");
    eval_item item;
    item.line = n;
    if (!j.contains("prompt") || !j["prompt"].is_string() || j["prompt"].get<std::string>().empty())
      throw std::runtime_error(where + ": field 'prompt': a non-empty string is required");
    item.prompt = j["prompt"].get<std::string>();
    if (!j.contains("answer") || !(j["answer"].is_string() || j["answer"].is_number()))
      throw std::runtime_error(where + ": field 'answer': a string or number is required");
    item.answer = j["answer"].is_string() ? j["answer"].get<std::string>() : j["answer"].dump();
    if (checker == answer_checker::countdown) {
      try {
        const auto& md = j.at("entry").at("metadata");
        for (const auto& x : md.at("numbers")) item.numbers.push_back(json_int(x));
        item.target = json_int(md.at("target"));
      } catch (const std::exception& e) {
        throw std::runtime_error(fmt::format(
            "{}: field 'entry.metadata': the countdown checker needs numbers and target ({})", where, e.what()));
      }
    }
    out.push_back(std::move(item));
  }
  if (out.empty()) throw std::runtime_error(fmt::format("{}: no items", path.string()));
  return out;
}

double score_answer(answer_checker checker, const eval_item& item, std::string_view answer) {
  switch (checker) {
    case answer_checker::exact:
      return trim_ascii_whitespace(answer) == trim_ascii_whitespace(item.answer) ? 1.0 : 0.0;
    case answer_checker::first_number:
      return first_number_score(answer, item.answer);
    case answer_checker::last_number:
      return last_number_score(answer, item.answer);
    case answer_checker::countdown:
      return countdown_score(answer, item.numbers, item.target);
  }
  return 0.0;
}

void summarize(hf_eval_report& r) {
  std::int64_t completions = 0, correct = 0, solved = 0;
  double score_sum = 0, length_sum = 0;
  for (const auto& it : r.items) {
    if (it.scores.empty() || it.scores.size() != it.lengths.size())
      throw std::invalid_argument(fmt::format("summarize: item of line {} has {} scores and {} lengths", it.line,
                                              it.scores.size(), it.lengths.size()));
    bool any = false;
    for (std::size_t i = 0; i < it.scores.size(); ++i) {
      ++completions;
      score_sum += it.scores[i];
      length_sum += static_cast<double>(it.lengths[i]);
      if (it.scores[i] >= 1.0) {
        ++correct;
        any = true;
      }
    }
    solved += any ? 1 : 0;
  }
  r.prompts = static_cast<std::int64_t>(r.items.size());
  const double c = completions > 0 ? static_cast<double>(completions) : 1.0;
  r.accuracy = static_cast<double>(correct) / c;
  r.mean_score = score_sum / c;
  r.mean_length = length_sum / c;
  r.pass_at_k = r.prompts > 0 ? static_cast<double>(solved) / static_cast<double>(r.prompts) : 0.0;
}

hf_eval_report evaluate_hf_model(const policy_model& model, const prompt_format& format,
                                 const std::vector<eval_item>& items, const hf_eval_options& o) {
  if (o.k < 1 || o.max_new_tokens < 1 || o.max_batch < o.k || o.limit < 0)
    throw std::invalid_argument(fmt::format(
        "eval options: need k >= 1, max_new_tokens >= 1, max_batch >= k, limit >= 0 (got k {}, max_new_tokens "
        "{}, max_batch {}, limit {})",
        o.k, o.max_new_tokens, o.max_batch, o.limit));
  const std::size_t n =
      o.limit > 0 ? std::min(items.size(), static_cast<std::size_t>(o.limit)) : items.size();

  generator_options go;
  go.max_batch = o.max_batch;
  generator g(model, go);
  sampling_params p;
  p.temperature = o.k == 1 ? 0.0 : o.temperature;
  p.max_new_tokens = o.max_new_tokens;
  p.eos_token_ids = format.stop_ids();
  p.seed = o.seed;

  hf_eval_report r;
  r.k = o.k;
  r.items.resize(n);
  std::map<std::uint64_t, std::size_t> item_of;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::int32_t> ids = format.single_turn(items[i].prompt);
    if (static_cast<std::int64_t>(ids.size()) + 1 >= model.dims().max_seq)
      throw std::invalid_argument(fmt::format("eval: the prompt of line {} is {} tokens, the model's context {}",
                                              items[i].line, ids.size(), model.dims().max_seq));
    item_of[g.submit(std::move(ids), p, o.k)] = i;
    r.items[i].line = items[i].line;
  }

  std::int64_t done = 0, tokens = 0, truncated = 0;
  const auto start = std::chrono::steady_clock::now();
  while (!g.idle()) {
    for (auto& res : g.step()) {
      const std::size_t i = item_of.at(res.request_id);
      auto& out = r.items[i];
      std::vector<std::int32_t> body = res.tokens;
      if (res.reason == finish_reason::eos && !body.empty()) body.pop_back();
      const std::string text = format.tok().decode(body, decode_specials::skip);
      out.completions.push_back(text);
      out.scores.push_back(score_answer(o.checker, items[i], completion_answer(text)));
      out.lengths.push_back(static_cast<std::int64_t>(res.tokens.size()));
      tokens += static_cast<std::int64_t>(res.tokens.size());
      truncated += res.reason == finish_reason::length ? 1 : 0;
      if (static_cast<std::int64_t>(out.scores.size()) == o.k) {
        ++done;
        if (o.progress) o.progress(done, static_cast<std::int64_t>(n));
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.tokens_per_second = r.seconds > 0 ? static_cast<double>(tokens) / r.seconds : 0.0;
  r.truncated = n > 0 ? static_cast<double>(truncated) / static_cast<double>(n * static_cast<std::size_t>(o.k)) : 0.0;
  summarize(r);
  return r;
}

}  // namespace sorl::ml
