#pragma once

// Which CPU kernels the numeric libraries use, and pinning them so that a run's numbers (the
// warm start's held-out accuracy included) do not depend on the machine.
//
// libtorch picks its vector kernels (AVX2 or AVX-512), oneDNN its JIT code and OpenBLAS its
// GEMM kernels (Haswell, SkylakeX, Zen, ...) per CPU, and Debian's BLAS alternative may be
// OpenBLAS or the reference BLAS: each choice rounds differently, and a thousand training
// steps turn the last bits into a different model. The same kernels give the same weights,
// at a price in speed on CPUs with AVX-512: sorl pins them only for `[run] kernels =
// "portable"` (runtime/config.hpp), and leaves each library its own choice by default.

#include <string>

namespace sorl {

/// The BLAS library file this process has mapped (the file behind libblas.so.3, e.g.
/// /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3), or "" when none is loaded.
std::string loaded_blas();

/// Where Debian's libopenblas0-pthread puts its libblas.so.3.
inline constexpr const char* openblas_dir = "/usr/lib/x86_64-linux-gnu/openblas-pthread";

/// On an x86-64 CPU with AVX2 and FMA, caps libtorch's vector kernels (ATEN_CPU_CAPABILITY)
/// and oneDNN (ONEDNN_MAX_CPU_ISA) at AVX2, and uses OpenBLAS's pthread build with its
/// Haswell kernels whatever BLAS the system's alternative or the executable's RPATH names.
/// ATen and oneDNN read their cap on first use; the BLAS is chosen and initialised when the
/// process is loaded, so the process starts itself again (execv of /proc/self/exe with
/// `argv`, at most once, about a second of library loading) with OPENBLAS_CORETYPE set and
/// the pthread build's libblas.so.3 in LD_PRELOAD (taken out again after the restart, so
/// child processes get the caller's LD_PRELOAD). A variable the user set is kept;
/// with SORL_NATIVE_KERNELS set nothing is changed (every library's own, fastest choice).
/// Returns when nothing (more) needs a restart, or when the restart failed.
void pin_cpu_kernels(char** argv);

/// One line for the log: "BLAS FILE (OpenBLAS core Haswell), ATen avx2, oneDNN AVX2", with
/// "native" for a library left to choose by itself.
std::string cpu_kernels_summary();

} // namespace sorl
