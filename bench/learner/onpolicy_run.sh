#!/usr/bin/env bash
# The learner scoring the rollout workers' bf16 weights against the fp32 learner, on a real
# `sorl train` run:
#
#   bench/learner/onpolicy_run.sh [--config FILE] [--steps N] [--arms "bf16 fp32"]
#                                 [--record PATH]
#
# Runs FILE (default configs/smollm2-chain_sum.toml) once per arm with `[algorithm]
# learner_weights` set to it and everything else as the file says (same seed, prompts and
# sampling settings), one after the other (never side by side: they would share the cores),
# then prints bench/learner/onpolicy_table.py's table: the train/inference mismatch per step
# (mean and max |learner − rollout log-prob|, k3, token_mult_prob_error, bitwise share), the
# held-out evaluations, reward and response length per quarter of the run, and the mean step
# time split (rollout / learn / sync, steps after the first). Runs land in runs/onpolicy/<arm>.
# The run's record (bench/record.py: that table) goes to --record PATH, else $SORL_BENCH_RECORD,
# else runs/bench/onpolicy-run-UTC.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source bench/record.sh
record_command bench/learner/onpolicy_run.sh "$@"
record=${SORL_BENCH_RECORD:-runs/bench/onpolicy-run-$(date -u +%Y%m%dT%H%M%SZ).json}
source scripts/lib/need.sh
need_commands /usr/bin/python3:python3
config=configs/smollm2-chain_sum.toml
steps=
arms="bf16 fp32"
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --arms) arms=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "onpolicy_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x build/sorl ]] || { echo "onpolicy_run.sh: build/sorl is missing; run scripts/build" >&2; exit 2; }
out=runs/onpolicy
mkdir -p "$out"
for arm in $arms; do
  case $arm in bf16|fp32) ;; *) echo "onpolicy_run.sh: unknown arm $arm (bf16, fp32)" >&2; exit 2 ;; esac
  # The config as it is, with the run's name and folder (and steps) and learner_weights set.
  args=(--set "run.name=$arm" --set "run.output_dir=$root/$out" --set "algorithm.learner_weights=$arm")
  if [[ -n $steps ]]; then args+=(--set "run.steps=$steps"); fi
  echo "== $arm: build/sorl train $config ${args[*]} --overwrite" >&2
  build/sorl train "$config" "${args[@]}" --overwrite > "$out/$arm.log" 2>&1
  tail -1 "$out/$arm.log" >&2
done
/usr/bin/python3 bench/learner/onpolicy_table.py "$out" $arms --record "$record"
