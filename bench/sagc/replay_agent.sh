#!/usr/bin/env bash
# Replays the multi-turn file_search workload (configs/agent.toml) in the SAGC simulator with
# tens of rollout workers, in one command:
#
#   bench/sagc/replay_agent.sh [--config FILE] [--checkpoint DIR|demonstrations] [--episodes N]
#                              [--metrics FILE] [--seconds-per-token S]
#                              [--workers "32 64"] [--steps N] [--episodes-file CSV]
#                              [--task-seed N] [--eval-report JSON] [--record PATH]
#                              [other sagc_sim options]
#
# 1. Samples N episodes (default 400) of file_search from the latest checkpoint under DIR
#    (default: the warm start the config trains from, its model.checkpoint) with
#    build/bench/sagc/sorl_episode_lengths, at temperature 1, with the config's task (depth,
#    max_dirs, max_files, detour_rate, max_turns; default configs/agent.toml), writing each
#    episode's transcript tokens (out=FILE). `--checkpoint demonstrations` takes the scripted
#    warm-start demonstrations instead (with the config's share and kind of wrong ones).
#    --task-seed N picks the episodes (the task seed, default 1).
#    `--episodes-file CSV` reuses such a file instead of sampling. `--eval-report JSON` takes a
#    single-turn workload's lengths instead: every completion of a `sorl eval --k K --out JSON`
#    report is one rollout of one turn (its tokens, the stop token included), e.g. the
#    reasoning workload of configs/smollm2-reasoning.toml (docs/sagc.md gives the command).
#    The simulator draws each rollout independently from the trace, so the lengths of one
#    prompt's completions are not kept together.
# 2. Turns tokens into a duration trace: duration = tokens × S seconds. At the warm start a
#    rollout's duration is roughly proportional to its episode's tokens (every turn decodes
#    an action and prefills an observation). With --metrics FILE (a real run's
#    metrics.jsonl of the same workload) S = median duration_p50_s / the sampled episodes'
#    median tokens, and the learner's tokens/s and the per-step overhead come from the same
#    file; without it S = --seconds-per-token (default 0.0006, an assumption) and the steps
#    have no fixed costs (the rollout phase alone). The simulator decodes at 1/S tokens per
#    base second, so its token counts are the episodes'.
# 3. Runs bench/sagc/sagc_sim.sh on that trace (scenario "long" only) once per worker
#    count W, with B = 8 prompts per step (configs/agent.toml), G in [2, 32], and the
#    straggler rule and ε of the simulator's defaults (κ = 3, ε = 0.1).
#
# The comparison does not depend on S except through the fixed per-step costs (learner
# tokens/s and the per-step overhead, --learner-tokens-per-s and --overhead-s of sagc_sim):
# scaling every duration by c scales every rollout phase by c, and the straggler rule is a
# ratio to the median. Extra arguments go to sagc_sim. Files land in runs/sagc-replay/. The
# run's record (bench/record.py: sagc_sim's tables per W, "long-wW" and "long-vs-sagc-wW") goes
# to --record PATH, else $SORL_BENCH_RECORD, else runs/bench/sagc-replay-UTC.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
me=bench/sagc/replay_agent.sh
source bench/record.sh
record_command "$me" "$@"
record=${SORL_BENCH_RECORD:-runs/bench/sagc-replay-$(date -u +%Y%m%dT%H%M%SZ).json}
config=configs/agent.toml
checkpoint=
episodes=400
spt=0.0006
workers="32 64"
steps=2000
metrics=
episodes_file=
eval_report=
task_seed=1
extra=()
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --checkpoint) checkpoint=$2; shift 2 ;;
    --episodes) episodes=$2; shift 2 ;;
    --seconds-per-token) spt=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --metrics) metrics=$2; shift 2 ;;
    --episodes-file) episodes_file=$2; shift 2 ;;
    --eval-report) eval_report=$2; shift 2 ;;
    --task-seed) task_seed=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
source "$root/scripts/lib/need.sh"
need_commands awk:gawk /usr/bin/python3:python3
[[ -f $config ]] || { echo "$me: no config file $config" >&2; exit 2; }
# The task and warm start of the config (its model.checkpoint is relative to the file).
read -r depth dirs files detour turns wrong wrong_episodes wander_share config_checkpoint < <(
  /usr/bin/python3 - "$config" <<'PY'
import os, sys, tomllib
path = sys.argv[1]
c = tomllib.load(open(path, "rb"))
t, s, m = c.get("task", {}), c.get("sft", {}), c.get("model", {})
ck = m.get("checkpoint", "")
if ck and not os.path.isabs(ck):
    ck = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), ck))
print(t.get("depth", 2), t.get("max_dirs", 2), t.get("max_files", 2), t.get("detour_rate", 0.1),
      t.get("max_turns", 10), s.get("wrong_fraction", 0.2), t.get("wrong_episodes", "wander"),
      t.get("wander_share", 0.0), ck or "-")
PY
)
[[ -n $checkpoint ]] || checkpoint=$config_checkpoint
build=${BUILD_DIR:-$root/build}
build_target "$build" sorl_episode_lengths
source_args=(checkpoint="$checkpoint")
if [[ $checkpoint == demonstrations ]]; then
  # The scripted warm-start demonstrations, with the config's share and kind of wrong ones.
  source_args=(wrong="$wrong" wrong_episodes="$wrong_episodes" wander_share="$wander_share")
elif [[ -z $episodes_file && -z $eval_report && ! -f "$checkpoint/latest" ]]; then
  echo "$me: no checkpoint under $checkpoint; create the warm start first" \
    "(build/sorl sft $config writes it)" >&2
  exit 2
fi
out=runs/sagc-replay
mkdir -p "$out"
episodes_csv=$out/episodes.csv
trace=$out/trace_s.txt
if [[ -n $eval_report ]]; then
  [[ -f $eval_report ]] || { echo "$me: no eval report $eval_report" >&2; exit 2; }
  /usr/bin/python3 - "$eval_report" "$episodes_csv" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["items"]
lengths = [n for it in items for n in it["lengths"]]
if not lengths:
    sys.exit(f"{sys.argv[1]}: the report has no completions")
with open(sys.argv[2], "w") as f:
    f.write("tokens,turns\n")
    f.writelines(f"{n},1\n" for n in lengths)
PY
elif [[ -n $episodes_file ]]; then
  episodes_csv=$episodes_file # tokens,turns lines from an earlier sorl_episode_lengths out=
else
  nice -n 5 "$build/bench/sagc/sorl_episode_lengths" task=file_search depth="$depth" dirs="$dirs" \
    files="$files" detour="$detour" max_turns="$turns" \
    "${source_args[@]}" n="$episodes" seed="$task_seed" out="$episodes_csv"
fi
if [[ -n $metrics ]]; then
  # Per-step costs and seconds per token from a real run of the same workload: seconds per
  # token = median over steps of duration_p50_s / the sampled episodes' median tokens; the
  # learner's tokens/s = sum tokens_trained / sum learn_s; the per-step overhead = median of
  # wall_s - rollout_s - learn_s (sync and the rest).
  read -r spt learner overhead < <(/usr/bin/python3 - "$metrics" "$episodes_csv" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tokens = sorted(int(l.split(",")[0]) for l in list(open(sys.argv[2]))[1:])
p50 = tokens[(len(tokens) + 1) // 2 - 1]  # nearest rank
spt = statistics.median(r["duration_p50_s"] for r in recs) / p50
learner = sum(r["tokens_trained"] for r in recs) / sum(r["learn_s"] for r in recs)
overhead = statistics.median(r["wall_s"] - r["rollout_s"] - r["learn_s"] for r in recs)
print(f"{spt:.6g} {learner:.6g} {overhead:.6g}")
PY
  )
  echo "from $metrics: $spt s/token, learner $learner tokens/s, overhead $overhead s per step"
  extra=(--learner-tokens-per-s "$learner" --overhead-s "$overhead" "${extra[@]}")
else
  # No fixed per-step costs: the rollout phase alone, where the comparison is scale-free.
  extra=(--learner-tokens-per-s 1e12 --overhead-s 0 "${extra[@]}")
fi
awk -F, -v s="$spt" 'NR == 1 { print "# seconds = tokens x " s; next } { printf "%.6f\n", $1 * s }' \
  "$episodes_csv" >"$trace"
rate=$(awk -v s="$spt" 'BEGIN { printf "%.6g", 1 / s }')
parts=()
for w in $workers; do
  echo
  echo "### W = $w rollout workers, trace $trace ($(grep -vc '^#' "$trace") episodes x $spt s/token)"
  BUILD_DIR=$build nice -n 5 bench/sagc/sagc_sim.sh --trace "$trace" --scenarios long \
    --workers "$w" --prompts 8 --steps "$steps" --decode-tokens-per-s "$rate" "${extra[@]}" \
    --record "$out/sim-w$w.record.json"
  parts+=("$out/sim-w$w.record.json:long=long-w$w" "$out/sim-w$w.record.json:long-vs-sagc=long-vs-sagc-w$w")
done
if [[ $record != none ]]; then
  python3 bench/record.py merge "$record" "${parts[@]}"
fi
