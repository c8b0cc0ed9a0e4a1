// broadcast_buckets_nccl (gpu/nccl_broadcast.hpp): every rank other than the root receives
// the root's buckets bit for bit, in index order, whatever their sizes; the root gets nothing
// back. Label "gpu". NCCL refuses two ranks on one device, so the two-rank cases need two
// CUDA devices (rank i on device i, one thread per rank, as the publisher and each worker
// would call it from the actor that owns its device); the one-rank case needs one. Without
// them a case is reported skipped (tests/gpu/gpu_skip.hpp).

#include "gpu/check.hpp"
#include "gpu/nccl_broadcast.hpp"
#include "gpu/nccl_check.hpp"
#include "runtime/sync/delta_codec.hpp"
#include "tests/gpu/delta_test_data.hpp"
#include "tests/gpu/gpu_skip.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <exception>
#include <numeric>
#include <thread>
#include <vector>

using namespace sorl;
using sorl::gpu::test::make_delta;
using sorl::gpu::test::skip_unless_cuda_devices;
using sorl::gpu::test::step_mix;

namespace {

using bucket_list = std::vector<std::vector<uint8_t>>;

/// The buckets of a real version, cut small so that there are many of different sizes, plus
/// buckets of 1, 3 and 4099 bytes so that the payloads sit at unaligned offsets of the
/// staging buffer.
bucket_list version_buckets() {
  const auto t = make_delta(70001, 0.05, step_mix::ulp, 7);
  const std::vector<sync::delta_source> src = {{0, t.base.data(), t.next.data(), 70001}};
  bucket_list b = sync::encode_delta(1, 2, src, sync::delta_options{4096});
  REQUIRE(b.size() > 3);
  b.insert(b.begin() + 1, std::vector<uint8_t>{0xA5});
  b.push_back({1, 2, 3});
  std::vector<uint8_t> odd(4099);
  std::iota(odd.begin(), odd.end(), uint8_t{0});
  b.push_back(std::move(odd));
  return b;
}

/// Runs broadcast_buckets_nccl on `ranks` ranks (rank i on device i, one thread each) with
/// root `root` sending `buckets`; the other ranks pass `decoy`, which they must ignore.
/// Returns what each rank's call returned; rethrows a rank's exception.
std::vector<bucket_list> broadcast(int ranks, int root, const bucket_list& buckets,
                                   const bucket_list& decoy) {
  std::vector<int> devices(static_cast<size_t>(ranks));
  std::iota(devices.begin(), devices.end(), 0);
  std::vector<ncclComm_t> comms(static_cast<size_t>(ranks));
  SORL_NCCL_CHECK(ncclCommInitAll(comms.data(), ranks, devices.data()));
  std::vector<bucket_list> got(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      try {
        SORL_CUDA_CHECK(cudaSetDevice(r));
        cudaStream_t stream = nullptr;
        SORL_CUDA_CHECK(cudaStreamCreate(&stream));
        got[i] = gpu::broadcast_buckets_nccl(comms[i], root, r == root ? buckets : decoy,
                                             stream);
        SORL_CUDA_CHECK(cudaStreamDestroy(stream));
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto c : comms)
    ncclCommDestroy(c);
  for (const auto& e : errors)
    if (e)
      std::rethrow_exception(e);
  return got;
}

} // namespace

TEST_CASE("every other rank receives the root's buckets bit for bit", "[gpu][nccl]") {
  skip_unless_cuda_devices(2, "the two-rank NCCL broadcast test");
  const bucket_list buckets = version_buckets();
  const bucket_list decoy = {{9, 9, 9}};
  for (int root : {0, 1}) {
    INFO("root " << root);
    const auto got = broadcast(2, root, buckets, decoy);
    CHECK(got[static_cast<size_t>(root)].empty()); // the root keeps its own buckets
    const auto& received = got[static_cast<size_t>(1 - root)];
    REQUIRE(received.size() == buckets.size());
    for (size_t i = 0; i < buckets.size(); ++i) {
      INFO("bucket " << i << " of " << buckets.size());
      CHECK(received[i] == buckets[i]);
    }
  }
}

TEST_CASE("a version without buckets reaches every rank as none", "[gpu][nccl]") {
  skip_unless_cuda_devices(2, "the two-rank NCCL broadcast test");
  const auto got = broadcast(2, 0, {}, {{9, 9, 9}});
  CHECK(got[0].empty());
  CHECK(got[1].empty());
}

TEST_CASE("a single rank broadcasts to nobody and returns nothing", "[gpu][nccl]") {
  skip_unless_cuda_devices(1, "the one-rank NCCL broadcast test");
  const auto got = broadcast(1, 0, version_buckets(), {});
  REQUIRE(got.size() == 1);
  CHECK(got[0].empty());
}
