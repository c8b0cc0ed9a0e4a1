#!/usr/bin/env bash
# Decode throughput of sorl vs two baselines, and logits parity, in one command:
#   bench/decode.sh [decode_bench options, e.g. --quick, --repeats 5, --threads 2 --batches 1,8,64]
# Builds decode_bench in $BUILD_DIR (default: build/, configured ML-only if it does not exist)
# and runs it: sorl's generator and a libtorch C++ decode loop with a preallocated KV cache
# (bench/decode_parity.hpp), alternating, --repeats times per configuration (default 5;
# --quick: tiny preset, batches 1 and 8, 3 repeats). Then bench/decode_reference.py, with
# Debian's /usr/bin/python3 (python3-torch), checks logits parity of sorl's full and cached
# paths against its own eager model (PASS/FAIL; exit 1 on FAIL), runs the same configurations
# through its eager loop as many times, and prints one table: median (min-max) tokens/s of
# each and the ratios of the medians.
# Needs python3-torch and python3-numpy (`scripts/install-deps --with-extras`); says so and
# exits 2 before building anything when they are missing.
# The run's record (bench/record.hpp: the table above) goes to --record PATH, else
# $SORL_BENCH_RECORD, else runs/bench/decode-UTC.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=bench/decode.sh
source "$root/scripts/lib/need.sh"
need_python_modules /usr/bin/python3 torch:python3-torch numpy:python3-numpy
build=${BUILD_DIR:-$root/build}
build_target "$build" decode_bench -DSORL_ONLY_ML=ON -DSORL_BUILD_TESTS=OFF
# The thread count applies to OpenBLAS too (libtorch's at::linear and F.linear call it, and
# it starts its own threads, one per core, unless told), so that no implementation gets more
# cores than --threads says.
threads=2
record=${SORL_BENCH_RECORD:-runs/bench/decode-$(date -u +%Y%m%dT%H%M%SZ).json}
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  if [[ ${args[i]} == --threads && $((i + 1)) -lt ${#args[@]} ]]; then threads=${args[i + 1]}; fi
  if [[ ${args[i]} == --record && $((i + 1)) -lt ${#args[@]} ]]; then record=${args[i + 1]}; fi
done
source "$root/bench/record.sh"
record_command "$me" "$@"
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/bench/decode_bench" --json "$tmp/sorl.jsonl" --dump "$tmp" "$@" --record "$record"
/usr/bin/python3 "$root/bench/decode_reference.py" --sorl "$tmp/sorl.jsonl" --parity "$tmp" --record "$record"
