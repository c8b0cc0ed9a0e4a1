// The CUDA kernels of the sparse weight-sync codec (gpu/sparse_sync.hpp) against the CPU codec
// (runtime/sync/delta_codec.hpp): the same buckets byte for byte, the same applied tensors.
// Label "gpu"; without a CUDA device every case is reported skipped (tests/gpu/gpu_skip.hpp).

#include "gpu/check.hpp"
#include "gpu/sparse_sync.hpp"
#include "runtime/sync/delta_codec.hpp"
#include "tests/gpu/delta_test_data.hpp"
#include "tests/gpu/gpu_skip.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

using namespace sorl;
using sorl::gpu::test::make_delta;
using sorl::gpu::test::step_mix;
using sorl::gpu::test::tensor_pair;

namespace {

/// A device copy of a host array, freed on destruction. `shift` elements of slack come first,
/// so that data() can be deliberately misaligned for the kernels' scalar path.
class device_array {
public:
  device_array(const std::vector<uint16_t>& host, size_t shift) : n_(host.size()), shift_(shift) {
    SORL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&raw_), 2 * (n_ + shift_) + 2));
    SORL_CUDA_CHECK(cudaMemcpy(data(), host.data(), 2 * n_, cudaMemcpyHostToDevice));
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() {
    cudaFree(raw_);
  }
  uint16_t* data() const {
    return raw_ + shift_;
  }
  std::vector<uint16_t> download() const {
    std::vector<uint16_t> h(n_);
    SORL_CUDA_CHECK(cudaMemcpy(h.data(), data(), 2 * n_, cudaMemcpyDeviceToHost));
    return h;
  }

private:
  uint16_t* raw_ = nullptr;
  size_t n_, shift_;
};

/// encode_delta_gpu against encode_delta, then apply_delta_bucket_gpu of every bucket to a
/// device copy of each base; requires equal buckets and stats and tensors equal to next.
void check_gpu(const std::vector<tensor_pair>& ts, const std::vector<uint32_t>& ids,
               uint64_t bucket_bytes, size_t shift, gpu::delta_gpu_workspace& ws) {
  std::vector<sync::delta_source> host_src, dev_src;
  std::vector<std::unique_ptr<device_array>> bases, nexts, targets;
  std::vector<sync::delta_target> dev_targets;
  for (size_t i = 0; i < ts.size(); ++i) {
    const uint64_t n = ts[i].base.size();
    host_src.push_back({ids[i], ts[i].base.data(), ts[i].next.data(), n});
    bases.push_back(std::make_unique<device_array>(ts[i].base, shift));
    nexts.push_back(std::make_unique<device_array>(ts[i].next, shift));
    targets.push_back(std::make_unique<device_array>(ts[i].base, shift));
    dev_src.push_back({ids[i], bases.back()->data(), nexts.back()->data(), n});
    dev_targets.push_back({ids[i], targets.back()->data(), n});
  }
  sync::delta_options opt;
  opt.bucket_bytes = bucket_bytes;
  sync::delta_stats cs, gs;
  const auto cpu = sync::encode_delta(3, 4, host_src, opt, &cs);
  const auto dev = gpu::encode_delta_gpu(3, 4, dev_src, opt, &gs, &ws);
  REQUIRE(dev.size() == cpu.size());
  for (size_t b = 0; b < cpu.size(); ++b) {
    INFO("bucket " << b << " of " << cpu.size());
    REQUIRE(dev[b] == cpu[b]);
  }
  CHECK(gs.changed == cs.changed);
  CHECK(gs.encoded_bytes == cs.encoded_bytes);
  CHECK(gs.dense_segments == cs.dense_segments);
  CHECK(gs.entries == cs.entries);
  for (const auto& b : cpu) {
    const auto err = gpu::apply_delta_bucket_gpu(b.data(), b.size(), 3, 4, dev_targets, &ws);
    INFO((err ? *err : std::string{}));
    REQUIRE_FALSE(err);
  }
  for (size_t i = 0; i < ts.size(); ++i)
    REQUIRE(targets[i]->download() == ts[i].next);
}

} // namespace

TEST_CASE("GPU buckets equal the CPU codec's across sizes and change fractions", "[gpu]") {
  sorl::gpu::test::skip_unless_cuda_devices(1, "the GPU codec test");
  gpu::delta_gpu_workspace ws;
  const uint64_t seg = sync::delta_segment_elements;
  uint64_t seed = 100;
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{12345}, 3 * seg + 777}) {
    for (double f : {0.0, 1e-4, 1e-2, 0.5, 1.0}) {
      INFO("elements " << n << ", fraction " << f);
      check_gpu({make_delta(n, f, step_mix::ulp, seed++)}, {1}, 64ull << 20, 0, ws);
    }
  }
}

TEST_CASE("GPU buckets handle minus-first, dense and misaligned tensors", "[gpu]") {
  sorl::gpu::test::skip_unless_cuda_devices(1, "the GPU codec test");
  gpu::delta_gpu_workspace ws;
  const uint64_t n = sync::delta_segment_elements + 4099;
  check_gpu({make_delta(n, 0.02, step_mix::minus, 1)}, {0}, 64ull << 20, 0, ws);
  check_gpu({make_delta(n, 1.0, step_mix::random, 2)}, {0}, 64ull << 20, 0, ws);
  check_gpu({make_delta(n, 0.01, step_mix::ulp, 3)}, {0}, 64ull << 20, 3, ws);
}

TEST_CASE("GPU buckets cut entries at small bucket sizes as the CPU codec does", "[gpu]") {
  sorl::gpu::test::skip_unless_cuda_devices(1, "the GPU codec test");
  gpu::delta_gpu_workspace ws;
  std::vector<tensor_pair> ts;
  ts.push_back(make_delta(5000, 0.01, step_mix::ulp, 21));
  ts.push_back(make_delta(1, 1.0, step_mix::ulp, 22));
  ts.push_back(make_delta(sync::delta_segment_elements + 3, 0.002, step_mix::ulp, 23));
  ts.push_back(make_delta(40000, 0.5, step_mix::random, 24));
  ts.push_back(make_delta(0, 0.0, step_mix::ulp, 25));
  ts.push_back(make_delta(70001, 0.05, step_mix::minus, 26));
  const std::vector<uint32_t> ids = {9, 2, 5, 40, 1, 17};
  for (uint64_t bucket : {uint64_t{256}, uint64_t{4096}, uint64_t{1} << 20}) {
    INFO("bucket_bytes " << bucket);
    check_gpu(ts, ids, bucket, 0, ws);
  }
}

TEST_CASE("GPU apply rejects a bucket for another version and writes nothing", "[gpu]") {
  sorl::gpu::test::skip_unless_cuda_devices(1, "the GPU codec test");
  const auto t = make_delta(3000, 0.1, step_mix::ulp, 31);
  const std::vector<sync::delta_source> src = {{0, t.base.data(), t.next.data(), 3000}};
  const auto buckets = sync::encode_delta(1, 2, src, sync::delta_options{});
  device_array target(t.base, 0);
  const std::vector<sync::delta_target> targets = {{0, target.data(), 3000}};
  CHECK(gpu::apply_delta_bucket_gpu(buckets[0].data(), buckets[0].size(), 1, 3, targets));
  CHECK(target.download() == t.base);
}
