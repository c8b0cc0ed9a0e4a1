#pragma once

// Which libtorch device a role computes on ([run] device, [rollout] device in the config;
// ARCHITECTURE.md §8). The config parser checks the spelling without libtorch
// (runtime/config.cpp); this is where the name meets the libtorch this binary links, which
// may have no CUDA at all (Debian's libtorch 1.13) or see fewer devices than the name asks for.

#include <string>
#include <string_view>

#include <c10/core/Device.h>

namespace sorl::ml {

/// The device named `name`: "cpu", "cuda" (CUDA device 0) or "cuda:N". Raises
/// std::invalid_argument naming `key` when the name is none of these, when this libtorch has
/// no CUDA or sees no device (a build against Debian's CPU-only libtorch: scripts/build-torch2
/// builds against a CUDA one), or when N is not below the number of visible devices.
c10::Device device_from(const std::string& name, std::string_view key = "run.device");

/// True when this libtorch was built with CUDA and sees at least one device.
bool cuda_available();

/// For logs: "cpu", or "cuda:0 of 2 visible".
std::string describe(c10::Device device);

} // namespace sorl::ml
