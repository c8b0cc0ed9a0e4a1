#!/usr/bin/python3
"""The table of bench/learner/onpolicy_run.sh: OUT_DIR ARM [ARM ...]

Reads OUT_DIR/ARM/metrics.jsonl for each arm (a `sorl train` run; the keys are in
runtime/metrics.hpp) and prints, per arm:
  - the train/inference mismatch at steps 1, 2, 5, 10, 20, 30, 40 (those the run has):
    mismatch_mean, mismatch_max, mismatch_k3, token_mult_prob_error, mismatch_bitwise;
    then the mean of mismatch_mean over steps 2..N and the largest mismatch_max;
  - the held-out greedy accuracy at each evaluation during the run (heldout_accuracy);
  - the mean sampled reward and the median response length per quarter of the run;
  - the mean step time split over the steps after the first (rollout_s, learn_s, sync_s).
The evaluations before and after the run are in OUT_DIR/ARM.log's first and last lines.
"""

import json
import math
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def number(r, key):
    v = r.get(key)
    return float("nan") if v is None else float(v)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, arms = argv[0], argv[1:]
    for arm in arms:
        path = os.path.join(out_dir, arm, "metrics.jsonl")
        try:
            rs = load(path)
        except OSError as e:
            print(f"onpolicy_table: {path}: {e}", file=sys.stderr)
            return 1
        if not rs:
            print(f"onpolicy_table: {path}: no records", file=sys.stderr)
            return 1
        print(f"== learner_weights = {arm} ({len(rs)} steps)")
        print(f"{'step':>4} {'mean |Δ|':>10} {'max |Δ|':>10} {'k3':>10} {'mult_err':>9} {'bitwise':>8}")
        for r in rs:
            if r["step"] in (1, 2, 5, 10, 20, 30, 40):
                print(f"{r['step']:>4} {number(r, 'mismatch_mean'):>10.3g} {number(r, 'mismatch_max'):>10.3g} "
                      f"{number(r, 'mismatch_k3'):>10.3g} {number(r, 'token_mult_prob_error'):>9.4f} "
                      f"{number(r, 'mismatch_bitwise'):>8.4f}")
        later = [number(r, "mismatch_mean") for r in rs[1:] if not math.isnan(number(r, "mismatch_mean"))]
        if later:
            print(f"mean of mismatch_mean over steps 2-{rs[-1]['step']}: {statistics.mean(later):.3g} nats; "
                  f"largest mismatch_max {max(number(r, 'mismatch_max') for r in rs):.3g}")
        evals = [(r["step"], r["heldout_accuracy"]) for r in rs if r.get("heldout_accuracy") is not None]
        if evals:
            print("held-out accuracy during the run: " + ", ".join(f"step {s} {a:.3f}" for s, a in evals))
        q = max(1, len(rs) // 4)
        quarters = [rs[i:i + q] for i in range(0, len(rs), q)]
        print("reward per quarter: " + ", ".join(f"{statistics.mean(number(r, 'reward_mean') for r in part):.3f}"
                                                 for part in quarters))
        print("median response length per quarter (tokens): "
              + ", ".join(f"{statistics.median(number(r, 'resp_len_p50') for r in part):.0f}" for part in quarters))
        timed = rs[1:] or rs
        split = " | ".join(f"{k[:-2]} {statistics.mean(number(r, k) for r in timed):.1f}"
                           for k in ("rollout_s", "learn_s", "sync_s"))
        print(f"step time, mean of steps after the first (s): {split}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
