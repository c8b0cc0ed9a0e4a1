#!/usr/bin/env bash
# Cache-aware placement of a step's rollouts across rollout workers, per scheduler policy, in
# one command (ARCHITECTURE.md §6 WAR, cache-aware scheduling; the figures are explained in
# bench/war/route_bench.cpp):
#
#   bench/war/route.sh [--repeats R] [--record PATH]
#
# Three traces of SGLang's generated-shared-prefix workload over 2 workers (one core each),
# each with round_robin, least_loaded, sorl's cache_aware and SGLang's cache_aware rule:
#   uniform  128 groups x 4 over 16 families, 384-token prefixes (configs/default.toml's model)
#   long     the same with 1024-token prefixes (configs/agent.toml's 2k-context model)
#   skewed   512 groups x 4 over 32 families, popularity 1 / rank^1.5 (the high-load case)
# The weights are a fresh init: placement and prefill do not depend on what the model learned,
# and every policy decodes the same tokens. About 6 minutes with --repeats 3 (default).
# The run's record (bench/record.hpp: tables "uniform", "long", "skewed") goes to --record PATH,
# else $SORL_BENCH_RECORD, else runs/bench/.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/record.sh
record_command bench/war/route.sh "$@"
repeats=3
record=${SORL_BENCH_RECORD:-runs/bench/route-$(date -u +%Y%m%dT%H%M%SZ).json}
while [[ $# -gt 0 ]]; do
  case $1 in
    --repeats) repeats=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    *) echo "route.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
bench=build/bench/war/route_bench
[[ -x $bench ]] || { echo "route.sh: $bench not built (run scripts/build)" >&2; exit 1; }
out=runs/route-bench
mkdir -p "$out"
echo "== uniform"
$bench configs/default.toml --groups 128 --repeats "$repeats" --json "$out/uniform.json" \
  --record "$out/uniform.record.json"
echo "== long"
$bench configs/agent.toml --groups 128 --prefix-tokens 1024 --question-tokens 32 --repeats "$repeats" \
  --json "$out/long.json" --record "$out/long.record.json"
echo "== skewed"
$bench configs/default.toml --groups 512 --families 32 --zipf 1.5 --repeats "$repeats" --json "$out/skewed.json" \
  --record "$out/skewed.record.json"
if [[ $record != none ]]; then
  python3 bench/record.py merge "$record" "$out/uniform.record.json:placement=uniform" \
    "$out/long.record.json:placement=long" "$out/skewed.record.json:placement=skewed"
fi
echo "results under $out/"
