// sorl_score_answers: scores answers with the built-in reasoning checkers
// (runtime/ml/tasks/reasoning_checks.hpp), for comparison with reasoning-gym's own score_answer
// (bench/interop/reward_parity.py).
//
//   sorl_score_answers < cases.jsonl
//
// Each input line: {"task": "countdown" | "gsm_symbolic", "answer": "...", "entry": {...}}
// with the reasoning-gym entry (countdown reads metadata.numbers and metadata.target,
// gsm_symbolic the entry's answer). Each output line: the score.

#include "runtime/ml/tasks/reasoning_checks.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

using namespace sorl::ml;

namespace {

std::int64_t as_int(const nlohmann::json& j) {
  return j.is_string() ? std::stoll(j.get<std::string>()) : j.get<std::int64_t>();
}

}  // namespace

int main() {
  std::string line;
  std::size_t n = 0;
  try {
    while (std::getline(std::cin, line)) {
      ++n;
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      const std::string task = j.at("task").get<std::string>();
      const std::string answer = j.at("answer").get<std::string>();
      const auto& entry = j.at("entry");
      double score = 0.0;
      if (task == "countdown") {
        std::vector<std::int64_t> numbers;
        for (const auto& x : entry.at("metadata").at("numbers")) numbers.push_back(as_int(x));
        score = countdown_score(answer, numbers, as_int(entry.at("metadata").at("target")));
      } else if (task == "gsm_symbolic") {
        score = first_number_score(answer, entry.at("answer").get<std::string>());
      } else {
        throw std::runtime_error("unknown task '" + task + "'");
      }
      std::printf("%.17g\n", score);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sorl_score_answers: line %zu: %s\n", n, e.what());
    return 1;
  }
  return 0;
}
