#include "bench/record_ml.hpp"

#include "runtime/ml/policy/cpu_kernels.hpp"

#include <torch/version.h>

namespace sorl::bench {

record_runtime ml_record_runtime() {
  record_runtime r;
  r.libtorch = TORCH_VERSION;
  r.blas = loaded_blas();
  r.cpu_kernels = cpu_kernels_summary();
  return r;
}

} // namespace sorl::bench
