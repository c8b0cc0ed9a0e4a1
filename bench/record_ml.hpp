#pragma once

// The numeric libraries of a bench that links libtorch, for its record (bench/record.hpp).
// Apart from record.hpp so that the benches without libtorch (sagc_sim, war_bench) do not
// link it for their records.

#include "bench/record.hpp"

namespace sorl::bench {

/// libtorch's version (TORCH_VERSION of the headers built against), the BLAS file mapped into
/// this process (sorl::loaded_blas) and the CPU-kernels line (sorl::cpu_kernels_summary), read
/// now: call it after the bench's libraries are loaded and its kernels chosen.
record_runtime ml_record_runtime();

} // namespace sorl::bench
