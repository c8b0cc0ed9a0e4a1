#include "runtime/log.hpp"

#include <stdexcept>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace sorl {

void setup_logging(const std::string& level, const std::string& node) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    throw std::invalid_argument("unknown log level \"" + level
                                + "\" (trace, debug, info, warn, error, critical, off)");
  auto logger = spdlog::stderr_color_mt(node.empty() ? "sorl" : "sorl." + node);
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  spdlog::set_pattern(node.empty() ? "[%H:%M:%S.%e] [%^%l%$] %v"
                                   : "[%H:%M:%S.%e] [" + node + "] [%^%l%$] %v");
  spdlog::flush_on(spdlog::level::info);
}

} // namespace sorl
