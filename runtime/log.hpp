#pragma once

// Logging setup for the sorl executable and tests: spdlog to stderr, one pattern.

#include <string>

namespace sorl {

/// Sets the default logger's level ("trace" … "off") and a pattern that names `node`
/// when given. Raises std::invalid_argument for an unknown level name.
void setup_logging(const std::string& level, const std::string& node = "");

} // namespace sorl
