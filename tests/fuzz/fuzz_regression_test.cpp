// The fuzz entry points, run in every build: sorl's own encodings are accepted, and every
// input of the regression corpus (tests/fuzz/regressions/<target>/, past findings) gets a
// clean answer: no crash, no stray exception, an error message (files named ok-* are valid
// inputs that once broke a promise, and must be accepted).

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/fuzz/fuzz_entry.hpp"

namespace fs = std::filesystem;
using sorl::fuzz::outcome;
using sorl::fuzz::targets;

namespace {

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return std::move(buf).str();
}

outcome run(const sorl::fuzz::target& t, const std::string& bytes) {
  return t.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

} // namespace

TEST_CASE("every seed made by sorl's own encoders is accepted by its parser") {
  for (const auto& t : targets()) {
    const auto seeds = t.seeds();
    CAPTURE(t.name);
    CHECK(seeds.size() >= 2);
    for (size_t i = 0; i < seeds.size(); ++i) {
      CAPTURE(i);
      const outcome o = run(t, seeds[i]);
      CHECK(o.error == "");
      CHECK(o.accepted);
    }
  }
}

TEST_CASE("every input of the regression corpus gets a clean answer from its parser") {
  const fs::path root = SORL_SOURCE_DIR "/tests/fuzz/regressions";
  size_t files = 0;
  for (const auto& t : targets()) {
    const fs::path dir = root / std::string(t.name);
    if (!fs::is_directory(dir))
      continue;
    std::vector<fs::path> inputs;
    for (const auto& entry : fs::directory_iterator(dir))
      inputs.push_back(entry.path());
    std::sort(inputs.begin(), inputs.end());
    for (const auto& path : inputs) {
      CAPTURE(path.string());
      const std::string bytes = read_all(path);
      outcome o;
      REQUIRE_NOTHROW(o = run(t, bytes));
      const bool valid = path.filename().string().rfind("ok-", 0) == 0;
      CHECK(o.accepted == valid);
      if (!valid) {
        INFO(o.error);
        CHECK_FALSE(o.error.empty());
        if (t.name == "toml") // a config error names file:line:col
          CHECK(std::regex_search(o.error, std::regex("^fuzz\\.toml:[1-9][0-9]*:[1-9][0-9]*: ")));
      }
      ++files;
    }
  }
  CHECK(files >= 10);
}
