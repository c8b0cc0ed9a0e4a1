#!/usr/bin/env bash
# SAGC against static group sizes on a real `sorl train` run of a multi-turn task
# (default configs/guess.toml: number guessing, up to 10 turns; --config configs/agent.toml
# for file_search, whose episode lengths are long-tailed: docs/your-task.md).
#
#   bench/sagc/real_run.sh [--config FILE] [--steps N] [--target R]
#                          [--heldout-target R] [--eval-every N] [--stop-at-target]
#                          [--seed N] [--skip-done]
#                          [--policies "static4 static8 static16 static32 deadline sagc"]
#                          (also: sagc-tokens, sagc under the group_tokens straggler rule;
#                          the other arms use the wall_clock rule)
#                          [--record PATH]
#
# Runs each policy with the same seed, steps, warm start and everything else, one after the
# other (never side by side: they would share the cores), then prints one table: wall-clock
# to reach the target reward (first step whose trailing 5-step mean reward ≥ R, summing
# wall_s), with --heldout-target the wall-clock to the first step whose greedy held-out
# accuracy (heldout_accuracy, measured every --eval-every N steps: run.eval_every, default
# the config's own) is ≥ R, summing wall_s, which leaves the evaluations out ("—" when never
# reached or not measured; --stop-at-target ends each run there, run.stop_at_accuracy, so
# --steps becomes a cap), final reward (mean of the last 5 steps), held-out greedy accuracy
# before → after training, mean response length, straggler-event rate and mean G. Runs land
# in runs/sagc-real/<policy> (--seed N: run.seed = N, in runs/sagc-real-seedN/<policy>).
# The run's record (bench/record.py: that table) goes to --record PATH, else
# $SORL_BENCH_RECORD, else runs/bench/sagc-real-run-UTC.json. --skip-done keeps each policy
# whose run in that folder already finished (its log ends with the job's summary) instead of
# running it again, so an interrupted sweep continues where it stopped; the table covers them
# all, the kept runs with the timings of their own invocation.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source bench/record.sh
record_command bench/sagc/real_run.sh "$@"
record=${SORL_BENCH_RECORD:-runs/bench/sagc-real-run-$(date -u +%Y%m%dT%H%M%SZ).json}
config=configs/guess.toml
steps=30
target=0.30
heldout_target=
eval_every=
policies="static4 static8 static16 static32 deadline sagc"
stop_at_target=
skip_done=
seed=
out=runs/sagc-real
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --heldout-target) heldout_target=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --stop-at-target) stop_at_target=1; shift ;;
    --skip-done) skip_done=1; shift ;;
    --seed) seed=$2; out=runs/sagc-real-seed$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    *) echo "real_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
me=bench/sagc/real_run.sh
source "$root/scripts/lib/need.sh"
need_commands /usr/bin/python3:python3
[[ -f $config ]] || { echo "$me: no config file $config" >&2; exit 2; }
[[ -n $stop_at_target && -z $heldout_target ]] && { echo "$me: --stop-at-target needs --heldout-target" >&2; exit 2; }
[[ -x build/sorl ]] || scripts/build
mkdir -p "$out"
# Every run starts from the same warm start (the config's model.checkpoint); the first
# run writes it when it is missing, outside its steps' wall-clock.
for p in $policies; do
  # The config as it is, with the run's name, folder, steps (and eval_every) and the policy's
  # [sagc] keys set on top. configs/guess.toml and agent.toml set no other [sagc] key; a
  # config that does keeps it in every run.
  # The static, deadline and sagc arms judge stragglers by wall clock (their event-rate
  # column), whatever the configured default.
  case $p in
    static*) sagc=(policy=static "group_size=${p#static}" straggler_rule=wall_clock) ;;
    sagc) sagc=(policy=sagc group_size=8 g_min=4 g_max=32 target_rate=0.1 straggler_rule=wall_clock) ;;
    # The load-invariant rule (docs/sagc.md, "Two straggler rules"); its target counts groups.
    # κ = 8, ε = 0.2 of groups: on SmolLM2's sampled chain_sum answers (docs/your-task.md) a
    # rollout is past 3 × its group's median 19 % of the time, which no G meets; past 8 ×,
    # 3.9 %, which puts groups of 4 to 8 near ε.
    sagc-tokens) sagc=(policy=sagc group_size=8 g_min=4 g_max=32 target_rate=0.2 kappa=8
                       straggler_rule=group_tokens) ;;
    deadline) sagc=(policy=deadline group_size=8 g_min=4 straggler_rule=wall_clock) ;;
    *) echo "real_run.sh: unknown policy $p" >&2; exit 2 ;;
  esac
  args=(--set "run.name=$p" --set "run.output_dir=$out" --set "run.steps=$steps")
  if [[ -n $eval_every ]]; then args+=(--set "run.eval_every=$eval_every"); fi
  if [[ -n $seed ]]; then args+=(--set "run.seed=$seed"); fi
  if [[ -n $stop_at_target ]]; then args+=(--set "run.stop_at_accuracy=$heldout_target"); fi
  for kv in "${sagc[@]}"; do args+=(--set "sagc.$kv"); done
  if [[ -n $skip_done && -f $out/$p.log ]] && tail -1 "$out/$p.log" | grep -q '^sorl train: job finished'; then
    echo "== $p: kept, finished earlier: $(tail -1 "$out/$p.log")" >&2
    continue
  fi
  echo "== $p: build/sorl train $config ${args[*]} --overwrite" >&2
  build/sorl train "$config" "${args[@]}" --overwrite > "$out/$p.log" 2>&1
  tail -1 "$out/$p.log" >&2
done
/usr/bin/python3 "$root/bench/sagc/real_run_table.py" "$out" "$target" $policies \
  ${heldout_target:+--heldout-target "$heldout_target"} --record "$record"
