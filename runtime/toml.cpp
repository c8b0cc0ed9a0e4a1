#include "runtime/toml.hpp"

#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

namespace sorl {

namespace detail {

void toml_internal_failure(const char* check, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  throw toml_internal_error(
    fmt::format("`{}` (toml++ {}:{})", check, slash ? slash + 1 : file, line));
}

} // namespace detail

namespace {

/// True when parsing the first `n` bytes of `text` fails an internal check of toml++.
bool prefix_fails_check(std::string_view text, size_t n) {
  try {
    (void)toml::parse(text.substr(0, n), std::string_view{});
  } catch (const toml::parse_error&) {
  } catch (const toml_internal_error&) {
    return true;
  }
  return false;
}

/// Smallest n in (lo, hi] with fails(n), given !fails(lo) and fails(hi), by bisection over
/// the candidates `at(i)`, i in (lo, hi].
template <class At>
size_t bisect(size_t lo, size_t hi, At&& at, std::string_view text) {
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    if (prefix_fails_check(text, at(mid)))
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

/// Where toml++ gave up on `text`: the 1-based line and column (in code points) of the last
/// character of the shortest failing prefix, searched line by line, then within the line.
toml::source_position locate_check_failure(std::string_view text) {
  std::vector<size_t> line_ends; // end (exclusive, newline included) of each line
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n')
      line_ends.push_back(i + 1);
  if (line_ends.empty() || line_ends.back() != text.size())
    line_ends.push_back(text.size());
  // Candidate i in [1, lines]: the prefix through line i.
  const size_t line = bisect(0, line_ends.size(), [&](size_t i) { return line_ends[i - 1]; }, text);
  const size_t begin = line == 1 ? 0 : line_ends[line - 2];
  const size_t length = line_ends[line - 1] - begin;
  // Candidate j in [1, length]: the prefix through byte j of the line.
  const size_t byte = bisect(0, length, [&](size_t j) { return begin + j; }, text);
  size_t column = 0;
  for (size_t i = begin; i < begin + byte; ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0u) != 0x80u) // not a UTF-8 continuation
      ++column;
  return {static_cast<toml::source_index>(line), static_cast<toml::source_index>(column)};
}

} // namespace

toml::table parse_toml(std::string_view text, const std::string& file) {
  try {
    return toml::parse(text, std::string_view{file});
  } catch (const toml_internal_error& e) {
    const toml::source_position where = locate_check_failure(text);
    const std::string what =
      fmt::format("the parser cannot read what follows (its internal check {} failed)", e.what());
    throw toml::parse_error(what.c_str(), where, std::make_shared<const std::string>(file));
  }
}

} // namespace sorl
