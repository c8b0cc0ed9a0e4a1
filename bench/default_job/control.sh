#!/usr/bin/env bash
# A job against its frozen-policy control: a config (default configs/default.toml) run twice,
# once as shipped and once with `algorithm.lr = 0` (same seed, warm start, prompts and
# sampling, so any rise in the frozen run is noise), then one table of both runs side by side:
# mean sampled reward of the first and last 10 steps, held-out greedy accuracy before and
# after with its standard error sqrt(p (1 - p) / n), and wall-clock.
#
#   bench/default_job/control.sh [--config FILE] [--seed N] [--steps N]
#                                [--set TABLE.KEY=VALUE ...] [--record PATH]
#
# --config picks another config, e.g. configs/agent.toml. --set changes one key of it in both
# runs, passed on to `sorl train --set` (VALUE as TOML writes it, or a bare word for a string,
# e.g. --set algorithm.lr=5e-4, --set model.checkpoint=/abs/warm-start; a relative path is
# relative to the config's folder, as in the file); the frozen run's algorithm.lr = 0 comes
# after it.
#
# Both runs use the config's warm start (for configs/default.toml
# runs/warm-start/arithmetic-tiny-carry), written by the first run when missing, inside that
# run's wall-clock. Runs land in runs/NAME-control/, NAME the config's file name without
# .toml; each run's config.resolved.toml there holds the settings it ran with. The run's record
# (bench/record.py: table "runs", the frozen run the baseline) goes to --record PATH, else
# $SORL_BENCH_RECORD, else runs/bench/default-job-control-UTC.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source bench/record.sh
record_command bench/default_job/control.sh "$@"
record=${SORL_BENCH_RECORD:-runs/bench/default-job-control-$(date -u +%Y%m%dT%H%M%SZ).json}
seed=""
steps=""
config=configs/default.toml
sets=()
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --set) sets+=("$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    *) echo "control.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$root/scripts/lib/need.sh"
need_commands /usr/bin/python3:python3
[[ -f $config ]] || { echo "control.sh: no config $config" >&2; exit 2; }
[[ -x build/sorl ]] || scripts/build
stem=$(basename "$config" .toml)
out=runs/$stem-control
mkdir -p "$out"
for run in rl frozen; do
  # The config as it is, with the run's name and folder and the --set overrides on top.
  args=(--set "run.name=$run" --set "run.output_dir=$root/$out")
  if [[ -n $seed ]]; then args+=(--set "run.seed=$seed"); fi
  if [[ -n $steps ]]; then args+=(--set "run.steps=$steps"); fi
  for s in ${sets[@]+"${sets[@]}"}; do args+=(--set "$s"); done
  if [[ $run == frozen ]]; then args+=(--set algorithm.lr=0.0); fi
  echo "== $run: build/sorl train $config ${args[*]} --overwrite" >&2
  start=$SECONDS
  build/sorl train "$config" "${args[@]}" --overwrite > "$out/$run.log" 2>&1
  echo $((SECONDS - start)) > "$out/$run.wall_s"
  tail -1 "$out/$run.log" >&2
done
/usr/bin/python3 - "$out" "$record" "$config" <<'PY'
import math, os, re, sys
sys.path.insert(0, "bench")
import record
out, record_path, config = sys.argv[1:4]
rows = []
print(f"{'run':<8} {'reward first10':>14} {'last10':>7} {'held-out before':>16} {'after':>14}  {'n':>4} {'wall s':>7}")
for run in ("rl", "frozen"):
    log = open(f"{out}/{run}.log").read()
    m = re.search(r"mean reward first \d+ steps ([\d.]+), last \d+ steps ([\d.]+); "
                  r"held-out accuracy ([\d.]+) → ([\d.]+)", log)
    n = re.search(r"held-out accuracy \(after, greedy, (\d+) prompts\)", log)
    if not m or not n:
        sys.exit(f"control.sh: no final summary in {out}/{run}.log")
    first, last, before, after = map(float, m.groups())
    n = int(n.group(1))
    se = lambda p: math.sqrt(p * (1 - p) / n)
    wall = float(open(f"{out}/{run}.wall_s").read())
    print(f"{run:<8} {first:>14.3f} {last:>7.3f} {before:>9.3f} ± {se(before):.3f} "
          f"{after:>6.3f} ± {se(after):.3f}  {n:>4} {wall:>7.0f}")
    rows.append([run, first, last, before, se(before), after, se(after), n, wall])
if record_path != "none":
    rec = record.Record("default-job-control", sorl=record.sorl_build("build/sorl"),
                        runtime=record.sorl_runtime("build/sorl", open(f"{out}/rl.log").read()))
    rec.set_threads(record.run_threads(f"{out}/rl"))
    rec.set_parameter("config", config)
    c = record.column
    rec.add_table("runs", "the job as shipped (rl) and with algorithm.lr = 0 (frozen, the control)",
                  [c("run", "run"), c("reward_first10", "mean reward, first 10 steps", "", 3),
                   c("reward_last10", "last 10 steps", "", 3), c("heldout_before", "held-out before", "", 3),
                   c("heldout_before_se", "± s.e.", "", 3), c("heldout_after", "held-out after", "", 3),
                   c("heldout_after_se", "± s.e.", "", 3), c("n", "held-out prompts"), c("wall_s", "wall", "s", 0)],
                  rows, baseline_rows=[1])
    if rec.write(record_path):
        record.note_written(record_path)
PY
