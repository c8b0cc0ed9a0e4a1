#!/usr/bin/python3
"""Table of bench/sync/real_lr.sh:
real_lr_table.py RUNS_DIR RUN... [--record PATH]

Per run (RUNS_DIR/RUN/metrics.jsonl) and per step with a sparse delta: the changed fraction
of bf16 elements, the delta's bits per change, dense bf16 / int32 index + bf16 value (6 bytes
per change, the "raw" sparse format), dense / the delta as shipped, the delta against its
order-0 entropy bound (sync_bound_bytes / sync_sparse_bytes: 1 means the bound is reached),
and temporal locality (sync_recurring_fraction). Table "steps" has every step, keyed
RUN/STEP; table "lrs" one row per run: means over its steps, locality at its second delta
(the first that has an earlier delta to recur from) and its last. --record PATH writes both
(bench/record.py). Exit 2 naming the file when a run's metrics are missing or
carry no sparse delta."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)


def delta_rows(path):
    """[(step, changed fraction, bits per change, dense/naive, dense/ours, bound/ours,
    recurring)] of the steps of one metrics.jsonl whose sync carried a sparse delta."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            frac, ours, dense = r.get("sync_changed_fraction"), r.get("sync_sparse_bytes"), r.get("sync_dense_bytes")
            if frac is None or not ours or not dense or frac <= 0:
                continue
            elements = dense / 2.0
            changed = frac * elements
            bound = r.get("sync_bound_bytes")
            rows.append((r["step"], frac, 8.0 * ours / changed, dense / (6.0 * changed), dense / ours,
                         bound / ours if bound else None, r.get("sync_recurring_fraction")))
    return rows


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--record")
    a = ap.parse_args(argv)
    per_run = {}
    for name in a.runs:
        path = os.path.join(a.runs_dir, name, "metrics.jsonl")
        try:
            rows = delta_rows(path)
        except (OSError, ValueError, KeyError) as e:
            print(f"real_lr_table.py: {path}: {e}", file=sys.stderr)
            return 2
        if not rows:
            print(f"real_lr_table.py: {path}: no step with a sparse delta", file=sys.stderr)
            return 2
        per_run[name] = rows
    print(f"{'run':<10} {'step':>4} {'changed %':>10} {'bits/change':>11} {'dense/naive':>11} "
          f"{'dense/ours':>10} {'bound/ours':>10} {'recurring':>9}")
    summary = []
    for name, rows in per_run.items():
        for s, frac, bits, naive, ours, eff, rec in rows:
            print(f"{name:<10} {s:>4} {100 * frac:>10.3f} {bits:>11.2f} {naive:>11.1f} {ours:>10.1f} "
                  f"{'-' if eff is None else f'{eff:.3f}':>10} {'-' if rec is None else f'{rec:.3f}':>9}")
        cols = list(zip(*rows))
        recurring = [r for r in cols[6] if r is not None]
        summary.append([name, len(rows), 100 * mean(cols[1]), mean(cols[2]), mean(cols[3]), mean(cols[4]),
                        min(cols[4]), max(cols[4]), mean(cols[5]),
                        recurring[1] if len(recurring) > 1 else None,
                        recurring[-1] if len(recurring) > 1 else None])
    print()
    print(f"{'run':<10} {'deltas':>6} {'changed %':>10} {'bits/change':>11} {'dense/naive':>11} "
          f"{'dense/ours':>10} {'bound/ours':>10} {'recurring 2nd → last':>21}")
    for n, k, frac, bits, naive, ours, lo, hi, eff, r0, r1 in summary:
        print(f"{n:<10} {k:>6} {frac:>10.3f} {bits:>11.2f} {naive:>11.1f} {ours:>10.1f} "
              f"{'-' if eff is None else f'{eff:.3f}':>10} "
              f"{'-' if r0 is None else f'{r0:.3f}':>11} → {'-' if r1 is None else f'{r1:.3f}'}")
    if a.record:
        binary = os.path.join(record.repo_root(), "build", "sorl")
        first = a.runs[0]
        log_path = os.path.join(a.runs_dir, f"{first}.log")
        log = open(log_path, encoding="utf-8", errors="replace").read() if os.path.exists(log_path) else None
        rec = record.Record("sync-real-lr", sorl=record.sorl_build(binary), runtime=record.sorl_runtime(binary, log))
        rec.set_threads(record.run_threads(os.path.join(a.runs_dir, first)))
        c = record.column
        t = rec.add_table("steps", "per step with a sparse delta: its size against dense, naive sparse and its bound",
                          [c("run_step", "run/step"), c("changed_pct", "changed", "%", 3),
                           c("bits_per_change", "bits per change", "", 2),
                           c("dense_over_naive", "dense / index+value", "x", 1),
                           c("dense_over_ours", "dense / ours", "x", 1),
                           c("bound_over_ours", "bound / ours", "", 3),
                           c("recurring", "changed before", "", 3)])
        # One key per row ("lr3e-6/4"), so that a docs marker can pick a run's steps.
        for name, rows in per_run.items():
            for s, frac, *rest in rows:
                t["rows"].append([f"{name}/{s}", 100 * frac] + [record.clean_cell(v) for v in rest])
        t = rec.add_table("lrs", "per run: means over its deltas, locality at the second and the last",
                          [c("run", "run"), c("deltas", "deltas"), c("changed_pct", "changed", "%", 3),
                           c("bits_per_change", "bits per change", "", 2),
                           c("dense_over_naive", "dense / index+value", "x", 1),
                           c("dense_over_ours", "dense / ours", "x", 1),
                           c("dense_over_ours_min", "lowest", "x", 1),
                           c("dense_over_ours_max", "highest", "x", 1),
                           c("bound_over_ours", "bound / ours", "", 3),
                           c("recurring_second", "changed before, second delta", "", 3),
                           c("recurring_last", "last delta", "", 3)])
        for row in summary:
            t["rows"].append([record.clean_cell(v) for v in row])
        if rec.write(a.record):
            record.note_written(a.record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
