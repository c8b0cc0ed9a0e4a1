#pragma once

// The entry points through which the fuzz harnesses (fuzz_main.cpp, clang + libFuzzer, built
// with SORL_FUZZ=ON) and the regression test (fuzz_regression_test.cpp, every build) feed
// bytes to the parsers that take untrusted input, and the valid inputs that sorl's own
// encoders make, which seed the fuzzers. scripts/fuzz runs the harnesses; tests/fuzz/README.md
// says how.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::fuzz {

/// What a parser made of one input: accepted, or refused with the error it reported.
struct outcome {
  bool accepted = false;
  std::string error; ///< the parser's own message; empty when accepted
};

/// One fuzzed parser.
struct target {
  std::string_view name; ///< also the corpus directory name: envelope, delta, toml, ...
  /// Feeds `size` bytes to the parser. Returns the outcome for any input; throws
  /// std::logic_error only when the parser broke one of its promises (e.g. a bucket that
  /// passed check_delta_bucket then failed to apply, or a wrong demonstration that scores).
  /// Any other exception or signal is a finding.
  outcome (*run)(const uint8_t* data, size_t size);
  /// Valid inputs made by sorl's own encoders; each is accepted by `run`.
  std::vector<std::string> (*seeds)();
};

/// envelope (CAF wire form of sorl::envelope, then opened as its schema and read in full),
/// delta (a sparse weight-delta bucket against a fixed model), toml (an experiment config),
/// safetensors (a checkpoint file), jsonl (a task file, in both answer modes), gguf (a
/// llama.cpp model file, dequantised and converted when small), hf_config (a Hugging Face
/// config.json), tokenizer_json (a Hugging Face tokenizer.json, then text encoded with it).
const std::vector<target>& targets();

/// The target called `name`; throws std::invalid_argument for an unknown name.
const target& find_target(std::string_view name);

} // namespace sorl::fuzz
