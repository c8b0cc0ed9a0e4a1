#!/usr/bin/env bash
# Suffix speculative decoding on an experiment's workload, in one command (ARCHITECTURE.md §6
# WAR; the figures are explained in bench/war/war_bench.cpp):
#
#   bench/war/run.sh [--config FILE] [--groups N] [--group-size G] [--batches LIST]
#                    [--rollouts N] [--no-arctic] [--record PATH]
#
# 1. Records N groups of G rollouts (default 100 x 4) of the config's task and model
#    (default configs/agent.toml: the multi-turn file_search agent from its warm start) with
#    speculation off: one line per policy turn, under runs/war-bench/.
# 2. Replays those turns through sorl's suffix drafter and through ArcticInference's
#    (arctic-inference 0.3.0, installed into $SORL_ARCTIC_VENV, default .venv-arctic, on first
#    use; about 2 minutes to build), same protocol and settings (tree depth 32, drafts of up to
#    16 tokens, factor 1, probability floor 0.1): µs per draft call, acceptance, tokens per
#    decode step.
# 3. Times rollouts of the same workload with speculation off / on / auto at each batch size
#    (default 1,4,16,64), with the global tree warmed by earlier responses.
# Needs build/bench/war/war_bench (scripts/build) and the config's model: for the default
# configs/agent.toml its warm start (about 18 minutes: build/sorl sft configs/agent.toml);
# --config configs/default.toml makes its own in about a minute on first use (run
# build/sorl train configs/default.toml once) and gives a quick look; a Hugging Face model
# comes from scripts/fetch-model.
# The run's record (bench/record.hpp: tables "throughput" and "draft", sorl's drafter and
# ArcticInference's) goes to --record PATH, else $SORL_BENCH_RECORD, else runs/bench/.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/record.sh
record_command bench/war/run.sh "$@"
config=configs/agent.toml groups=100 group_size=4 batches=1,4,16,64 rollouts="" arctic=1
record=${SORL_BENCH_RECORD:-runs/bench/war-$(date -u +%Y%m%dT%H%M%SZ).json}
while [[ $# -gt 0 ]]; do
  case $1 in
    --config) config=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --group-size) group_size=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --rollouts) rollouts=$2; shift 2 ;;
    --no-arctic) arctic=0; shift ;;
    --record) record=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
bench=build/bench/war/war_bench
[[ -x $bench ]] || { echo "run.sh: $bench not built (run scripts/build)" >&2; exit 1; }
out=runs/war-bench/$(basename "$config" .toml)
mkdir -p "$out"
turns=$out/turns.jsonl

echo "== 1. recording $groups x $group_size rollouts of $config"
$bench record "$config" "$turns" --groups "$groups" --group-size "$group_size"

echo "== 2. drafting on the recorded turns"
$bench draft "$turns" --record "$out/draft_record.json" > "$out/draft_sorl.json"
if [[ $arctic == 1 ]]; then
  venv=${SORL_ARCTIC_VENV:-.venv-arctic}
  if ! "$venv/bin/python" -c "import arctic_inference.suffix_decoding, numpy" >/dev/null 2>&1; then
    echo "installing arctic-inference 0.3.0 into $venv (builds from source, about 2 minutes)"
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q arctic-inference==0.3.0 numpy
  fi
  "$venv/bin/python" bench/war/arctic_replay.py "$turns" --record none > "$out/draft_arctic.json"
fi
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'drafter':<16}{'us/call':>9}{'p50 us':>9}{'acceptance':>12}{'tokens/step':>13}{'accepted':>10}{'proposed':>10}")
for name, f in (("sorl", "draft_sorl.json"), ("arctic-inference", "draft_arctic.json")):
    p = os.path.join(out, f)
    if os.path.exists(p):
        j = json.load(open(p))
        acc = j['acceptance_rate']
        acc = f"{acc:>12.4f}" if acc is not None else f"{'-':>12}"  # nothing proposed
        print(f"{name:<16}{j['us_per_call']:>9.2f}{j['us_per_call_p50']:>9.2f}{acc}"
              f"{j['tokens_per_step']:>13.4f}{j['accepted']:>10}{j['proposed']:>10}")
PY

echo "== 3. rollout throughput, speculation off / on / auto"
extra=()
[[ -n $rollouts ]] && extra=(--rollouts "$rollouts")
$bench throughput "$config" --batches "$batches" --json "$out/throughput.json" "${extra[@]}" \
  --record "$record"
if [[ $record != none ]]; then
  # Step 2's drafter table (war_bench draft's record), with ArcticInference's row as its
  # baseline, into the record the throughput step wrote.
  python3 - "$out" "$record" <<'PY'
import json, os, sys
sys.path.insert(0, "bench")
import record
out, path = sys.argv[1:3]
data = record.load(path)
t = record.table(record.load(os.path.join(out, "draft_record.json")), "draft")
arctic = os.path.join(out, "draft_arctic.json")
if os.path.exists(arctic):
    j = json.load(open(arctic))
    t["baseline_rows"] = [len(t["rows"])]
    t["rows"].append(["arctic-inference", j["us_per_call"], j["us_per_call_p50"], j["acceptance_rate"],
                      j["tokens_per_step"], j["accepted"], j["proposed"]])
record.add_table(data, "draft", "sorl's suffix drafter and ArcticInference's on the same recorded turns",
                 t["columns"], t["rows"], t.get("baseline_rows", ()))
record.write(data, path)
PY
fi
echo "results under $out/"
