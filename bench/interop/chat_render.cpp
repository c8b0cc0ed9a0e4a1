// sorl_chat_render: renders chats with a tokenizer_config.json's chat template
// (runtime/ml/formats/chat_template.hpp), for comparison with transformers' apply_chat_template
// (bench/interop/chat_template_parity.py).
//
//   sorl_chat_render TOKENIZER_CONFIG < chats.jsonl
//
// Each input line: {"messages": [{"role": "user", "content": "..."}, ...],
// "add_generation_prompt": true}. Each output line: the rendered text as a JSON string.

#include "runtime/ml/formats/chat_template.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

using namespace sorl::ml;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sorl_chat_render TOKENIZER_CONFIG < chats.jsonl\n");
    return 2;
  }
  try {
    const chat_template t = chat_template::from_tokenizer_config(argv[1]);
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      std::vector<chat_message> messages;
      for (const auto& m : j.at("messages")) {
        const std::string role = m.at("role").get<std::string>();
        chat_role r = chat_role::user;
        if (role == "system") {
          r = chat_role::system;
        } else if (role == "assistant") {
          r = chat_role::assistant;
        } else if (role != "user") {
          throw std::runtime_error("unknown role '" + role + "'");
        }
        messages.push_back({r, m.at("content").get<std::string>()});
      }
      const std::string out = t.render(messages, j.value("add_generation_prompt", false));
      std::cout << nlohmann::json(out).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sorl_chat_render: %s\n", e.what());
    return 1;
  }
  return 0;
}
