#!/usr/bin/env bash
# Both halves of WAR over load levels, in one table (ARCHITECTURE.md §6 WAR): the agentic
# workload of configs/agent.toml (multi-turn file_search episodes from its warm start) at a
# growing number of groups submitted at once, over 2 rollout workers (one core each), with
# four arms on the same episodes at each level (bench/war/route_bench.cpp --task config):
#   round_robin          neither half (the baseline)
#   round_robin+on       speculation alone (suffix-tree drafts of up to draft_max_tokens)
#   cache_aware          cache-aware scheduling alone
#   cache_aware+auto     both, with speculation switched per batch size by measurement
#
#   bench/war/load.sh [--config configs/agent.toml] [--loads "1x2 1x8 4x8 32x8"] [--repeats 5]
#                     [--cache-imbalance R] [--arms LIST] [--out DIR] [--record PATH]
#
# --arms replaces the four arms (comma-separated, round_robin first; route_bench's POLICY+MODE
# names, e.g. adding least_loaded and sglang_cache_aware); --out is where the JSON goes
# (default runs/war-load).
#
# A load NxG is N groups of G rollouts submitted at once (N alone: the config's group size, 8
# for the agent), from 2 rollouts (one per worker under round robin) to 256 (128 per worker).
# Before each timed step every worker runs 32 untimed rollouts of other episodes and changes
# weight version, as between two training steps (route_bench --warm): its global suffix tree
# holds earlier responses and `auto` has measured its arms, while no KV survives. Every arm
# decodes the same tokens (a rollout's tokens depend on its prompt, seed and stream only). Needs build/bench/war/route_bench (scripts/build) and the
# config's model: for configs/agent.toml its warm start (about 18 minutes of
# `build/sorl sft configs/agent.toml`). About 10 minutes with the defaults on 2 cores. The run's
# record (bench/record.py: route_bench's table per load, "load-NxG") goes to --record PATH,
# else $SORL_BENCH_RECORD, else runs/bench/war-load-UTC.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/record.sh
record_command bench/war/load.sh "$@"
record=${SORL_BENCH_RECORD:-runs/bench/war-load-$(date -u +%Y%m%dT%H%M%SZ).json}
config=configs/agent.toml
loads="1x2 1x8 4x8 32x8"
repeats=5
extra=()
arms=round_robin,round_robin+on,cache_aware,cache_aware+auto
out=runs/war-load
while [[ $# -gt 0 ]]; do
  case $1 in
    --config) config=$2; shift 2 ;;
    --loads) loads=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --cache-imbalance) extra=(--cache-imbalance "$2"); shift 2 ;;
    --arms) arms=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    *) echo "load.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
bench=build/bench/war/route_bench
[[ -x $bench ]] || { echo "load.sh: $bench not built (run scripts/build)" >&2; exit 1; }
mkdir -p "$out"
parts=()
for g in $loads; do
  [[ $g =~ ^([0-9]+)(x([0-9]+))?$ ]] || { echo "load.sh: load $g is not N or NxG" >&2; exit 2; }
  size=()
  [[ -n ${BASH_REMATCH[3]} ]] && size=(--group-size "${BASH_REMATCH[3]}")
  echo "== $g" >&2
  $bench "$config" --task config --groups "${BASH_REMATCH[1]}" "${size[@]}" --repeats "$repeats" \
    "${extra[@]}" --policies "$arms" --json "$out/load-$g.json" --record "$out/load-$g.record.json"
  parts+=("$out/load-$g.record.json:placement=load-$g")
done
python3 - "$out" "$arms" $loads <<'EOF'
import json, statistics, sys
out, arms, loads = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
med = statistics.median
print("| groups x G submitted at once | " + " | ".join(arms) + " | best |")
print("|---" * (len(arms) + 2) + "|")
tables = {}
for g in loads:
    rows = {r["policy"]: r for r in json.load(open(f"{out}/load-{g}.json"))["rows"]}
    tables[g] = rows
    cells, best = [], max(arms, key=lambda a: med(rows[a]["tokens_per_s"]))
    for a in arms:
        r = rows[a]
        cell = f"{med(r['tokens_per_s']):.0f} ({med(r['speedup']):.2f}x"
        if "+" in a and not a.endswith("+off"):
            cell += f", acc {med(r['acceptance']):.2f}"
        cell += f", hit {med(r['hit_rate']):.2f}"
        cells.append(cell + ")")
    print(f"| {g} | " + " | ".join(cells) + f" | {best} |")
print(f"tokens/s (speed-up over round_robin; draft acceptance; prefix hit rate), medians of the rounds; "
      f"JSON under {out}/")
print()
print("| groups x G | " + " | ".join(arms) + " |")
print("|---" * (len(arms) + 1) + "|")
for g in loads:
    rows = tables[g]
    cells = [f"{rows[a]['prefill_tokens']:,} / {med(rows[a]['p99_s']):.2f} s / "
             + "-".join(str(n) for n in rows[a]["rollouts_per_worker"]) for a in arms]
    print(f"| {g} | " + " | ".join(cells) + " |")
print("prefill tokens computed (last round) / p99 rollout latency (median) / rollouts per worker")
EOF
if [[ $record != none ]]; then
  python3 bench/record.py merge "$record" "${parts[@]}"
fi
