#!/usr/bin/env bash
# Sparse sync on a real job at several learning rates (docs/sync.md, "On the real model"):
# one `sorl train` run per learning rate, the same config, seed and steps otherwise, then a
# table of what each step's delta cost against dense bf16, against int32 index + bf16 value
# (6 bytes per change), and against its order-0 entropy bound, with temporal locality.
#
#   bench/sync/real_lr.sh [--config configs/smollm2-reasoning.toml] [--steps 10]
#                         [--lrs "1e-6 3e-6 1e-5"] [--seed N] [--skip-done] [--record PATH]
#
# Runs go to runs/sync-lr/lr<LR>/ (logs beside them) without held-out evaluations
# (task.eval_prompts = 0); --skip-done keeps a run whose log ends with the job's summary.
# The record (bench/record.py; tables "steps" and "lrs") goes to --record, else
# $SORL_BENCH_RECORD, else runs/bench/sync-real-lr-UTC.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source bench/record.sh
record_command bench/sync/real_lr.sh "$@"
record=${SORL_BENCH_RECORD:-runs/bench/sync-real-lr-$(date -u +%Y%m%dT%H%M%SZ).json}
config=configs/smollm2-reasoning.toml
steps=10
lrs="1e-6 3e-6 1e-5"
seed=
skip_done=
out=runs/sync-lr
me=bench/sync/real_lr.sh
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --lrs) lrs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --skip-done) skip_done=1; shift ;;
    --record) record=$2; shift 2 ;;
    *) echo "$me: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$root/scripts/lib/need.sh"
need_commands /usr/bin/python3:python3
[[ -f $config ]] || { echo "$me: no config file $config" >&2; exit 2; }
[[ -x build/sorl ]] || scripts/build
mkdir -p "$out"
for lr in $lrs; do
  name=lr$lr
  args=(--set "run.name=$name" --set "run.output_dir=$out" --set "run.steps=$steps"
        --set "algorithm.lr=$lr" --set "task.eval_prompts=0" --set "sync.mode=sparse")
  if [[ -n $seed ]]; then args+=(--set "run.seed=$seed"); fi
  if [[ -n $skip_done && -f $out/$name.log ]] && tail -1 "$out/$name.log" | grep -q '^sorl train: job finished'; then
    echo "== $name: kept, finished earlier: $(tail -1 "$out/$name.log")" >&2
    continue
  fi
  echo "== $name: build/sorl train $config ${args[*]} --overwrite" >&2
  build/sorl train "$config" "${args[@]}" --overwrite > "$out/$name.log" 2>&1
  tail -1 "$out/$name.log" >&2
done
names=()
for lr in $lrs; do names+=("lr$lr"); done
/usr/bin/python3 "$root/bench/sync/real_lr_table.py" "$out" "${names[@]}" --record "$record"
