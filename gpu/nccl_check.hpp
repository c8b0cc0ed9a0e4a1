#pragma once

// Check macro for NCCL calls: a result other than ncclSuccess becomes a std::runtime_error
// naming the call, its file and line, and NCCL's description of the error.

#include <nccl.h>

#include <stdexcept>
#include <string>

namespace sorl::gpu {

/// Throws the error SORL_NCCL_CHECK reports.
[[noreturn]] inline void throw_nccl_error(ncclResult_t status, const char* call, const char* file,
                                          int line) {
  throw std::runtime_error(std::string{"NCCL error "} + std::to_string(static_cast<int>(status)) +
                           " (" + ncclGetErrorString(status) + ") in " + call + " at " + file +
                           ":" + std::to_string(line));
}

} // namespace sorl::gpu

/// Evaluates an NCCL call once; throws std::runtime_error unless it returns ncclSuccess.
#define SORL_NCCL_CHECK(expr)                                                                   \
  do {                                                                                         \
    const ncclResult_t sorl_nccl_status_ = (expr);                                             \
    if (sorl_nccl_status_ != ncclSuccess)                                                      \
      ::sorl::gpu::throw_nccl_error(sorl_nccl_status_, #expr, __FILE__, __LINE__);             \
  } while (0)
