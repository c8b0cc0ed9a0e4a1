#pragma once

// Option values of the WAR benches (war_bench.cpp, route_bench.cpp): a malformed or
// out-of-range value is an std::invalid_argument naming the option, never a silent default.

#include <fmt/format.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace sorl::bench {

/// A whole decimal integer in [lo, hi] for option --`name`.
inline long long integer(const std::string& name, const std::string& text, long long lo, long long hi) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < lo || v > hi)
    throw std::invalid_argument(fmt::format("--{} {}: expected an integer in [{}, {}]", name, text, lo, hi));
  return v;
}

/// A finite number in [lo, hi] for option --`name`.
inline double number(const std::string& name, const std::string& text, double lo, double hi) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(v >= lo && v <= hi))
    throw std::invalid_argument(fmt::format("--{} {}: expected a number in [{}, {}]", name, text, lo, hi));
  return v;
}

/// The comma-separated items of `s` ("" is one empty item).
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (from <= s.size()) {
    const std::size_t comma = s.find(',', from);
    out.push_back(s.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

}  // namespace sorl::bench
