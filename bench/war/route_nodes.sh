#!/usr/bin/env bash
# Cache-aware placement through the actor runtime: the shared-prefix trace of
# bench/war/route_bench.cpp trained on as three processes (`sorl node`: a hub with the
# trainer, learner, sync publisher, SAGC controller and scheduler, and two rollout-worker
# processes) or in one process (`sorl train`, --modes process), once per scheduler policy
# (ARCHITECTURE.md §6 WAR, cache-aware scheduling):
#
#   bench/war/route_nodes.sh [--steps 5] [--groups 128] [--modes nodes] [--trace uniform]
#                            [--policies "round_robin least_loaded cache_aware sglang_cache_aware"]
#                            [--config FILE] [--record PATH]
#
# --config FILE trains FILE's own task and model instead of a trace (the agentic workload:
# bench/war/route_nodes.sh --config configs/agent-docs.toml --groups 32): its sections as
# written, with --groups prompts per step, --steps steps, no held-out evaluation or
# checkpoints, and the topology and scheduler policy below; FILE's warm start must exist.
# Unlike the trace, such a task has rewards, so the weights move from step to step; every
# policy starts from the same weights and seed, and the policies' steps differ only where
# their weights have come to differ (bit for bit they do not: a batch's composition changes
# the last bits of its log-probs, docs/war.md, "Prefix KV cache").
#
# Each run trains a fresh tiny policy for --steps steps of --groups prompts x 4 rollouts, 16
# new tokens, drawn from 16 families of shared prefixes; every worker's prefix cache holds half
# the families, as in route_bench. --trace picks one of route.sh's traces: uniform (384-token
# prefixes, 24-token questions, configs/default.toml's model) or long (1024-token prefixes,
# 32-token questions, configs/agent.toml's 2k-context model shape, fresh weights). Rewards are all 0
# (the trace has no answers to find), so the weights stay put and every step's rollouts are
# drawn from the same policy; only placement differs between runs. The figures are the
# step metrics of metrics.jsonl (docs/run-directory.md) over the steps after the
# first (which also carries the first full weight sync): rollout tokens/s, the rollout phase's
# seconds, prefix_hit_rate, prefill_tokens, episode_p99_s and load_imbalance, medians over
# those steps. Worker processes run one compute thread each (OMP_NUM_THREADS=1), as the
# in-process bench's worker threads do. --modes "process nodes" adds the one-process runs.
# Every step also runs the learner's old-log-prob forward over all its rollouts (about 15 s of
# the ~19 s a step takes here; with every advantage 0 it skips the update's forward and
# backward), so a run is about 1.5 minutes and the defaults about 6 minutes on 2 cores. With
# --trace long that forward covers 512 x 1,072 tokens (about 84 s a step): --steps 4 takes
# about 50 minutes. The run's record (bench/record.py: table "placement", each mode's first policy
# the baseline) goes to --record PATH, else $SORL_BENCH_RECORD, else runs/bench/route-nodes-UTC.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/record.sh
record_command bench/war/route_nodes.sh "$@"
record=${SORL_BENCH_RECORD:-runs/bench/route-nodes-$(date -u +%Y%m%dT%H%M%SZ).json}
steps=5
groups=128
modes=nodes
policies="round_robin least_loaded cache_aware sglang_cache_aware"
trace=uniform
own_config=
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --trace) trace=$2; shift 2 ;;
    --config) own_config=$2; trace=config; shift 2 ;;
    --record) record=$2; shift 2 ;;
    *) echo "route_nodes.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[0-9]+$ && $steps -ge 2 ]] || { echo "route_nodes.sh: --steps must be >= 2" >&2; exit 2; }
case $trace in
  uniform) trace_config=configs/default.toml; trace_args=(); preset=tiny ;;
  long) trace_config=configs/agent.toml; trace_args=(--prefix-tokens 1024 --question-tokens 32); preset=tiny-2k ;;
  config) [[ -f $own_config ]] || { echo "route_nodes.sh: --config $own_config: no such file" >&2; exit 2; } ;;
  *) echo "route_nodes.sh: unknown --trace $trace (uniform, long)" >&2; exit 2 ;;
esac
sorl=build/sorl
bench=build/bench/war/route_bench
for b in $sorl $bench; do
  [[ -x $b ]] || { echo "route_nodes.sh: $b not built (run scripts/build)" >&2; exit 1; }
done
out=$PWD/runs/route-nodes-$trace
[[ $trace == config ]] && out=$PWD/runs/route-nodes-$(basename "$own_config" .toml)
rm -rf "$out"
mkdir -p "$out"
if [[ $trace != config ]]; then
  cache_line=$($bench $trace_config --groups 2048 "${trace_args[@]}" --write-trace "$out/trace.jsonl" 2>/dev/null)
  [[ $cache_line == prefix_cache_bytes* ]] || { echo "route_nodes.sh: route_bench wrote no trace" >&2; exit 1; }
else
  $sorl check "$own_config" --json > "$out/check.json" || { echo "route_nodes.sh: $own_config does not load" >&2; exit 2; }
  if python3 -c 'import json, sys; w = json.load(open(sys.argv[1]))["warm_start"]; sys.exit(0 if w and w["latest"] is None else 1)' \
       "$out/check.json"; then
    echo "route_nodes.sh: $own_config's warm start is missing (build/sorl sft $own_config)" >&2
    exit 1
  fi
fi
port=$((20000 + RANDOM % 20000))

# FILE's sections with its paths made absolute (the copy lives under $out), without [[node]]
# and [scheduler], and with the [run] keys, step size and evaluation this script sets.
own_sections() { # NAME
  python3 - "$own_config" "$1" "$steps" "$out" "$groups" <<'PY'
import json, os, sys, tomllib
path, name, steps, out, groups = sys.argv[1:]
cfg = tomllib.load(open(path, "rb"))
base = os.path.dirname(os.path.abspath(path))
paths = {("model", "checkpoint"), ("model", "hf_dir"), ("task", "path"), ("task", "eval_path"),
         ("sft", "init_checkpoint")}
cfg.pop("node", None)
cfg.pop("scheduler", None)
cfg["run"] = {**cfg.get("run", {}), "name": name, "steps": int(steps), "output_dir": out,
              "checkpoint_every": 0, "eval_every": 0}
cfg.setdefault("task", {})["eval_prompts"] = 0
cfg.setdefault("algorithm", {})["prompts_per_step"] = int(groups)
def value(v):
    if isinstance(v, bool): return "true" if v else "false"
    if isinstance(v, (int, float)): return repr(v)
    if isinstance(v, str): return json.dumps(v)
    if isinstance(v, list): return "[" + ", ".join(value(x) for x in v) + "]"
    sys.exit(f"route_nodes.sh: {path}: cannot copy a value of type {type(v).__name__}")
for section, keys in cfg.items():
    if not isinstance(keys, dict):
        sys.exit(f"route_nodes.sh: {path}: top-level key {section} is not a table")
    print(f"[{section}]")
    for k, v in keys.items():
        if (section, k) in paths and v and not os.path.isabs(v):
            v = os.path.normpath(os.path.join(base, v))
        print(f"{k} = {value(v)}")
    print()
PY
}

config() { # MODE POLICY -> the config's path
  local mode=$1 policy=$2 file="$out/$1-$2.toml"
  if [[ $trace == config ]]; then
    { own_sections "$mode-$policy"
      printf '[scheduler]\npolicy = "%s"\n\n[network]\nconnect_timeout_ms = 60000\n' "$policy"
    } > "$file"
  else
  cat > "$file" <<EOF
[run]
name = "$mode-$policy"
seed = 1
steps = $steps
output_dir = "$out"
checkpoint_every = 0
eval_every = 0

[model]
preset = "$preset"

[task]
name = "jsonl"
path = "$out/trace.jsonl"
eval_fraction = 0.0
eval_prompts = 0
max_new_tokens = 16

[algorithm]
name = "grpo"
prompts_per_step = $groups
temperature = 1.0

[sagc]
policy = "static"
group_size = 4

[rollout]
max_batch = 64
$cache_line

[scheduler]
policy = "$policy"

[network]
connect_timeout_ms = 60000
EOF
  fi
  if [[ $mode == process ]]; then
    cat >> "$file" <<EOF

[[node]]
name = "main"
actors = ["trainer", "learner", "sync_publisher", "sagc_controller", "scheduler",
          { role = "rollout_worker", count = 2 }]
EOF
  else
    cat >> "$file" <<EOF

[[node]]
name = "main"
listen = "127.0.0.1:$port"
actors = ["trainer", "learner", "sync_publisher", "sagc_controller", "scheduler"]

[[node]]
name = "rollout-a"
actors = ["rollout_worker"]

[[node]]
name = "rollout-b"
actors = ["rollout_worker"]
EOF
  fi
  echo "$file"
}

for mode in $modes; do
  [[ $mode == process || $mode == nodes ]] || { echo "route_nodes.sh: unknown mode $mode (process, nodes)" >&2; exit 2; }
  for policy in $policies; do
    file=$(config "$mode" "$policy")
    echo "== $mode $policy" >&2
    if [[ $mode == process ]]; then
      $sorl train "$file" > "$out/$mode-$policy.log" 2>&1
    else
      $sorl node "$file" --node main > "$out/$mode-$policy.log" 2>&1 &
      hub=$!
      OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $sorl node "$file" --node rollout-a > "$out/$mode-$policy-a.log" 2>&1 &
      a=$!
      OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $sorl node "$file" --node rollout-b > "$out/$mode-$policy-b.log" 2>&1 &
      b=$!
      rc=0
      wait $hub || rc=$?
      wait $a || true
      wait $b || true
      ((rc == 0)) || { echo "route_nodes.sh: the hub failed (rc $rc): $out/$mode-$policy.log" >&2; exit 1; }
      port=$((port + 1))
    fi
  done
done

python3 - "$out" "$record" "$trace" $modes -- $policies <<'EOF'
import json, re, statistics, sys
sys.path.insert(0, "bench")
import record
out, record_path, trace = sys.argv[1:4]
args = sys.argv[4:]
modes, policies = args[:args.index("--")], args[args.index("--") + 1:]
keys = ["tokens_per_s", "rollout_s", "prefix_hit_rate", "prefill_tokens", "episode_p99_s", "load_imbalance"]
print(f"{'mode':8} {'policy':19} {'tokens/s':>9} {'vs rr':>6} {'rollout_s':>9} {'hit_rate':>8} "
      f"{'prefill':>9} {'p99_s':>6} {'imbalance':>9}")
table = {}
c = record.column
record_rows, baseline_rows = [], []
for mode in modes:
    base = None
    for p in policies:
        rows = [json.loads(l) for l in open(f"{out}/{mode}-{p}/metrics.jsonl") if l.strip()]
        rows = [r for r in rows if "rollout_s" in r][1:]
        med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}
        base = base or med["tokens_per_s"]
        table[f"{mode}/{p}"] = med
        if p == policies[0]:
            baseline_rows.append(len(record_rows))
        record_rows.append([mode, p, med["tokens_per_s"], med["tokens_per_s"] / base, med["rollout_s"],
                            med["prefix_hit_rate"], med["prefill_tokens"], med["episode_p99_s"], med["load_imbalance"]])
        print(f"{mode:8} {p:19} {med['tokens_per_s']:9.1f} {med['tokens_per_s'] / base:5.2f}x "
              f"{med['rollout_s']:9.2f} {med['prefix_hit_rate']:8.3f} {med['prefill_tokens']:9.0f} "
              f"{med['episode_p99_s']:6.2f} {med['load_imbalance']:9.2f}")
json.dump(table, open(f"{out}/table.json", "w"), indent=1)
print(f"results under {out}/ (table.json, one run directory and log per mode and policy)")
if record_path != "none":
    log = open(f"{out}/{modes[0]}-{policies[0]}.log", encoding="utf-8", errors="replace").read()
    rec = record.Record("route-nodes", sorl=record.sorl_build("build/sorl"),
                        runtime=record.sorl_runtime("build/sorl", log))
    rec.set_parameter("trace", trace)
    rec.add_table("placement", "medians over the steps after the first, per mode and scheduler policy",
                  [c("mode", "mode"), c("policy", "policy"), c("tokens_per_s", "rollout", "tokens/s", 1),
                   c("vs_first", f"over {policies[0]}", "x", 2), c("rollout_s", "rollout phase", "s", 2),
                   c("hit_rate", "prefix hit rate", "", 3), c("prefill_tokens", "prefill", "tokens", 0),
                   c("p99_s", "episode p99", "s", 2), c("imbalance", "load imbalance", "", 2)],
                  record_rows, baseline_rows)
    if rec.write(record_path):
        record.note_written(record_path)
EOF
