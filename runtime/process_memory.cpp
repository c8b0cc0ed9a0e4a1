#include "runtime/process_memory.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace sorl {

std::optional<double> proc_status_mib(std::string_view key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    // "VmHWM:\t  123456 kB"
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0
        && line[key.size()] == ':') {
      char* end = nullptr;
      const double kb = std::strtod(line.c_str() + key.size() + 1, &end);
      if (end == line.c_str() + key.size() + 1)
        return std::nullopt;
      return kb / 1024.0;
    }
  }
  return std::nullopt;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out)
    return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

peak_rss_windows::peak_rss_windows() {
  const auto before = proc_status_mib("VmHWM");
  supported_ = before.has_value() && reset_peak_rss();
  process_mib_ = before.value_or(0.0);
}

std::optional<rss_peaks> peak_rss_windows::take() {
  if (!supported_)
    return std::nullopt;
  const auto peak = proc_status_mib("VmHWM");
  if (!peak || !reset_peak_rss()) {
    supported_ = false;
    return std::nullopt;
  }
  process_mib_ = std::max(process_mib_, *peak);
  return rss_peaks{*peak, process_mib_};
}

} // namespace sorl
