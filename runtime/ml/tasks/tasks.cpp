#include "runtime/ml/tasks/tasks.hpp"

#include "runtime/ml/tasks/environments.hpp"
#include "runtime/ml/tasks/file_search.hpp"
#include "runtime/ml/tasks/jsonl_task.hpp"
#include "runtime/ml/tasks/tasks_arithmetic.hpp"
#include "runtime/ml/tasks/tasks_random.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

namespace sorl::ml {

std::string_view to_string(task_split split) {
  return split == task_split::eval ? "eval" : "train";
}

task_data_error::task_data_error(std::string path, std::size_t line, const std::string& what)
  : std::runtime_error(path + ":" + std::to_string(line) + ": " + what),
    path_(std::move(path)),
    line_(line) {}

std::string_view any_task::name() const {
  if (single_turn)
    return single_turn->name();
  if (multi_turn)
    return multi_turn->name();
  return "";
}

std::vector<std::string> task_names() {
  return {"arithmetic", "number_guess", "file_search", "jsonl"};
}

bool is_multi_turn_task(std::string_view name) noexcept {
  return name == "number_guess" || name == "file_search";
}

any_task make_task(std::string_view name, const task_options& options) {
  if (!(options.eval_fraction >= 0.0 && options.eval_fraction < 1.0))
    throw std::invalid_argument("task option eval_fraction must be in [0, 1), got "
                                + std::to_string(options.eval_fraction));
  any_task out;
  if (name == "arithmetic") {
    out.single_turn = std::make_shared<arithmetic_task>(options.arithmetic, options.seed,
                                                        options.eval_fraction);
  } else if (name == "number_guess") {
    out.multi_turn = std::make_shared<number_guess_task>(options.number_guess, options.seed);
  } else if (name == "file_search") {
    out.multi_turn = std::make_shared<file_search_task>(options.file_search, options.seed);
  } else if (name == "jsonl") {
    out.single_turn = std::make_shared<jsonl_task>(options.jsonl, options.eval_fraction);
  } else {
    std::string known;
    for (const auto& n : task_names())
      known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown task " + quote_for_reason(name) + " (known: " + known
                                + ")");
  }
  return out;
}

std::string_view trim_ascii_whitespace(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && is_space(text.back()))
    text.remove_suffix(1);
  return text;
}

std::string quote_for_reason(std::string_view text, std::size_t max_bytes) {
  const bool cut = text.size() > max_bytes;
  const std::string clean = sanitize_utf8(text.substr(0, max_bytes));
  std::string out = "\"";
  for (char c : clean) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += cut ? "\"..." : "\"";
  return out;
}

integer_answer parse_integer_answer(std::string_view text) {
  integer_answer out;
  const std::string_view s = trim_ascii_whitespace(text);
  if (s.empty()) {
    out.error = "empty answer";
    return out;
  }
  const bool negative = s.front() == '-';
  const std::string_view digits = negative ? s.substr(1) : s;
  const bool all_digits = !digits.empty()
                          && std::all_of(digits.begin(), digits.end(),
                                         [](char c) { return c >= '0' && c <= '9'; });
  if (!all_digits) {
    out.error = "not an integer: " + quote_for_reason(text);
    return out;
  }
  if (digits.size() > 1 && digits.front() == '0') {
    out.error = "non-canonical integer (leading zero): " + quote_for_reason(s);
    return out;
  }
  if (negative && digits == "0") {
    out.error = "non-canonical integer (-0)";
    return out;
  }
  // Accumulate negatively so that INT64_MIN parses too.
  std::int64_t value = 0;
  constexpr std::int64_t min = std::numeric_limits<std::int64_t>::min();
  for (char c : digits) {
    const int d = c - '0';
    if (value < (min + d) / 10) {
      out.error = "integer out of range: " + quote_for_reason(s);
      return out;
    }
    value = value * 10 - d;
  }
  if (!negative) {
    if (value == min) {
      out.error = "integer out of range: " + quote_for_reason(s);
      return out;
    }
    value = -value;
  }
  out.value = value;
  return out;
}

namespace {

// Exactly round(count * fraction) distinct positions in [0, count), drawn from seed.
std::vector<bool> wrong_positions(std::size_t count, double wrong_fraction, std::uint64_t seed) {
  if (!(wrong_fraction >= 0.0 && wrong_fraction <= 1.0))
    throw std::invalid_argument("wrong_fraction must be in [0, 1], got "
                                + std::to_string(wrong_fraction));
  const auto k = static_cast<std::size_t>(std::llround(static_cast<double>(count) * wrong_fraction));
  std::vector<std::size_t> order(count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  detail::split_mix rng(detail::mix64(seed ^ 0xA5A5A5A5A5A5A5A5ULL));
  for (std::size_t i = 0; i < k; ++i) // partial Fisher-Yates: the first k are the sample
    std::swap(order[i], order[i + rng.below(count - i)]);
  std::vector<bool> wrong(count, false);
  for (std::size_t i = 0; i < k; ++i)
    wrong[order[i]] = true;
  return wrong;
}

} // namespace

std::vector<demonstration> make_demonstrations(const single_turn_task& task, task_split split,
                                               std::uint64_t first_index, std::size_t count,
                                               double wrong_fraction, std::uint64_t seed) {
  const std::vector<bool> wrong = wrong_positions(count, wrong_fraction, seed);
  std::vector<demonstration> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    task_prompt p = task.prompt(split, first_index + i);
    demonstration d;
    std::optional<std::string> slip;
    if (wrong[i])
      slip = task.wrong_completion(p, detail::mix64(seed + i));
    d.correct = !slip;
    d.completion = slip ? std::move(*slip) : p.reference;
    d.prompt = std::move(p.prompt);
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<episode_demonstration>
make_episode_demonstrations(const multi_turn_task& task, task_split split,
                            std::uint64_t first_index, std::size_t count,
                            double wrong_fraction, std::uint64_t seed) {
  const std::vector<bool> wrong = wrong_positions(count, wrong_fraction, seed);
  std::vector<episode_demonstration> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    episode_demonstration d;
    const std::uint64_t episode = task.episode_seed(split, first_index + i);
    d.chat = task.demonstrate(episode, !wrong[i]);
    if (wrong[i]) {
      auto env = task.make_environment();
      env->reset(episode);
      double reward = 0.0;
      for (const chat_message& m : d.chat)
        if (m.role == chat_role::assistant)
          reward = env->step(m.content).reward;
      d.correct = reward == 1.0;
    }
    out.push_back(std::move(d));
  }
  return out;
}

} // namespace sorl::ml
