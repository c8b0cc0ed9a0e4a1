#pragma once

// The process's resident memory, read from Linux's /proc/self/status, for the per-phase peak
// RSS of the step record (runtime/metrics.hpp, rss_peak_*_mib) and the learner bench.

#include <optional>
#include <string_view>

namespace sorl {

/// The value of a `key:` line of /proc/self/status given in kB (e.g. "VmHWM", the peak RSS;
/// "VmRSS", the current one), in MiB; nullopt where the file or the key cannot be read (not
/// Linux, or a kernel without the field).
std::optional<double> proc_status_mib(std::string_view key);

/// Starts a new peak-RSS window: writes "5" to /proc/self/clear_refs, after which VmHWM counts
/// from the current RSS. False where the kernel refuses (before Linux 4.0, or a sandbox that
/// denies the write); VmHWM then keeps counting from the process's start.
bool reset_peak_rss();

/// What `peak_rss_windows::take` measured, MiB.
struct rss_peaks {
  double window_mib = 0;  ///< peak RSS of the window that ended
  double process_mib = 0; ///< peak RSS from the process's start to the end of that window
};

/// Peak RSS over consecutive windows: each `take()` returns the peak since the previous
/// `take()` (or construction) and starts the next window. Empty results when the kernel
/// cannot reset the peak, so that a process-lifetime peak is never reported as a window's.
///
/// Resetting the peak also resets what the kernel reports as the process's maximum RSS at
/// exit (getrusage's ru_maxrss, `/usr/bin/time -v`'s "Maximum resident set size"): it then
/// covers only the last window. `rss_peaks::process_mib` carries the lifetime peak instead.
class peak_rss_windows {
public:
  /// Starts the first window; checks once whether the kernel resets the peak.
  peak_rss_windows();

  /// The peaks of the window that ends now; nullopt when windows are unsupported.
  std::optional<rss_peaks> take();

  /// Whether the kernel resets the peak, so that windows are measured.
  bool supported() const {
    return supported_;
  }

private:
  bool supported_ = false;
  double process_mib_ = 0; ///< the largest peak seen, the one before the first reset included
};

} // namespace sorl
