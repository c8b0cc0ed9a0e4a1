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
# --config picks another config, e.g. configs/agent.toml (a model.checkpoint relative to
# configs/, "../runs/...", is made absolute). --set changes one key of it in both runs (VALUE as TOML
# writes it, e.g. --set algorithm.lr=5e-4, --set model.checkpoint='"/abs/warm-start"'); the
# frozen run's algorithm.lr = 0 is applied after it.
#
# Both runs use the config's warm start (for configs/default.toml
# runs/warm-start/arithmetic-tiny-carry), written by the first run when missing, inside that
# run's wall-clock. Runs land in runs/NAME-control/, NAME the config's file name without
# .toml. The run's record (bench/record.py: table "runs", the frozen run the baseline) goes to
# --record PATH, else $SORL_BENCH_RECORD, else runs/bench/default-job-control-UTC.json.
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
  cfg="$out/$run.toml"
  /usr/bin/python3 - "$cfg" "$run" "$seed" "$steps" "$root" "$config" "$out" \
    ${sets[@]+"${sets[@]}"} <<'PY'
import re, sys
cfg, name, seed, steps, root, config, out = sys.argv[1:8]
text = open(config).read()
def sub(pattern, repl):
    global text
    text, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    if n != 1:
        sys.exit(f"control.sh: {config} has no line matching {pattern}")
sub(r'^name = .*$', f'name = "{name}"')
sub(r'^output_dir = .*$', f'output_dir = "{root}/{out}"')
# A checkpoint relative to configs/ ("../runs/...") becomes absolute; an absolute one stays.
text = re.sub(r'(?m)^checkpoint = "\.\./', f'checkpoint = "{root}/', text, count=1)
if seed:
    sub(r'^seed = .*$', f"seed = {seed}")
if steps:
    sub(r'^steps = .*$', f"steps = {steps}")
for s in sys.argv[8:]:
    key, eq, value = s.partition("=")
    table, dot, leaf = key.partition(".")
    if not eq or not dot or not leaf:
        sys.exit(f"control.sh: --set wants TABLE.KEY=VALUE, got {s}")
    # Within [table] up to the next table header: replace the key's line, or add one.
    m = re.search(r'(?ms)^\[' + re.escape(table) + r'\]\n(.*?)(?=^\[|\Z)', text)
    if not m:
        sys.exit(f"control.sh: {config} has no [{table}] table")
    body, n = re.subn(r'(?m)^' + re.escape(leaf) + r' = [^\n]*', lambda _: f"{leaf} = {value}", m.group(1), count=1)
    if n == 0:
        body = f"{leaf} = {value}\n" + body
    text = text[:m.start(1)] + body + text[m.end(1):]
if name == "frozen":
    # The [algorithm] table's lr (the [sft] table has its own).
    text, n = re.subn(r'(?ms)^(\[algorithm\]\n.*?^)lr = [^\n]*', r'\1lr = 0.0', text, count=1)
    if n != 1:
        sys.exit(f"control.sh: {config} has no lr in [algorithm]")
open(cfg, "w").write(text)
PY
  echo "== $run: build/sorl train $cfg --overwrite" >&2
  start=$SECONDS
  build/sorl train "$cfg" --overwrite > "$out/$run.log" 2>&1
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
    m = re.search(r"(?ms)^\[run\]$.*?^threads = (\d+)", open(f"{out}/rl.toml").read())
    rec.set_threads(int(m.group(1)) if m else None)
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
