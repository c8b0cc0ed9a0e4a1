#!/usr/bin/env bash
# Decode throughput, sorl vs an eager PyTorch loop, in one command:
#   bench/decode.sh [decode_bench options, e.g. --threads 2 --batches 1,8,64]
# Builds decode_bench in $BUILD_DIR (default: build/, configured ML-only if it does not exist),
# runs it, then runs bench/decode_reference.py with Debian's /usr/bin/python3 (python3-torch)
# on the same configurations, and prints one table with the ratio, plus a logits parity line.
# Needs python3-torch and python3-numpy (`scripts/install-deps --with-extras`); says so and
# exits 2 before building anything when they are missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=bench/decode.sh
source "$root/scripts/lib/need.sh"
need_python_modules /usr/bin/python3 torch:python3-torch numpy:python3-numpy
build=${BUILD_DIR:-$root/build}
build_target "$build" decode_bench -DSORL_ONLY_ML=ON -DSORL_BUILD_TESTS=OFF
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/bench/decode_bench" --json "$tmp/sorl.jsonl" --dump "$tmp" "$@"
/usr/bin/python3 "$root/bench/decode_reference.py" --sorl "$tmp/sorl.jsonl" --parity "$tmp"
