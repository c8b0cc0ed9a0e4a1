#!/usr/bin/python3
"""One table over the seeds of bench/sagc/real_run.sh: per policy, the wall-clock to the
held-out target in each seed, its mean, and the ratio of the best static G's time to the
policy's time (> 1: the policy got there sooner), then the steps to the target in each seed
(which do not depend on the machine's speed that day), with mean G and the straggler shares
averaged over the seeds.

    real_run_seeds.py RECORD... [--record PATH]

Each RECORD is the record real_run_table.py wrote for one seed (table "policies"); a policy
missing from a seed, or one that never reached the target there, leaves that seed's cell
empty and its ratio out. The output record takes its sorl build and machine from the first
RECORD. Exit 2 with the file named when a record cannot be read or has no "policies" table."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)


def policies_of(path):
    """{policy: {column key: cell}} of one seed's record; raises ValueError naming the file."""
    data = record.load(path)
    t = record.table(data, "policies")
    if t is None:
        raise ValueError(f"{path}: no table 'policies' (not a real_run_table.py record)")
    keys = [c["key"] for c in t["columns"]]
    return data, {row[0]: dict(zip(keys, row)) for row in t["rows"]}


def best_static(rows):
    """Seconds of the static policy that reached the held-out target first; None if none did."""
    times = [r["to_heldout_s"] for p, r in rows.items()
             if p.startswith("static") and r.get("to_heldout_s") is not None]
    return min(times) if times else None


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarise(seeds):
    """Rows [policy, seconds per seed..., mean seconds, mean ratio best static / policy,
    steps per seed..., mean G, mean event share under the arm's rule, mean token-straggler
    group share], policies in the order the first seed lists them, then any that only later
    seeds have."""
    order = []
    for rows in seeds:
        order += [p for p in rows if p not in order]
    out = []
    for p in order:
        times = [rows.get(p, {}).get("to_heldout_s") for rows in seeds]
        ratios = []
        for rows, t in zip(seeds, times):
            best = best_static(rows)
            if t and best:
                ratios.append(best / t)
        cells = [rows[p] for rows in seeds if p in rows]
        steps = [rows.get(p, {}).get("to_heldout_step") for rows in seeds]
        out.append([p] + times + [mean(times), mean(ratios)] + steps +
                                 [mean([c.get("mean_g") for c in cells]),
                                  mean([c.get("straggler_rate") for c in cells]),
                                  mean([c.get("group_rate") for c in cells])])
    return out


def main(paths, record_path):
    try:
        loaded = [policies_of(p) for p in paths]
    except (OSError, ValueError) as e:
        print(f"real_run_seeds.py: {e}", file=sys.stderr)
        return 2
    seeds = [rows for _, rows in loaded]
    rows = summarise(seeds)
    n = len(seeds)
    print(f"{'policy':<12} " + " ".join(f"{'seed ' + str(i + 1) + ' s':>10}" for i in range(n))
          + f" {'mean s':>8} {'best static / it':>16} "
          + " ".join(f"{'steps ' + str(i + 1):>7}" for i in range(n))
          + f" {'mean G':>6} {'strag':>6} {'groups':>6}")
    fmt = lambda v, f: "—" if v is None else format(v, f)
    for r in rows:
        print(f"{r[0]:<12} " + " ".join(f"{fmt(v, '.1f'):>10}" for v in r[1:1 + n])
              + f" {fmt(r[1 + n], '.1f'):>8} {fmt(r[2 + n], '.2f'):>16} "
              + " ".join(f"{fmt(v, 'd'):>7}" for v in r[3 + n:3 + 2 * n])
              + f" {fmt(r[3 + 2 * n], '.1f'):>6} {fmt(r[4 + 2 * n], '.3f'):>6}"
              f" {fmt(r[5 + 2 * n], '.3f'):>6}")
    if record_path and record_path != "none":
        first = loaded[0][0]
        rec = record.Record("sagc-real-seeds", sorl=first["sorl"], runtime=first.get("runtime"))
        rec.set_threads(first["machine"].get("threads_used"))
        rec.set_parameter("heldout_target", first.get("parameters", {}).get("heldout_target"))
        rec.set_parameter("seeds", [os.path.relpath(p, record.repo_root()) for p in paths])
        c = record.column
        cols = [c("policy", "policy")]
        cols += [c(f"seed{i + 1}_s", f"seed {i + 1}, to held-out target", "s", 1) for i in range(n)]
        cols += [c("mean_s", "mean", "s", 1), c("best_static_over", "best static / it", "", 2)]
        cols += [c(f"seed{i + 1}_steps", f"seed {i + 1}, steps") for i in range(n)]
        cols += [c("mean_g", "mean G", "", 1), c("straggler_rate", "steps with a straggler", "", 3),
                 c("group_rate", "groups with a token straggler", "", 3)]
        t = rec.add_table("seeds", "per policy over the seeds: wall-clock to the held-out target", cols)
        for r in rows:
            if not r[0].startswith("sagc"):
                t.setdefault("baseline_rows", []).append(len(t["rows"]))
            t["rows"].append(r)
        if rec.write(record_path):
            record.note_written(record_path)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="real_run_seeds.py")
    parser.add_argument("records", nargs="+", help="one real_run_table.py record per seed")
    record.add_record_argument(parser, "sagc-real-seeds")
    args = parser.parse_args()
    sys.exit(main(args.records, args.record))
