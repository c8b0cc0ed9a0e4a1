#include "runtime/ml/cpu_kernels.hpp"

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
  if (std::getenv("SORL_NATIVE_KERNELS") != nullptr || std::getenv("SORL_KERNELS_PINNED") != nullptr
      || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return;
  setenv("ATEN_CPU_CAPABILITY", "avx2", 0);
  setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 0);
  bool restart = false;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    restart = true;
  }
  std::error_code ec;
  if (loaded_blas().find("openblas") == std::string::npos
      && std::filesystem::exists(std::filesystem::path{openblas_dir} / "libblas.so.3", ec)) {
    const char* old = std::getenv("LD_LIBRARY_PATH");
    auto value = std::string{openblas_dir} + (old && *old ? ":" + std::string{old} : "");
    setenv("LD_LIBRARY_PATH", value.c_str(), 1);
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
