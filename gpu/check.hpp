#pragma once

// Check macros for CUDA runtime calls: a status other than cudaSuccess becomes a
// std::runtime_error naming the call, its file and line, and the CUDA error (STYLE.md: CUDA and
// NCCL status codes turn into errors at the boundary). NCCL's twin is in gpu/nccl_check.hpp.

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace sorl::gpu {

/// Throws the error SORL_CUDA_CHECK reports.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                          int line) {
  throw std::runtime_error(std::string{"CUDA error "} + cudaGetErrorName(status) + " (" +
                           cudaGetErrorString(status) + ") in " + call + " at " + file + ":" +
                           std::to_string(line));
}

} // namespace sorl::gpu

/// Evaluates a CUDA runtime call once; throws std::runtime_error unless it returns cudaSuccess.
#define SORL_CUDA_CHECK(expr)                                                                   \
  do {                                                                                         \
    const cudaError_t sorl_cuda_status_ = (expr);                                              \
    if (sorl_cuda_status_ != cudaSuccess)                                                      \
      ::sorl::gpu::throw_cuda_error(sorl_cuda_status_, #expr, __FILE__, __LINE__);             \
  } while (0)

/// Checks the launch just made (configuration errors surface here, faults at the next sync).
#define SORL_CUDA_CHECK_LAUNCH() SORL_CUDA_CHECK(cudaGetLastError())
