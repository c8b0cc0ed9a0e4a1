#include "runtime/ml/policy/cpu_kernels.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace sorl {

std::string loaded_blas() {
  std::ifstream maps{"/proc/self/maps"};
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos)
      continue;
    auto path = line.substr(slash);
    auto name = std::filesystem::path{path}.filename().string();
    if (name.rfind("libblas.so", 0) == 0)
      return path;
  }
  return "";
}

void pin_cpu_kernels(char** argv) {
#if defined(__x86_64__)
  if (std::getenv("SORL_KERNELS_PINNED") != nullptr) {
    // Restarted: the BLAS preloaded below is mapped now; children (scorers, nodes) get the
    // caller's LD_PRELOAD back.
    if (const char* before = std::getenv("SORL_LD_PRELOAD_BEFORE")) {
      if (*before != '\0')
        setenv("LD_PRELOAD", before, 1);
      else
        unsetenv("LD_PRELOAD");
      unsetenv("SORL_LD_PRELOAD_BEFORE");
    }
    return;
  }
  if (std::getenv("SORL_NATIVE_KERNELS") != nullptr || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return;
  setenv("ATEN_CPU_CAPABILITY", "avx2", 0);
  setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 0);
  bool restart = false;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    restart = true;
  }
  // The pinned bits are those of OpenBLAS's pthread build: the OpenMP build the executables'
  // RPATH names (cmake/CpuRuntime.cmake) rounds differently, and an RPATH outranks
  // LD_LIBRARY_PATH, so the restart preloads the pthread build's libblas.so.3, which then
  // serves libtorch's lookup of that name.
  std::error_code ec;
  const auto pthread_blas = std::filesystem::path{openblas_dir} / "libblas.so.3";
  if (loaded_blas().rfind(openblas_dir, 0) != 0 && std::filesystem::exists(pthread_blas, ec)) {
    const char* old = std::getenv("LD_PRELOAD");
    setenv("SORL_LD_PRELOAD_BEFORE", old ? old : "", 1);
    auto value = pthread_blas.string() + (old && *old ? ":" + std::string{old} : "");
    setenv("LD_PRELOAD", value.c_str(), 1);
    restart = true;
  }
  if (restart) {
    setenv("SORL_KERNELS_PINNED", "1", 1); // one restart at most, whatever it finds
    execv("/proc/self/exe", argv);         // returns only on failure: run on as loaded
  }
#else
  (void)argv;
#endif
}

std::string cpu_kernels_summary() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string{v && *v ? v : "native"};
  };
  auto blas = loaded_blas();
  auto kind = blas.find("openblas") != std::string::npos
                ? fmt::format(" (OpenBLAS core {})", env("OPENBLAS_CORETYPE"))
                : std::string{};
  return fmt::format("BLAS {}{}, ATen {}, oneDNN {}", blas.empty() ? "none loaded" : blas, kind,
                     env("ATEN_CPU_CAPABILITY"), env("ONEDNN_MAX_CPU_ISA"));
}

} // namespace sorl
