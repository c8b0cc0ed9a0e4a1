#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include <torch/cuda.h>

#include "runtime/ml/policy/device.hpp"

using sorl::ml::device_from;

TEST_CASE("device_from: cpu always, malformed names never, naming the key") {
  CHECK(device_from("cpu") == c10::Device(c10::kCPU));
  CHECK(sorl::ml::describe(c10::kCPU) == "cpu");
  for (const char* name : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1234", "CPU", ""}) {
    INFO(name);
    CHECK_THROWS_WITH(device_from(name, "rollout.device"),
                      "rollout.device = \"" + std::string{name}
                        + "\": expected \"cpu\", \"cuda\" or \"cuda:N\"");
  }
}

TEST_CASE("device_from: a CUDA device is refused without CUDA, and bounded by the visible count with it") {
  CHECK(sorl::ml::cuda_available() == torch::cuda::is_available());
  if (!sorl::ml::cuda_available()) {
    for (const char* name : {"cuda", "cuda:0", "cuda:3"}) {
      INFO(name);
      CHECK_THROWS_WITH(device_from(name),
                        Catch::StartsWith("run.device = \"" + std::string{name}
                                          + "\": this sorl is built against a libtorch without CUDA")
                          && Catch::Contains("scripts/build-torch2"));
    }
    return;
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  CHECK(device_from("cuda") == c10::Device(c10::kCUDA, 0));
  CHECK(device_from("cuda:" + std::to_string(count - 1)) == c10::Device(c10::kCUDA, count - 1));
  CHECK_THROWS_WITH(device_from("cuda:" + std::to_string(count)),
                    Catch::Contains(std::to_string(count) + " CUDA device"));
}
