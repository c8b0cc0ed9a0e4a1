#include "runtime/ml/policy/device.hpp"

#include <cctype>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/cuda.h>

namespace sorl::ml {

bool cuda_available() {
  return torch::cuda::is_available();
}

c10::Device device_from(const std::string& name, std::string_view key) {
  if (name == "cpu")
    return c10::kCPU;
  int index = 0;
  bool ok = name == "cuda";
  if (!ok && name.rfind("cuda:", 0) == 0 && name.size() > 5 && name.size() <= 8) {
    ok = true;
    for (size_t i = 5; i < name.size(); ++i)
      ok = ok && std::isdigit(static_cast<unsigned char>(name[i]));
    if (ok)
      index = std::stoi(name.substr(5));
  }
  if (!ok)
    throw std::invalid_argument(
      fmt::format("{} = \"{}\": expected \"cpu\", \"cuda\" or \"cuda:N\"", key, name));
  if (!torch::cuda::is_available())
    throw std::invalid_argument(fmt::format(
      "{} = \"{}\": this sorl is built against a libtorch without CUDA, or no CUDA device is "
      "visible (Debian's libtorch is CPU-only; scripts/build-torch2 builds against a CUDA one)",
      key, name));
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (index >= count)
    throw std::invalid_argument(fmt::format("{} = \"{}\": only {} CUDA device{} visible", key,
                                            name, count, count == 1 ? " is" : "s are"));
  return {c10::kCUDA, static_cast<c10::DeviceIndex>(index)};
}

std::string describe(c10::Device device) {
  if (device.is_cpu())
    return "cpu";
  return fmt::format("{} of {} visible", device.str(), torch::cuda::device_count());
}

} // namespace sorl::ml
