// The process's resident memory from /proc/self/status and the peak-RSS windows of the step
// record: a 256 MiB buffer touched page by page must show in the window it lives in, and a
// window that starts after it is freed must not see it.

#include "runtime/process_memory.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <optional>

using namespace sorl;

TEST_CASE("proc_status_mib reads a kB line of /proc/self/status in MiB and refuses other keys") {
  const auto rss = proc_status_mib("VmRSS");
  REQUIRE(rss.has_value());
  CHECK(*rss > 1.0);     // a test process holds more than 1 MiB
  CHECK(*rss < 65536.0); // and less than 64 GiB
  const auto peak = proc_status_mib("VmHWM");
  REQUIRE(peak.has_value());
  CHECK(*peak >= *rss - 1.0); // the peak is never below the current RSS (1 MiB for the reads' gap)
  CHECK_FALSE(proc_status_mib("VmRS").has_value()); // a prefix of a key is not the key
  CHECK_FALSE(proc_status_mib("NoSuchKey").has_value());
}

TEST_CASE("a peak RSS window holds a buffer touched in it, and one opened after its release "
          "does not") {
  constexpr size_t bytes = size_t{256} << 20;
  constexpr double mib = 256.0;
  peak_rss_windows windows;
  if (!windows.supported()) {
    WARN("this kernel does not reset the peak RSS (/proc/self/clear_refs): windows unmeasured");
    CHECK_FALSE(windows.take().has_value());
    return;
  }
  const double before = *proc_status_mib("VmRSS");
  auto buffer = std::make_unique<char[]>(bytes);
  std::memset(buffer.get(), 1, bytes); // resident, page by page
  const auto holding = windows.take();
  REQUIRE(holding.has_value());
  CHECK(holding->window_mib >= before + 0.95 * mib);
  CHECK(holding->process_mib >= holding->window_mib);
  buffer.reset();
  // This window opened while the buffer was resident, so it still counts it.
  const auto released = windows.take();
  REQUIRE(released.has_value());
  CHECK(released->window_mib >= before + 0.95 * mib);
  // This one opened after the release (a 256 MiB block is an mmap that free unmaps).
  const auto after = windows.take();
  REQUIRE(after.has_value());
  CHECK(after->window_mib < holding->window_mib - 0.9 * mib);
  // The process peak keeps the buffer, though the kernel's own maximum forgot it at the resets
  // (never below: it is a running maximum; a page touched since may raise it a little).
  CHECK(released->process_mib >= holding->process_mib);
  CHECK(after->process_mib >= released->process_mib);
  CHECK(after->process_mib >= after->window_mib + 0.9 * mib);
}
