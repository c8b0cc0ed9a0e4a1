// GPU sparse weight-sync bench (ARCHITECTURE.md §6): on a synthetic bf16 tensor (default 1e9
// elements) at 0.1 %, 1 % and 5 % changed, checks that encode_delta_gpu's buckets equal
// sync::encode_delta's byte for byte and that apply_delta_bucket_gpu reproduces `next`, and
// prints encode and apply throughput next to a device-to-device cudaMemcpy of the same tensor.
// Throughput is dense bytes (2 × elements) per second of device time (cudaEvent); host
// framing, the payload copy back and the host bucket check are reported separately.
//
// Usage: gpu_sync_bench [elements] [repeats]

#include "gpu/check.hpp"
#include "gpu/sparse_sync.hpp"
#include "runtime/sync/delta_codec.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/// base: bf16 patterns of weights of magnitude 2^-10..2^-3; next: a `threshold` / 2^32 fraction of
/// elements moved, 96 % by ±1 ULP, 4 % to another random pattern.
__global__ void synth(uint16_t* base, uint16_t* next, uint64_t n, uint32_t threshold,
                      uint64_t seed) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = mix64(i ^ seed);
    const uint64_t c = mix64(h + 0x9e3779b97f4a7c15ull);
    // sign, exponent 0x78 +- 3 (about 2^-7), random mantissa
    const auto b = static_cast<uint16_t>(((h >> 16) & 0x8000u) | ((0x75u + (h & 7u)) << 7) |
                                         ((h >> 8) & 0x7Fu));
    uint16_t s = 0;
    if (static_cast<uint32_t>(c) < threshold) {
      const uint32_t r = static_cast<uint32_t>(c >> 32) % 100;
      s = r < 48 ? 1 : r < 96 ? 0xFFFF : static_cast<uint16_t>(1 + (c >> 40) % 65535);
    }
    base[i] = b;
    next[i] = static_cast<uint16_t>(b + s);
  }
}

__global__ void count_diff(const uint16_t* a, const uint16_t* b, uint64_t n,
                           unsigned long long* out) {
  unsigned long long local = 0;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x)
    local += a[i] != b[i];
  if (local != 0)
    atomicAdd(out, local);
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

} // namespace

int main(int argc, char** argv) {
  using namespace sorl;
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000000ull;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_sync_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  SORL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; tensor: %llu bf16 elements (%.2f GB dense), %d repeats\n",
              prop.name, prop.multiProcessorCount, static_cast<unsigned long long>(n),
              2e-9 * static_cast<double>(n), repeats);

  uint16_t *d_base = nullptr, *d_next = nullptr, *d_target = nullptr;
  unsigned long long* d_diff = nullptr;
  SORL_CUDA_CHECK(cudaMalloc(&d_base, 2 * n));
  SORL_CUDA_CHECK(cudaMalloc(&d_next, 2 * n));
  SORL_CUDA_CHECK(cudaMalloc(&d_target, 2 * n));
  SORL_CUDA_CHECK(cudaMalloc(&d_diff, sizeof(unsigned long long)));
  gpu::delta_gpu_workspace ws;
  const cudaStream_t st = ws.stream();
  cudaEvent_t e0, e1;
  SORL_CUDA_CHECK(cudaEventCreate(&e0));
  SORL_CUDA_CHECK(cudaEventCreate(&e1));

  // Device-to-device copy of the dense tensor: the bandwidth yardstick (reads + writes 2n bytes).
  float copy_ms = 1e30f;
  for (int r = 0; r < repeats + 1; ++r) {
    SORL_CUDA_CHECK(cudaEventRecord(e0, st));
    SORL_CUDA_CHECK(cudaMemcpyAsync(d_target, d_base, 2 * n, cudaMemcpyDeviceToDevice, st));
    SORL_CUDA_CHECK(cudaEventRecord(e1, st));
    SORL_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    SORL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0)
      copy_ms = std::min(copy_ms, ms);
  }
  const double dense_gb = 2e-9 * static_cast<double>(n);
  std::printf("cudaMemcpy D2D: %.3f ms, %.1f GB/s (dense bytes per second; the copy moves each "
              "byte twice)\n\n",
              copy_ms, dense_gb / (copy_ms * 1e-3));

  std::vector<uint16_t> h_base(n), h_next(n);
  const double fractions[] = {0.001, 0.01, 0.05};
  bool all_ok = true;
  for (double f : fractions) {
    const auto threshold = static_cast<uint32_t>(f * 4294967296.0);
    synth<<<prop.multiProcessorCount * 8, 256, 0, st>>>(d_base, d_next, n, threshold, 42);
    SORL_CUDA_CHECK_LAUNCH();
    SORL_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<sync::delta_source> dev_src = {{0, d_base, d_next, n}};
    const sync::delta_options opt; // 64 MiB buckets

    // GPU encode: best device time and best total time over the repeats (first run warms up).
    std::vector<std::vector<uint8_t>> gpu_buckets;
    sync::delta_stats gs;
    float enc_dev = 1e30f;
    double enc_total = 1e30;
    for (int r = 0; r < repeats + 1; ++r) {
      gpu_buckets = gpu::encode_delta_gpu(0, 1, dev_src, opt, &gs, &ws);
      if (r > 0) {
        enc_dev = std::min(enc_dev, ws.timing().encode_device_ms);
        enc_total = std::min(enc_total, ws.timing().encode_total_ms);
      }
    }

    // CPU encode of the same tensor for the byte comparison (single-threaded).
    SORL_CUDA_CHECK(cudaMemcpy(h_base.data(), d_base, 2 * n, cudaMemcpyDeviceToHost));
    SORL_CUDA_CHECK(cudaMemcpy(h_next.data(), d_next, 2 * n, cudaMemcpyDeviceToHost));
    const std::vector<sync::delta_source> host_src = {{0, h_base.data(), h_next.data(), n}};
    sync::delta_stats cs;
    const double c0 = now_ms();
    const auto cpu_buckets = sync::encode_delta(0, 1, host_src, opt, &cs);
    const double cpu_ms = now_ms() - c0;
    const bool same = cpu_buckets == gpu_buckets;

    // GPU apply: every bucket onto a copy of base, then compare with next on the device.
    float apply_dev = 1e30f;
    double apply_check = 1e30;
    bool applied_ok = true;
    for (int r = 0; r < repeats + 1; ++r) {
      SORL_CUDA_CHECK(cudaMemcpyAsync(d_target, d_base, 2 * n, cudaMemcpyDeviceToDevice, st));
      SORL_CUDA_CHECK(cudaStreamSynchronize(st));
      const std::vector<sync::delta_target> targets = {{0, d_target, n}};
      float dev = 0;
      double check = 0;
      for (const auto& b : gpu_buckets) {
        if (auto err = gpu::apply_delta_bucket_gpu(b.data(), b.size(), 0, 1, targets, &ws)) {
          std::printf("apply failed: %s\n", err->c_str());
          applied_ok = false;
        }
        dev += ws.timing().apply_device_ms;
        check += ws.timing().apply_check_ms;
      }
      if (r > 0) {
        apply_dev = std::min(apply_dev, dev);
        apply_check = std::min(apply_check, check);
      }
    }
    SORL_CUDA_CHECK(cudaMemsetAsync(d_diff, 0, sizeof(unsigned long long), st));
    count_diff<<<prop.multiProcessorCount * 8, 256, 0, st>>>(d_target, d_next, n, d_diff);
    SORL_CUDA_CHECK_LAUNCH();
    unsigned long long diff = 0;
    SORL_CUDA_CHECK(cudaMemcpyAsync(&diff, d_diff, sizeof diff, cudaMemcpyDeviceToHost, st));
    SORL_CUDA_CHECK(cudaStreamSynchronize(st));
    applied_ok = applied_ok && diff == 0;
    all_ok = all_ok && same && applied_ok;

    std::printf("changed %.1f %%: %llu changed, %llu buckets, %.1f MB encoded (%.1fx smaller "
                "than dense), %llu dense entries\n",
                100 * f, static_cast<unsigned long long>(gs.changed),
                static_cast<unsigned long long>(gs.buckets), 1e-6 * gs.encoded_bytes,
                static_cast<double>(gs.dense_bytes) / static_cast<double>(gs.encoded_bytes),
                static_cast<unsigned long long>(gs.dense_segments));
    std::printf("  GPU buckets bit-exact with CPU encode_delta: %s\n", same ? "yes" : "NO");
    std::printf("  GPU apply reproduces next: %s (%llu elements differ)\n",
                applied_ok ? "yes" : "NO", diff);
    std::printf("  encode device (scan..payload bits):   %8.3f ms  %8.1f GB/s\n", enc_dev,
                dense_gb / (enc_dev * 1e-3));
    std::printf("  encode total (+ copy back, framing, XXH3): %8.3f ms  %8.1f GB/s\n", enc_total,
                dense_gb / (enc_total * 1e-3));
    std::printf("  CPU encode_delta (1 thread):          %8.1f ms  %8.1f GB/s\n", cpu_ms,
                dense_gb / (cpu_ms * 1e-3));
    std::printf("  apply device (upload+decode+scatter): %8.3f ms  %8.1f GB/s\n", apply_dev,
                dense_gb / (apply_dev * 1e-3));
    std::printf("  apply host check_delta_bucket:        %8.1f ms\n", apply_check);
    std::printf("  cudaMemcpy D2D for comparison:        %8.3f ms  %8.1f GB/s\n\n", copy_ms,
                dense_gb / (copy_ms * 1e-3));
    std::fflush(stdout);
  }
  std::printf("gpu_sync_bench: %s\n", all_ok ? "all bit-exact" : "MISMATCH");
  cudaFree(d_base);
  cudaFree(d_next);
  cudaFree(d_target);
  cudaFree(d_diff);
  return all_ok ? 0 : 1;
}
