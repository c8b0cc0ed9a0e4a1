#!/usr/bin/env bash
# The SparseRL-Sync codec bench in one command:
#   bench/sync/sync_codec.sh [--quick] [--synthetic-elements N] [--warmup W] [--steps S]
#                            [--presets tiny,50m]
# Builds sync_codec_bench in $BUILD_DIR (default: build/, configured without tests and CUDA if
# it does not exist yet) and prints one table: consecutive weight versions of sorl's learner
# (tiny and 50m presets, AdamW lr 1e-6 and 1e-5) and a synthetic bf16 tensor (default 2^30
# elements, 2 GiB per copy; about 7 GiB of memory in all) at 0.1 %, 1 % and 5 % changed;
# bytes of dense / naive / ours / zstd / lz4, encode speed (one thread and all hardware threads)
# and apply speed next to single-thread memcpy. Every round trip is verified bit for bit (exit 1
# otherwise). --quick: tiny preset and 2^24 synthetic elements, well under a minute.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
me=bench/sync/sync_codec.sh
source "$root/scripts/lib/need.sh"
build=${BUILD_DIR:-$root/build}
build_target "$build" sync_codec_bench -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSORL_BUILD_TESTS=OFF \
  -DSORL_WITH_CUDA=OFF
exec "$build/bench/sync/sync_codec_bench" "$@"
