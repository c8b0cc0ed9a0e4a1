#pragma once

// Shared helpers for the multi-turn task tests (tests/ml/tasks_test.cpp,
// tests/ml/file_search_test.cpp).

#include "runtime/ml/formats/tokenizer.hpp"

#include <string>
#include <vector>

namespace sorl::ml::test {

/// The policy's actions of a transcript (its assistant turns), in order.
inline std::vector<std::string> actions_of(const std::vector<chat_message>& chat) {
  std::vector<std::string> out;
  for (const auto& m : chat)
    if (m.role == chat_role::assistant)
      out.push_back(m.content);
  return out;
}

} // namespace sorl::ml::test
