#!/usr/bin/env bash
# Decode throughput of a real model against this machine's limits, in one command:
#   bench/decode_model.sh MODEL_DIR [decode_model_bench options: --batches 1,8,32,64 --threads 2 ...]
# e.g. bench/decode_model.sh models/smollm2-135m-instruct (scripts/fetch-model smollm2-135m-instruct).
# Builds decode_model_bench in $BUILD_DIR (default build/) and runs it (bench/decode_model.cpp
# says what each column is); then, when the bench virtualenv exists (bench/setup-baselines, at
# $SORL_BENCH_VENV or ~/.cache/sorl-bench-venv), bench/decode_baselines.py on the same prompt,
# batches, token count, temperature and threads; then one Markdown table of it all
# (bench/decode_model_table.py). OpenBLAS and OpenMP get the same thread count as the bench, so
# that no implementation gets more cores than --threads says. DECODE_OUT=DIR keeps the JSON
# lines there; QUIET_WAIT=S lets each baseline wait up to S s for other processes to leave;
# BASELINES=hf-pypi,hf-debian,llama.cpp and BASELINE_DTYPES=fp32,bf16 choose the peers.
# The run's record (bench/record.hpp: limits, decode with the peers' columns, profile) goes to
# --record PATH, else $SORL_BENCH_RECORD, else runs/bench/decode-model-UTC.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=bench/decode_model.sh
source "$root/scripts/lib/need.sh"
if [[ $# -lt 1 || $1 == -* ]]; then
  echo "usage: bench/decode_model.sh MODEL_DIR [--batches 1,8,32,64] [--threads 2] [--repeats 3] ..." >&2
  exit 2
fi
build=${BUILD_DIR:-$root/build}
build_target "$build" decode_model_bench -DSORL_ONLY_ML=ON -DSORL_BUILD_TESTS=OFF
# The settings the baselines must share with sorl's run.
threads=2 batches=1,8,32,64 new=64 temperature=0.7 repeats=3
record=${SORL_BENCH_RECORD:-runs/bench/decode-model-$(date -u +%Y%m%dT%H%M%SZ).json}
args=("$@")
for ((i = 1; i + 1 < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --threads) threads=${args[i + 1]} ;;
    --batches) batches=${args[i + 1]} ;;
    --new) new=${args[i + 1]} ;;
    --temperature) temperature=${args[i + 1]} ;;
    --repeats) repeats=${args[i + 1]} ;;
    --record) record=${args[i + 1]} ;;
  esac
done
source "$root/bench/record.sh"
record_command "$me" "$@"
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
out=${DECODE_OUT:-$(mktemp -d)}
mkdir -p "$out"
"$build/bench/decode_model_bench" "$@" --json "$out/sorl.jsonl" --prompt-out "$out/prompt.jsonl" \
  --record "$record"
venv=${SORL_BENCH_VENV:-$HOME/.cache/sorl-bench-venv}
if [[ -x $venv/bin/python ]]; then
  # Peers on the same prompt and sampling settings: transformers generate on PyPI's and
  # Debian's torch, llama.cpp on F32 and BF16 GGUF (bench/decode_baselines.py).
  python3 "$root/bench/decode_baselines.py" "$1" --prompts "$out/prompt.jsonl" --batches "$batches" \
    --new-tokens "$new" --temperature "$temperature" --threads "$threads" --repeats "$repeats" \
    --venv "$venv" --json "$out/baselines.jsonl" --quiet-wait "${QUIET_WAIT:-0}" \
    --impls "${BASELINES:-hf-pypi,hf-debian,llama.cpp}" --dtypes "${BASELINE_DTYPES:-fp32,bf16}" \
    --record none
  echo
  python3 "$root/bench/decode_model_table.py" "$out/sorl.jsonl" "$out/baselines.jsonl" --record "$record"
else
  echo "$me: no bench virtualenv at $venv (bench/setup-baselines creates it): no peer baselines" >&2
  echo
  python3 "$root/bench/decode_model_table.py" "$out/sorl.jsonl"
fi
echo "$me: raw figures in $out"
