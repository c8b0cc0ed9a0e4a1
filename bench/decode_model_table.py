#!/usr/bin/env python3
"""One table of sorl's decode against this machine's limits and its peers, from one run.

    python3 bench/decode_model_table.py SORL_JSONL [BASELINES_JSONL]

SORL_JSONL is what `decode_model_bench --json` wrote (the limits, one line per batch size),
BASELINES_JSONL what `bench/decode_baselines.py --json` wrote on the same prompt
(bench/decode_model.sh runs both). Every figure is the median of its repeats, tokens/s of steady
decode; "rollouts" is sorl's whole rollout (prefill, decode, sampling) as a worker runs it.
Prints a Markdown table.
"""

import json
import statistics
import sys


def rows_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv):
    if not argv or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    sorl = rows_of(argv[0])
    peers = rows_of(argv[1]) if len(argv) > 1 else []
    limits = next(r for r in sorl if r["kind"] == "limits")
    peer_cols = sorted({(p["impl"], p["dtype"]) for p in peers})
    head = ["batch", "sorl", "sorl rollouts", "sorl before", "memory bound", "compute bound"]
    head += [f"{impl} {dtype}" for impl, dtype in peer_cols]
    hf_new = [c for c in peer_cols if c[0].startswith("hf-torch-2")]
    if hf_new:
        head.append("sorl / best " + hf_new[0][0])
    print(f"limits: streaming read {limits['read_gbs']:.1f} GB/s, fastest fp32 GEMM on the model's shapes "
          f"{max(limits['aten_gflops'], limits['onednn_gflops'], limits['bf16_linear_gflops']):.1f} GFLOP/s, "
          f"{limits['threads']} threads, bf16_linear {limits['isa']}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in (r for r in sorl if r["kind"] == "decode"):
        b = r["batch"]
        s = med(r["steady_tok_s"])
        cells = [str(b), f"{s:.1f}", f"{med(r['rollout_tok_s']):.1f}",
                 f"{med(r['before_tok_s']):.1f}" if r["before_tok_s"] else "-",
                 f"{r['mem_bound_tok_s']:.0f} ({100 * s / r['mem_bound_tok_s']:.0f} %)",
                 f"{r['compute_bound_tok_s']:.0f} ({100 * s / r['compute_bound_tok_s']:.0f} %)"]
        best = 0.0
        for impl, dtype in peer_cols:
            p = next((p for p in peers if p["impl"] == impl and p["dtype"] == dtype and p["batch"] == b), None)
            v = med(p["decode_tok_s"]) if p else float("nan")
            cells.append(f"{v:.1f}" if p else "-")
            if p and (impl, dtype) in hf_new:
                best = max(best, v)
        if hf_new:
            cells.append(f"{s / best:.2f}x" if best > 0 else "-")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
