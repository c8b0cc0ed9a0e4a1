#pragma once

// GPU tests on a machine without the devices they need are reported as skipped, never as
// passed. A case calls skip_unless_cuda_devices(n) first; with fewer than n CUDA devices it
// prints why and ends the test process with SORL_TEST_SKIP_EXIT_CODE, which
// tests/gpu/CMakeLists.txt registers as every GPU case's SKIP_RETURN_CODE, so CTest reports
// the case as "Skipped". Catch2 v2 has no skip of its own; CTest runs each case in its own
// process, so the exit skips that case only. (Running a whole GPU test binary by hand on a
// machine without a device stops at its first case with that exit code.)

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

// The code comes from tests/gpu/CMakeLists.txt; 77 (the Automake convention for "skipped")
// for builds outside CMake (gpu/check_gpu.sh's standalone build).
#ifndef SORL_TEST_SKIP_EXIT_CODE
#define SORL_TEST_SKIP_EXIT_CODE 77
#endif

namespace sorl::gpu::test {

/// CUDA devices this process can use; 0 when the runtime finds no driver or no device.
inline int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky "no device" error for later calls
    return 0;
  }
  return n;
}

/// Returns when at least `devices` CUDA devices are present; otherwise prints
/// "SKIPPED: <what> needs N CUDA device(s), found M" to stderr and exits the process with
/// SORL_TEST_SKIP_EXIT_CODE.
inline void skip_unless_cuda_devices(int devices, const char* what) {
  const int found = cuda_device_count();
  if (found >= devices)
    return;
  std::fprintf(stderr, "SKIPPED: %s needs %d CUDA device(s), found %d\n", what, devices, found);
  std::fflush(stderr);
  std::exit(SORL_TEST_SKIP_EXIT_CODE);
}

} // namespace sorl::gpu::test
