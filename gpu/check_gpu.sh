#!/usr/bin/env bash
# GPU check of the sparse weight-sync kernels on an H100/H200 (sm_90): builds gpu/ with CUDA,
# runs the gpu-labelled tests (real kernels against the CPU codec, byte for byte; the NCCL
# broadcast when NCCL is found, whose two-rank cases need two devices and are reported
# skipped on one) and
# gpu_sync_bench (1e9-element bf16 tensor at 0.1 %, 1 %, 5 % changed: bit-exactness, encode and
# apply GB/s next to a device-to-device cudaMemcpy). Everything goes to stdout. About 2 to 4
# minutes on a 16-core H200 machine.
#
#   gpu/check_gpu.sh            build (CMake when the project's dependencies are installed, else
#                               a standalone nvcc build) and run
#   gpu/check_gpu.sh prepare    on a machine with the project's dependencies: copy the few
#                               headers the standalone build needs (fmt, Catch2, xxHash) into
#                               build-gpu/deps, for a GPU machine that lacks them (carry that
#                               folder along)
#
# Environment: BUILD (default build-gpu), ELEMENTS (default 1000000000), REPEATS (default 3),
# STANDALONE=1 skips the CMake attempt.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
ELEMENTS=${ELEMENTS:-1000000000}
REPEATS=${REPEATS:-3}
JOBS=$(nproc)

if [[ "${1:-}" == prepare ]]; then
  mkdir -p "$BUILD/deps"
  cp -r /usr/include/fmt /usr/include/catch2 /usr/include/xxhash.h "$BUILD/deps/"
  echo "check_gpu: headers copied to $BUILD/deps"
  exit 0
fi

export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nvcc --version | tail -1

standalone() {
  # The project's CMake needs CAF, Cap'n Proto, libtorch...; the codec needs only fmt (used
  # header-only here), xxHash and Catch2 for the test.
  local deps="$BUILD/deps" out="$BUILD/standalone"
  if [[ ! -f "$deps/xxhash.h" ]]; then
    echo "check_gpu: no $deps; run 'gpu/check_gpu.sh prepare' where the headers exist" >&2
    exit 2
  fi
  mkdir -p "$out"
  local flags=(-std=c++17 -O2 -arch=sm_90 -DFMT_HEADER_ONLY -I. -isystem "$deps"
               -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
  local units=(runtime/sync/delta_scan.cpp runtime/sync/delta_codes.cpp
               runtime/sync/delta_buckets.cpp runtime/sync/delta_pipeline.cpp
               gpu/delta_framing.cpp gpu/delta_twin.cpp
               gpu/sparse_sync.cu tests/catch_main.cpp tests/gpu/gpu_sync_test.cpp
               tests/gpu/gpu_twin_test.cpp gpu/gpu_sync_bench.cu)
  local pids=()
  for u in "${units[@]}"; do
    nvcc "${flags[@]}" -c "$u" -o "$out/$(basename "$u").o" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  local lib=("$out/delta_scan.cpp.o" "$out/delta_codes.cpp.o" "$out/delta_buckets.cpp.o"
             "$out/delta_pipeline.cpp.o" "$out/delta_framing.cpp.o" "$out/delta_twin.cpp.o"
             "$out/sparse_sync.cu.o")
  nvcc -arch=sm_90 -o "$out/gpu_sync_test" "$out/gpu_sync_test.cpp.o" "$out/catch_main.cpp.o" "${lib[@]}"
  nvcc -arch=sm_90 -o "$out/gpu_twin_test" "$out/gpu_twin_test.cpp.o" "$out/catch_main.cpp.o" "${lib[@]}"
  nvcc -arch=sm_90 -o "$out/gpu_sync_bench" "$out/gpu_sync_bench.cu.o" "${lib[@]}"
  echo "== gpu_sync_test"
  "$out/gpu_sync_test"
  echo "== gpu_twin_test"
  "$out/gpu_twin_test"
  echo "== gpu_sync_bench"
  "$out/gpu_sync_bench" "$ELEMENTS" "$REPEATS"
}

mkdir -p "$BUILD"
if [[ "${STANDALONE:-0}" != 1 ]] &&
   cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DSORL_CUDA_ARCHITECTURES=90 >"$BUILD/configure.log" 2>&1 &&
   grep -q sorl_gpu_sync "$BUILD/build.ninja"; then
  targets=(gpu_twin_test gpu_sync_test gpu_sync_bench)
  # The NCCL broadcast test exists only when CMake found NCCL.
  if ninja -C "$BUILD" -t targets all | grep -q '^nccl_broadcast_test:'; then
    targets+=(nccl_broadcast_test)
  fi
  ninja -C "$BUILD" -j "$JOBS" "${targets[@]}"
  echo "== ctest -L gpu"
  (cd "$BUILD" && ctest -L gpu --output-on-failure)
  echo "== gpu_sync_bench"
  "$BUILD/gpu/gpu_sync_bench" "$ELEMENTS" "$REPEATS"
else
  echo "check_gpu: CMake configure failed or found no CUDA (see $BUILD/configure.log);" \
       "standalone nvcc build"
  standalone
fi
