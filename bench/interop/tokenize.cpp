// sorl_tokenize: the token ids of text lines under a Hugging Face tokenizer.json
// (runtime/ml/formats/hf_tokenizer.hpp), for comparing with the Python `tokenizers` library
// (bench/interop/tokenizer_parity.py).
//
//   sorl_tokenize TOKENIZER_JSON [special=1] [json=1] < lines.txt
//
// Prints, per input line, the ids of `encode(line)` separated by spaces (an empty line for
// no ids). special=1 uses encode_with_special instead (added special tokens match).
// json=1 reads each line as a JSON string literal, so a text may hold newlines and any
// other character. Finally writes "lines=N tokens=T encode_seconds=S" to stderr: the time
// spent in encode alone, without reading or printing.

#include "runtime/ml/formats/hf_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

using namespace sorl::ml;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: sorl_tokenize TOKENIZER_JSON [special=1] [json=1] < lines.txt\n");
    return 2;
  }
  bool special = false;
  bool json_lines = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "special=1" || a == "special=0") {
      special = a == "special=1";
    } else if (a == "json=1" || a == "json=0") {
      json_lines = a == "json=1";
    } else {
      std::fprintf(stderr, "sorl_tokenize: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  try {
    const hf_tokenizer tok = hf_tokenizer::load(argv[1]);
    std::ios::sync_with_stdio(false);
    std::string line, text, out;
    std::size_t lines = 0, tokens = 0;
    std::chrono::steady_clock::duration spent{};
    while (std::getline(std::cin, line)) {
      if (json_lines) {
        const auto parsed = nlohmann::json::parse(line);
        if (!parsed.is_string()) throw std::runtime_error("line " + std::to_string(lines + 1) + " is not a JSON string");
        text = parsed.get<std::string>();
      } else {
        text = line;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<token_id> ids = special ? tok.encode_with_special(text) : tok.encode(text);
      spent += std::chrono::steady_clock::now() - t0;
      out.clear();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) out += ' ';
        out += std::to_string(ids[i]);
      }
      out += '\n';
      std::cout << out;
      ++lines;
      tokens += ids.size();
    }
    std::cout.flush();
    std::fprintf(stderr, "lines=%zu tokens=%zu encode_seconds=%.6f\n", lines, tokens,
                 std::chrono::duration<double>(spent).count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sorl_tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
