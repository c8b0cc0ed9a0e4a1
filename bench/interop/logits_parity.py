#!/usr/bin/env python3
"""Logits parity: sorl's forward (build/bench/interop/sorl_lm_score) against transformers'
AutoModelForCausalLM on the same Hugging Face model directory, in fp32, on a few prompts
tokenized by the directory's own tokenizer. Prints per prompt the token count, max |delta logit|,
the largest |logit| for scale, and the share of positions whose argmax agrees; then the mean
next-token NLL both ways. Exits 1 when max |delta| exceeds --atol (default 1e-3, relative to
logits of magnitude ~10-30) or an argmax differs.

    python3 bench/interop/logits_parity.py MODEL_DIR [--sorl-lm-score BIN] [--atol X] [--record PATH]

The run's record (bench/record.py: tables "prompts" and "nll") goes to --record PATH, else
$SORL_BENCH_RECORD, else runs/bench/logits-parity-UTC.json.

Needs torch and transformers. Debian's python3-torch (1.13, `scripts/install-deps
--with-extras`) with transformers 4.40 in a virtualenv that sees it:
    /usr/bin/python3 -m venv --system-site-packages /tmp/tt && /tmp/tt/bin/pip install transformers==4.40.2
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Les mathématiques sont la reine des sciences, et l'arithmétique est la reine des mathématiques.",
]


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e["dtype"]
        b, t = e["data_offsets"]
        out[name] = np.frombuffer(data[base + b:base + t], dtype=np.float32).reshape(e["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--sorl-lm-score", default="build/bench/interop/sorl_lm_score")
    ap.add_argument("--atol", type=float, default=1e-3)
    record.add_record_argument(ap, "logits-parity")
    args = ap.parse_args()
    rec = record.Record("logits-parity", sorl=record.sorl_build_of_tool(args.sorl_lm_score))
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    rec.set_threads(torch.get_num_threads())
    c = record.column
    per_prompt = rec.add_table("prompts", "sorl_lm_score against transformers, fp32 logits per prompt",
                               [c("prompt", "prompt"), c("tokens", "tokens"),
                                c("max_delta", "max |Δ logit|", "", significant=2),
                                c("max_logit", "max |logit|", "", 1), c("argmax_agreement", "argmax agreement", "", 3)])
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32)
    model.eval()
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.safetensors")
        run = subprocess.run([args.sorl_lm_score, args.model_dir, f"logits={dump}"],
                             input="\n".join(" ".join(map(str, x)) for x in ids), capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"sorl_lm_score failed: {run.stderr.strip()}")
        ours = read_safetensors(dump)
    ok = True
    nll_ref, nll_ours, count = 0.0, 0.0, 0
    for i, x in enumerate(ids):
        with torch.no_grad():
            ref = model(torch.tensor([x])).logits[0].float().numpy()
        o = ours[f"logits.{i}"]
        delta = float(np.abs(ref - o).max())
        agree = float((ref.argmax(-1) == o.argmax(-1)).mean())
        print(f"prompt {i}: {len(x):3d} tokens  max |delta logit| {delta:.2e}  max |logit| {np.abs(ref).max():.1f}  "
              f"argmax agreement {agree:.3f}")
        ok &= delta <= args.atol and agree == 1.0
        per_prompt["rows"].append([i, len(x), delta, float(np.abs(ref).max()), agree])
        for logits, acc in ((ref, "ref"), (o, "ours")):
            lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
            nll = -sum(lp[t - 1, x[t]] for t in range(1, len(x)))
            if acc == "ref":
                nll_ref += nll
            else:
                nll_ours += nll
        count += len(x) - 1
    print(f"mean next-token NLL: transformers {nll_ref / count:.5f}, sorl {nll_ours / count:.5f} ({count} tokens)")
    print("PASS" if ok else "FAIL")
    rec.set_parameter("model_dir", record.display_path(args.model_dir))
    rec.set_parameter("atol", args.atol)
    rec.set_parameter("torch", torch.__version__)
    rec.set_parameter("transformers", transformers.__version__)
    rec.add_table("nll", "mean next-token NLL over the prompts, transformers the baseline",
                  [c("model", "model"), c("nll", "mean NLL", "nats", 5), c("tokens", "tokens")],
                  [["transformers", nll_ref / count, count], ["sorl", nll_ours / count, count]], baseline_rows=[0])
    rec.add_table("verdict", f"max |Δ| <= {args.atol:g} and every argmax equal", [c("verdict", "verdict")],
                  [["PASS" if ok else "FAIL"]])
    path = record.record_path("logits-parity", args.record)
    if rec.write(path):
        record.note_written(path)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
