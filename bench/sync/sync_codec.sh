#!/usr/bin/env bash
# The SparseRL-Sync codec bench in one command:
#   bench/sync/sync_codec.sh [--quick] [--report-only] [--threads T] [--synthetic-elements N]
#                            [--warmup W] [--steps S] [--presets tiny,50m | none]
# Builds sync_codec_bench in $BUILD_DIR (default: build/, configured without tests and CUDA if
# it does not exist yet) and prints two tables over consecutive weight versions of sorl's
# learner (tiny and 50m presets, AdamW lr 1e-6, 1e-5 and the shipped configs' 2e-4) and a
# synthetic bf16 tensor (default 2^30 elements, 2 GiB per copy; about 7 GiB of memory in all)
# at 0.1 %, 1 % and 5 % changed:
#   bytes: dense / naive / ours / zstd -3 and lz4 of the step stream the codec codes, of the
#          XOR of old and new bits, and (zstd) of the new bits alone;
#   speed: the changed-element scan, encode and memcpy on one thread and on T threads (default:
#          all hardware threads) side by side, check / apply with and without the check.
# Then it checks the targets on the synthetic 1 % row (dense/ours >= 150x; encode >= 50 % of
# memcpy on one thread and on T threads), printing PASS or FAIL for each.
# Exit: 0 all targets met; 3 a target missed (0 with --report-only); 1 a round trip not bit
# for bit; 2 bad arguments. --quick: tiny preset and 2^24 synthetic elements, under a minute on
# an idle machine. Timings on a loaded machine are low and noisy (the bench says so when the
# load average exceeds the hardware threads): compare only rows of one run.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
me=bench/sync/sync_codec.sh
source "$root/scripts/lib/need.sh"
build=${BUILD_DIR:-$root/build}
build_target "$build" sync_codec_bench -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSORL_BUILD_TESTS=OFF \
  -DSORL_WITH_CUDA=OFF
# The run's record (--record PATH, else $SORL_BENCH_RECORD, else runs/bench/) names this command.
source "$root/bench/record.sh"
record_command "$me" "$@"
exec "$build/bench/sync/sync_codec_bench" "$@"
