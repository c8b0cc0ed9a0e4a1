#pragma once

// What a sorl binary was built from: the project version and the git commit of its source
// tree at build time (cmake/BuildInfo.cmake). `sorl --version` prints it and every benchmark
// record carries it, so a figure can be traced to the code that produced it.

#include <string>

namespace sorl {

/// The project version, e.g. "0.1.0" (CMakeLists.txt's project(VERSION)).
const char* version();

/// The 40-hex-digit commit the binary was built from, or "unknown" when the source tree was
/// not a git checkout (or git was missing) at build time.
const char* build_commit();

/// True when tracked files differed from build_commit() at build time: the binary's code is
/// then not exactly that commit's.
bool build_dirty();

/// "sorl 0.1.0 (commit 0123456789ab, dirty)": one line for `--version` and log headers;
/// the commit is shortened to 12 hex digits and ", dirty" appears only when build_dirty().
std::string version_line();

} // namespace sorl
