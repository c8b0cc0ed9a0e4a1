#!/usr/bin/env bash
# Group-size policies (static G for every G in [g_min, g_max], deadline, sagc) on a simulated
# cluster, in one command:
#   bench/sagc/sagc_sim.sh [--trace FILE] [--steps N] [--seed S] [other sagc_sim options]
# Builds sagc_sim in $BUILD_DIR (default: build/, configured without tests and CUDA if it does
# not exist yet), runs it, and prints one table per scenario: a long-tailed one (or the trace
# given, durations in seconds one per line), a light-tailed one, and a drifting-tail one (the
# long-rollout probability grows from 0 to --drift-tail, default 0.5%, over the run; per-phase
# rates for sagc and the best static G), each followed by sagc against every static G and the
# deadline on the objective (U-roll/s and rollouts/s) and the straggler-event rate, with three
# static G marked: L, the largest meeting epsilon; C, the most U-roll/s among those meeting
# epsilon; O, the most U-roll/s of all. With the defaults O is G = 32 in every scenario: a
# static G that ignores the constraint beats sagc on the objective (docs/sagc.md says by how much
# and what the constraint buys). The model and the U-roll/s column (utility-weighted rollouts
# per second) are documented in actors/sagc/simulator.hpp. docs/sagc.md quotes the figures of a
# run with the defaults; bench/sagc/replay_agent.sh replays the multi-turn agent workload.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
me=bench/sagc/sagc_sim.sh
source "$root/scripts/lib/need.sh"
build=${BUILD_DIR:-$root/build}
build_target "$build" sagc_sim -DSORL_BUILD_TESTS=OFF -DSORL_WITH_CUDA=OFF
# The run's record (--record PATH, else $SORL_BENCH_RECORD, else runs/bench/) names this command.
source "$root/bench/record.sh"
record_command "$me" "$@"
exec "$build/bench/sagc/sagc_sim" "$@"
