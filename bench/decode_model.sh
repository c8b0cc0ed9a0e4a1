#!/usr/bin/env bash
# Decode throughput of a real model against this machine's limits, in one command:
#   bench/decode_model.sh MODEL_DIR [decode_model_bench options: --batches 1,8,32,64 --threads 2 ...]
# e.g. bench/decode_model.sh models/smollm2-135m-instruct (scripts/fetch-model smollm2-135m-instruct).
# Builds decode_model_bench in $BUILD_DIR (default build/) and runs it (bench/decode_model.cpp
# says what each column is). OpenBLAS and OpenMP get the same thread count as the bench, so
# that no implementation gets more cores than --threads says.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=bench/decode_model.sh
source "$root/scripts/lib/need.sh"
if [[ $# -lt 1 || $1 == -* ]]; then
  echo "usage: bench/decode_model.sh MODEL_DIR [--batches 1,8,32,64] [--threads 2] [--repeats 3] ..." >&2
  exit 2
fi
build=${BUILD_DIR:-$root/build}
build_target "$build" decode_model_bench -DSORL_ONLY_ML=ON -DSORL_BUILD_TESTS=OFF
threads=2
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  if [[ ${args[i]} == --threads && $((i + 1)) -lt ${#args[@]} ]]; then threads=${args[i + 1]}; fi
done
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
exec "$build/bench/decode_model_bench" "$@"
