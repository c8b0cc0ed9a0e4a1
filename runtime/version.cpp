#include "runtime/version.hpp"

#include <string_view>

namespace sorl {
namespace detail {
extern const char* const build_version;
extern const char* const build_commit;
extern const bool build_dirty;
} // namespace detail

const char* version() {
  return detail::build_version;
}

const char* build_commit() {
  return detail::build_commit;
}

bool build_dirty() {
  return detail::build_dirty;
}

std::string version_line() {
  std::string_view commit = detail::build_commit;
  std::string out = "sorl ";
  out += detail::build_version;
  out += " (commit ";
  out += commit.substr(0, commit == "unknown" ? commit.size() : 12);
  if (detail::build_dirty)
    out += ", dirty";
  out += ")";
  return out;
}

} // namespace sorl
