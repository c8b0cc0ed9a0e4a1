#!/usr/bin/env bash
# The prepared device check: sorl on a lent GPU machine, in a few minutes, from binaries built
# here against the same libtorch the machine has (PyTorch 2.11, CUDA 13). It writes every
# result to $OUT/device-check.md and prints that file at the end.
#
#   gpu/check_device.sh prepare   here: build against the torch 2.11 wheel (scripts/build-torch2)
#                                 and pack the binaries, the shared libraries they need beyond
#                                 libtorch and the C library, and the tiny warm start into
#                                 $BUNDLE (default build-torch2/device-bundle, < 64 MiB),
#                                 the folder to carry to the GPU machine
#   gpu/check_device.sh           there (or here with DEVICE=cpu): run the checks from $BUNDLE
#
# The checks:
#   1. gpu/device_parity: CPU-versus-device logits, greedy rollout tokens and their log-probs
#      (bf16 rollout copy), the learner's old log-probs and one learner step, on the tiny
#      preset and, when $MODEL_DIR holds a Hugging Face model, on it; tolerances in its source;
#   2. the sparse-sync kernels against the CPU codec (bit for bit) and their bandwidth next to
#      a device-to-device copy (gpu_sync_bench; needs a GPU, else reported skipped);
#   3. `sorl train` for $STEPS steps of configs/default.toml with run.device = $DEVICE:
#      seconds per step split rollout / learn / sync, rollout tokens/s, train/inference
#      log-prob mismatch; and configs/smollm2-chain_sum.toml the same way when $MODEL_DIR and
#      data/chain_sum exist, next to Hugging Face `generate` on the same prompts and device
#      when python3 can import torch and transformers (gpu/hf_generate_baseline.py).
#
# Env: DEVICE (default cuda), BUNDLE, OUT (default $BUNDLE/out), STEPS (default 5),
#      MODEL_DIR (default models/smollm2-135m-instruct), TORCH_LIB (the directory of
#      libtorch.so; default: that of python3's torch), ELEMENTS (default 1000000000).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
BUNDLE=${BUNDLE:-build-torch2/device-bundle}

if [[ "${1:-}" == prepare ]]; then
  scripts/build-torch2
  build=${BUILD:-build-torch2}
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/warm-start"
  bins=("$build/sorl" "$build/gpu/device_parity")
  for t in gpu_sync_bench; do [[ -x $build/gpu/$t ]] && bins+=("$build/gpu/$t"); done
  for t in gpu_sync_test gpu_twin_test nccl_broadcast_test; do
    f=$(find "$build/tests" -name "$t" -type f -perm -u+x | head -1)
    [[ -n $f ]] && bins+=("$f")
  done
  for b in "${bins[@]}"; do
    # Debug information is most of a RelWithDebInfo binary; the check needs none.
    objcopy --strip-debug "$b" "$BUNDLE/bin/$(basename "$b")"
  done
  # Every library the binaries load except libtorch's own (the GPU machine's torch brings
  # them), the CUDA runtime's and the C library's.
  ldd "$BUNDLE"/bin/* | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libtorch*|libc10*|libcuda*|libcudart*|libnccl*|libnv*|libcublas*|libcudnn*|libcusparse*|\
      libcufft*|libcurand*|libcusolver*|libgomp*|libc.so*|libm.so*|libdl.so*|librt.so*|\
      libpthread.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
      *) cp -L "$lib" "$BUNDLE/lib/" ;;
    esac
  done
  cp -r runs/warm-start/arithmetic-tiny-carry "$BUNDLE/warm-start/" 2>/dev/null ||
    echo "check_device: no runs/warm-start/arithmetic-tiny-carry (run build/sorl train once); the check will make it"
  echo "check_device: $BUNDLE is $(du -sh "$BUNDLE" | cut -f1); carry it and run gpu/check_device.sh there"
  exit 0
fi

DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$BUNDLE/out}
STEPS=${STEPS:-5}
MODEL_DIR=${MODEL_DIR:-models/smollm2-135m-instruct}
ELEMENTS=${ELEMENTS:-1000000000}
bin=$root/$BUNDLE/bin
if [[ ! -x $bin/sorl ]]; then
  echo "check_device: no $BUNDLE/bin/sorl; run 'gpu/check_device.sh prepare' first" >&2
  exit 2
fi
if [[ -z ${TORCH_LIB:-} ]]; then
  TORCH_LIB=$(python3 -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))" 2>/dev/null ||
              { [[ -d .venv-torch2 ]] && .venv-torch2/bin/python -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"; } || true)
fi
if [[ ! -f ${TORCH_LIB:-}/libtorch.so ]]; then
  echo "check_device: no libtorch.so found (set TORCH_LIB to the lib directory of a torch 2.11 install)" >&2
  exit 2
fi
export LD_LIBRARY_PATH="$TORCH_LIB:$root/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# configs/default.toml's portable kernels restart the process with Debian's OpenBLAS, which a
# GPU machine lacks.
export SORL_NATIVE_KERNELS=1
mkdir -p "$OUT"
report=$OUT/device-check.md
failed=0
{
  echo "# sorl device check, $(date -u +%FT%TZ)"
  echo
  echo "- device: $DEVICE; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'no nvidia-smi')"
  echo "- libtorch: $TORCH_LIB"
  echo "- host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
} > "$report"

section() { printf '\n## %s\n\n```\n' "$1" >> "$report"; }
end_section() { printf '```\n' >> "$report"; }
run_logged() { # name, command...: appends the command's output; a failure is counted, not fatal
  local rc=0
  "${@:2}" >> "$report" 2>&1 || rc=$?
  if ((rc != 0)); then echo "check_device: $1 exited $rc" >> "$report"; failed=$((failed + 1)); fi
}

section "1. parity, tiny preset"
run_logged parity "$bin/device_parity" --device "$DEVICE" --json "$OUT/parity-tiny.json"
end_section
if [[ -f $MODEL_DIR/config.json ]]; then
  section "1b. parity, $MODEL_DIR"
  run_logged parity-hf "$bin/device_parity" --device "$DEVICE" --hf-dir "$MODEL_DIR" --json "$OUT/parity-hf.json"
  end_section
fi

section "2. sparse-sync kernels"
if [[ $DEVICE != cpu && -x $bin/gpu_sync_test ]] && nvidia-smi >/dev/null 2>&1; then
  for t in gpu_twin_test gpu_sync_test nccl_broadcast_test; do
    [[ -x $bin/$t ]] && run_logged "$t" "$bin/$t"
  done
  run_logged gpu_sync_bench "$bin/gpu_sync_bench" "$ELEMENTS" 3
else
  echo "skipped: needs a CUDA device (DEVICE=$DEVICE)" >> "$report"
  [[ -x $bin/gpu_twin_test ]] && run_logged gpu_twin_test "$bin/gpu_twin_test"
fi
end_section

# Seconds per step split rollout / learn / sync and tokens/s, medians over steps 2.. (the first
# step pays one-time costs: kernels, allocations).
summarise() {
  python3 - "$1" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
recs = [r for r in recs if "rollout_s" in r]
body = recs[1:] or recs
med = lambda k: statistics.median(r.get(k, 0.0) for r in body)
print(f"steps {len(recs)} (medians over {len(body)}): wall {med('wall_s'):.3f} s = rollout "
      f"{med('rollout_s'):.3f} + learn {med('learn_s'):.3f} + sync {med('sync_s'):.3f}; rollout "
      f"{med('tokens_per_s'):.0f} tokens/s; mismatch mean {med('mismatch_mean'):.2e} max "
      f"{med('mismatch_max'):.2e}; reward {recs[-1].get('reward_mean', 0):.3f}")
PY
}

train_on() { # name, config file, extra [run] lines
  local name=$1 src=$2 cfg=$OUT/$1.toml
  python3 - "$src" "$cfg" "$DEVICE" "$STEPS" "$OUT" "$name" "$root" <<'PY'
import os, re, sys
src, dst, device, steps, out, name, root = sys.argv[1:]
text = open(src).read()
base = os.path.dirname(os.path.abspath(src))
# Paths relative to the source file's folder become absolute; the run goes under OUT.
text = re.sub(r'(?m)^(checkpoint|hf_dir|path|eval_path) = "([^"/][^"]*)"',
              lambda m: f'{m.group(1)} = "{os.path.normpath(os.path.join(base, m.group(2)))}"', text)
def put(text, key, value):
    text, n = re.subn(rf'(?m)^{key} = [^\n]*', f'{key} = {value}', text, count=1)
    return text if n else text.replace('[run]\n', f'[run]\n{key} = {value}\n', 1)
for k, v in (("name", f'"{name}"'), ("steps", steps), ("output_dir", f'"{out}"'),
             ("device", f'"{device}"'), ("checkpoint_every", "0"), ("threads", "0")):
    text = put(text, k, v)
open(dst, "w").write(text)
PY
  section "3. sorl train, $name ($STEPS steps on $DEVICE)"
  local rc=0
  "$bin/sorl" train "$cfg" --overwrite > "$OUT/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    summarise "$OUT/$name/metrics.jsonl" >> "$report"
  else
    tail -20 "$OUT/$name.log" >> "$report"
    echo "check_device: sorl train exited $rc (log: $OUT/$name.log)" >> "$report"
    failed=$((failed + 1))
  fi
  end_section
}

# The tiny warm start: the bundle's copy where configs/default.toml expects it.
if [[ ! -d runs/warm-start/arithmetic-tiny-carry && -d $BUNDLE/warm-start/arithmetic-tiny-carry ]]; then
  mkdir -p runs/warm-start && cp -r "$BUNDLE/warm-start/arithmetic-tiny-carry" runs/warm-start/
fi
train_on default configs/default.toml
if [[ -f $MODEL_DIR/config.json && -f data/chain_sum/train.jsonl ]]; then
  train_on smollm2 configs/smollm2-chain_sum.toml
  section "3b. Hugging Face generate, same prompts and device"
  if python3 -c "import torch, transformers" 2>/dev/null; then
    run_logged hf-generate python3 gpu/hf_generate_baseline.py --model "$MODEL_DIR" \
      --data data/chain_sum/train.jsonl --device "$DEVICE" --prompts 4 --group 8 --max-new-tokens 32
  else
    echo "skipped: python3 cannot import torch and transformers" >> "$report"
  fi
  end_section
else
  printf '\n## 3b. real model\n\nskipped: no %s (scripts/fetch-model smollm2-135m-instruct) or no data/chain_sum (scripts/fetch-data)\n' "$MODEL_DIR" >> "$report"
fi

printf '\n%s\n' "$( ((failed == 0)) && echo "every part ran and passed" || echo "$failed part(s) FAILED")" >> "$report"
cat "$report"
echo "check_device: results in $report"
((failed == 0))
