#!/usr/bin/python3
"""The table of bench/learner/onpolicy_run.sh: OUT_DIR ARM [ARM ...] [--record PATH]

Reads OUT_DIR/ARM/metrics.jsonl for each arm (a `sorl train` run; the keys are in
runtime/metrics.hpp) and prints, per arm:
  - the train/inference mismatch at steps 1, 2, 5, 10, 20, 30, 40 (those the run has):
    mismatch_mean, mismatch_max, mismatch_k3, token_mult_prob_error, mismatch_bitwise;
    then the mean of mismatch_mean over steps 2..N and the largest mismatch_max;
  - the held-out greedy accuracy at each evaluation during the run (heldout_accuracy);
  - the mean sampled reward and the median response length per quarter of the run;
  - the mean step time split over the steps after the first (rollout_s, learn_s, sync_s).
The evaluations before and after the run are in OUT_DIR/ARM.log's first and last lines.
With --record PATH it writes the run's record (bench/record.py: tables "mismatch" and "arms"),
naming build/sorl's build and the first arm's CPU kernels (OUT_DIR/ARM.log).
"""

import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)

STEPS_SHOWN = (1, 2, 5, 10, 20, 30, 40)


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def number(r, key):
    v = r.get(key)
    return float("nan") if v is None else float(v)


def heldout_before_after(out_dir, arm):
    """The greedy held-out accuracy before and after the run, from OUT_DIR/ARM.log (None each
    when the log lacks it)."""
    try:
        with open(os.path.join(out_dir, arm + ".log"), encoding="utf-8", errors="replace") as f:
            found = dict(re.findall(r"held-out accuracy \((before|after)[^)]*\): ([0-9.]+)", f.read()))
    except OSError:
        found = {}
    return tuple(float(found[k]) if k in found else None for k in ("before", "after"))


def new_record(out_dir, arms):
    binary = os.path.join(record.repo_root(), "build", "sorl")
    log = os.path.join(out_dir, arms[0] + ".log")
    log_text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else None
    rec = record.Record("onpolicy-run", threads=record.run_threads(os.path.join(out_dir, arms[0])),
                        sorl=record.sorl_build(binary), runtime=record.sorl_runtime(binary, log_text))
    c = record.column
    mismatch = rec.add_table("mismatch", "train/inference mismatch at the shown steps, per learner_weights arm",
                             [c("arm", "learner_weights"), c("step", "step"),
                              c("mean", "mean |Δ|", "nats", significant=2), c("max", "max |Δ|", "nats", significant=2),
                              c("k3", "k3", "", significant=2), c("mult_err", "token_mult_prob_error", "", 6),
                              c("bitwise", "bitwise equal", "%", 2)])
    arms_t = rec.add_table("arms", "per arm: the mismatch over steps 2..N, learning, and the mean step time after step 1",
                           [c("arm", "learner_weights"), c("steps", "steps"),
                            c("mean_mismatch", "mean of mean |Δ| over steps 2..N", "nats", significant=2),
                            c("largest_max", "largest max |Δ|", "nats", significant=2),
                            c("heldout_before", "held-out before", "", 3),
                            c("heldout", "held-out accuracy during the run"),
                            c("heldout_after", "held-out after", "", 3),
                            c("reward_quarters", "mean reward per quarter"),
                            c("length_quarters", "median response length per quarter", "tokens"),
                            c("rollout_s", "rollout", "s", 1), c("learn_s", "learn", "s", 1),
                            c("sync_s", "sync", "s", 1)])
    return rec, mismatch, arms_t


def main(argv):
    try:
        record_path, argv = record.pop_record_flag(argv)
    except ValueError as e:
        print(f"onpolicy_table: {e}", file=sys.stderr)
        return 2
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, arms = argv[0], argv[1:]
    rec = mismatch = arms_t = None
    if record_path and record_path != "none":
        try:
            rec, mismatch, arms_t = new_record(out_dir, arms)
        except RuntimeError as e:
            print(f"onpolicy_table: {e}", file=sys.stderr)
            return 1
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
            if r["step"] in STEPS_SHOWN:
                print(f"{r['step']:>4} {number(r, 'mismatch_mean'):>10.3g} {number(r, 'mismatch_max'):>10.3g} "
                      f"{number(r, 'mismatch_k3'):>10.3g} {number(r, 'token_mult_prob_error'):>9.4f} "
                      f"{number(r, 'mismatch_bitwise'):>8.4f}")
                if mismatch is not None:
                    mismatch["rows"].append([arm, r["step"], number(r, "mismatch_mean"), number(r, "mismatch_max"),
                                             number(r, "mismatch_k3"), number(r, "token_mult_prob_error"),
                                             100 * number(r, "mismatch_bitwise")])
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
        if arms_t is not None:
            before, after = heldout_before_after(out_dir, arm)
            arms_t["rows"].append([
                arm, len(rs), statistics.mean(later) if later else None,
                max(number(r, "mismatch_max") for r in rs), before,
                ", ".join(f"{a:.3f} (step {s})" for s, a in evals) or None, after,
                ", ".join(f"{statistics.mean(number(r, 'reward_mean') for r in part):.3f}" for part in quarters),
                ", ".join(f"{statistics.median(number(r, 'resp_len_p50') for r in part):.0f}" for part in quarters)]
                + [statistics.mean(number(r, k) for r in timed) for k in ("rollout_s", "learn_s", "sync_s")])
    if rec is not None:
        rec.set_parameter("out_dir", record.display_path(out_dir))
        if rec.write(record_path):
            record.note_written(record_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
