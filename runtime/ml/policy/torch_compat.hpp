#pragma once

// The differences between the libtorch versions sorl builds against, in one place: Debian's
// libtorch 1.13 (CPU, the default build) and a PyPI torch 2.x wheel (CUDA;
// scripts/build-torch2, ARCHITECTURE.md §8). Code that uses one of the names below includes
// this header rather than spelling a version test of its own.

#include <ATen/ATen.h>
// at::NoGradGuard: 1.13's ATen.h includes it, 2.x's no longer does.
#include <ATen/core/grad_mode.h>
