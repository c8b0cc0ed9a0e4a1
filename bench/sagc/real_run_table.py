#!/usr/bin/python3
"""Table of bench/sagc/real_run.sh:
real_run_table.py RUNS_DIR TARGET POLICY... [--heldout-target R]

TARGET is the sampled-reward target (trailing 5-step mean); R, when given, a held-out target:
the wall-clock until the first step whose greedy held-out accuracy (`heldout_accuracy`,
recorded every run.eval_every steps) is ≥ R, summing wall_s, which leaves the evaluations'
own time (eval_s) out."""
import argparse
import json
import math
import re


def heldout_reach(recs, target):
    """(step, seconds) of the first record whose heldout_accuracy ≥ target, seconds being the
    sum of wall_s through it (eval_s is not part of wall_s); None when none is, or none has
    the field."""
    if target is None:
        return None
    wall = 0.0
    for r in recs:
        wall += r.get("wall_s", 0.0)
        acc = r.get("heldout_accuracy")
        if acc is not None and acc >= target:
            return (r["step"], wall)
    return None


def main(out, target, policies, heldout_target=None):
    rows = []
    for p in policies:
        recs = [json.loads(l) for l in open(f"{out}/{p}/metrics.jsonl") if l.strip()]
        recs.sort(key=lambda r: r["step"])
        rewards = [r.get("reward_mean", 0.0) for r in recs]
        walls = [r.get("wall_s", 0.0) for r in recs]
        reach = None
        for i in range(4, len(recs)):
            if sum(rewards[i - 4:i + 1]) / 5 >= target:
                reach = (recs[i]["step"], sum(walls[:i + 1]))
                break
        log = open(f"{out}/{p}.log").read()
        acc = re.findall(r"held-out accuracy \((before|after)[^)]*\): ([0-9.]+)", log)
        accs = {k: float(v) for k, v in acc}
        events = [r.get("straggler_event") for r in recs if r.get("straggler_event") is not None]
        lens = [r.get("resp_len_p50") for r in recs if r.get("resp_len_p50") is not None]
        lens99 = [r.get("resp_len_p99") for r in recs if r.get("resp_len_p99") is not None]
        rows.append(dict(policy=p, steps=len(recs), total=sum(walls), reach=reach,
                         heldout_reach=heldout_reach(recs, heldout_target),
                         final=sum(rewards[-5:]) / max(1, len(rewards[-5:])),
                         first=sum(rewards[:5]) / max(1, len(rewards[:5])),
                         before=accs.get("before"), after=accs.get("after"),
                         length=sum(lens) / max(1, len(lens)),
                         length99=sum(lens99) / max(1, len(lens99)),
                         rate=sum(events) / max(1, len(events)),
                         g=sum(r.get("G", 0) for r in recs) / max(1, len(recs)),
                         rollout=sum(r.get("rollout_s", 0) for r in recs) / max(1, len(recs))))
    fmt = lambda v, f: "n/a" if v is None else format(v, f)
    print(f"target reward {target} (trailing 5-step mean of the sampled reward)")
    if heldout_target is not None:
        print(f"held-out target {heldout_target} (first step whose greedy held-out accuracy, "
              f"every run.eval_every steps, is ≥ it; wall_s summed, evaluations left out)")
    print(f"{'policy':<10} {'steps':>5} {'mean G':>6} {'wall s':>7} {'to target s':>11} "
          f"{'(step)':>6} {'to target held-out':>18} {'reward 1-5':>10} {'last 5':>7} "
          f"{'held-out':>13} {'len p50':>7} {'len p99':>7} {'strag rate':>10} {'rollout s':>9}")
    for r in rows:
        reach_s = fmt(r["reach"][1] if r["reach"] else None, ".1f")
        reach_step = str(r["reach"][0]) if r["reach"] else "-"
        h = r["heldout_reach"]
        heldout_s = f"{h[1]:.1f} (step {h[0]})" if h else "—"
        held = f"{fmt(r['before'], '.2f')}→{fmt(r['after'], '.2f')}"
        print(f"{r['policy']:<10} {r['steps']:>5} {r['g']:>6.1f} {r['total']:>7.1f} {reach_s:>11} "
              f"{reach_step:>6} {heldout_s:>18} {r['first']:>10.3f} {r['final']:>7.3f} "
              f"{held:>13} {r['length']:>7.1f} {r['length99']:>7.1f} {r['rate']:>10.3f} {r['rollout']:>9.2f}")
    sagc = next((r for r in rows if r["policy"] == "sagc"), None)
    compare_to_best_static(rows, sagc, "reach", "the target")
    compare_to_best_static(rows, sagc, "heldout_reach", "the held-out target")


def compare_to_best_static(rows, sagc, key, what):
    """One line: sagc's wall-clock to `what` (rows' `key`: (step, seconds) or None) against the
    static G that got there first, whatever its straggler rate."""
    statics = [r for r in rows if r["policy"].startswith("static") and r[key]]
    if not (sagc and statics):
        return
    best = min(statics, key=lambda r: r[key][1])
    if sagc[key]:
        print(f"sagc vs best static ({best['policy']}) to {what}: "
              f"{best[key][1] / sagc[key][1]:.2f}x faster")
    else:
        print(f"sagc did not reach {what}; {best['policy']} did in {best[key][1]:.1f} s")

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="real_run_table.py")
    parser.add_argument("runs_dir")
    parser.add_argument("target", type=float, help="sampled-reward target")
    parser.add_argument("policies", nargs="+")
    parser.add_argument("--heldout-target", type=float, default=None,
                        help="greedy held-out accuracy target (needs run.eval_every > 0)")
    args = parser.parse_args()
    main(args.runs_dir, args.target, args.policies, args.heldout_target)
