#pragma once

// A grow-only device allocation owned by one object (cudaMalloc / cudaFree).

#include "gpu/check.hpp"

#include <cstddef>

namespace sorl::gpu {

/// Device memory of at least capacity() bytes; reserve() reallocates (contents lost) only when
/// asked for more. Not copyable.
class device_buffer {
public:
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (ptr_ != nullptr)
      cudaFree(ptr_); // no throw from a destructor; a failure here leaks at worst
  }

  /// Makes room for `bytes` bytes; returns the (maybe new) pointer.
  void* reserve(size_t bytes) {
    if (bytes <= capacity_ && ptr_ != nullptr)
      return ptr_;
    if (ptr_ != nullptr) {
      SORL_CUDA_CHECK(cudaFree(ptr_));
      ptr_ = nullptr;
      capacity_ = 0;
    }
    const size_t want = bytes > 0 ? bytes : 1;
    SORL_CUDA_CHECK(cudaMalloc(&ptr_, want));
    capacity_ = want;
    return ptr_;
  }

  template <class T>
  T* reserve_as(size_t count) {
    return static_cast<T*>(reserve(count * sizeof(T)));
  }

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t capacity() const {
    return capacity_;
  }

private:
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

} // namespace sorl::gpu
