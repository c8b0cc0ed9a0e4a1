#!/usr/bin/env python3
"""One table of sorl's decode against this machine's limits and its peers, from one run.

    python3 bench/decode_model_table.py SORL_JSONL [BASELINES_JSONL] [--record PATH]

SORL_JSONL is what `decode_model_bench --json` wrote (the limits, one line per batch size),
BASELINES_JSONL what `bench/decode_baselines.py --json` wrote on the same prompt
(bench/decode_model.sh runs both). Every figure is the median of its repeats, tokens/s of steady
decode; "rollouts" is sorl's whole rollout (prefill, decode, sampling) as a worker runs it.
Prints a Markdown table. With --record PATH (the record decode_model_bench wrote in the same
run, bench/record.py), adds the peers' columns and sorl over the best transformers on the newest
torch to its "decode" table, so that the record holds the table printed here.
"""

import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402  (bench/record.py)


def rows_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def safe_key(text):
    """`text` as a record column key (letters, digits, '_', '.', '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def add_peers_to_record(path, peers, peer_cols, hf_new, ratios):
    """The peers' medians and sorl's ratio as columns of the record's "decode" table."""
    data = record.load(path)
    t = record.table(data, "decode")
    if t is None:
        raise SystemExit(f"decode_model_table: {path} has no \"decode\" table")
    for impl, dtype in peer_cols:
        t["columns"].append(record.column(safe_key(f"{impl}_{dtype}"), f"{impl} {dtype}", "tokens/s", 1,
                                          baseline=True))
    if hf_new:
        t["columns"].append(record.column("sorl_over_best_" + safe_key(hf_new[0][0]),
                                          "sorl / best " + hf_new[0][0], "x", 2))
    for row in t["rows"]:
        b = row[0]
        for impl, dtype in peer_cols:
            p = next((p for p in peers if p["impl"] == impl and p["dtype"] == dtype and p["batch"] == b), None)
            row.append(med(p["decode_tok_s"]) if p else None)
        if hf_new:
            row.append(ratios.get(b))
    record.write(data, path)


def main(argv):
    try:
        record_path, argv = record.pop_record_flag(argv)
    except ValueError as e:
        print(f"decode_model_table: {e}", file=sys.stderr)
        return 2
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
    ratios = {}
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
            ratios[b] = s / best if best > 0 else None
        print("| " + " | ".join(cells) + " |")
    if record_path and record_path != "none":
        add_peers_to_record(record_path, peers, peer_cols, hf_new, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
