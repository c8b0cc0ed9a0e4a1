#!/usr/bin/python3
"""Table of bench/sagc/real_run.sh:
real_run_table.py RUNS_DIR TARGET POLICY... [--heldout-target R] [--record PATH]

TARGET is the sampled-reward target (trailing 5-step mean); R, when given, a held-out target:
the wall-clock until the first step whose greedy held-out accuracy (`heldout_accuracy`,
recorded every run.eval_every steps) is ≥ R, summing wall_s, which leaves the evaluations'
own time (eval_s) out. --record PATH writes the run's record (bench/record.py: table
"policies", the static and deadline rows the baselines), naming build/sorl's build and the
first policy's CPU kernels (RUNS_DIR/POLICY.log)."""
import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)


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


def write_record(path, out, target, heldout_target, policies, rows, by_g):
    binary = os.path.join(record.repo_root(), "build", "sorl")
    log = open(f"{out}/{policies[0]}.log", encoding="utf-8", errors="replace").read()
    rec = record.Record("sagc-real-run", sorl=record.sorl_build(binary), runtime=record.sorl_runtime(binary, log))
    rec.set_threads(record.run_threads(f"{out}/{policies[0]}"))
    rec.set_parameter("target_reward", target)
    rec.set_parameter("heldout_target", heldout_target)
    c = record.column
    t = rec.add_table("policies", "per group-size policy: wall-clock to the targets, reward, held-out accuracy",
                      [c("policy", "policy"), c("steps", "steps"), c("mean_g", "mean G", "", 1),
                       c("wall_s", "wall", "s", 1), c("to_target_s", "to target", "s", 1),
                       c("to_target_step", "at step"), c("to_heldout_s", "to held-out target", "s", 1),
                       c("to_heldout_step", "at step"), c("reward_first5", "reward steps 1-5", "", 3),
                       c("reward_last5", "reward last 5", "", 3), c("heldout_before", "held-out before", "", 2),
                       c("heldout_after", "held-out after", "", 2), c("len_p50", "length p50", "tokens", 1),
                       c("len_p99", "length p99", "tokens", 1), c("straggler_rate", "steps with a straggler", "", 3),
                       c("group_rate", "groups with a token straggler", "", 3),
                       c("rollout_s", "rollout", "s", 2),
                       c("len_mean_end", "mean trained response, last 3 steps", "tokens", 1),
                       c("heldout_len_end", "held-out mean length at the end", "tokens", 1)])
    for r in rows:
        if not r["policy"].startswith("sagc"):
            t.setdefault("baseline_rows", []).append(len(t["rows"]))
        reach, h = r["reach"] or (None, None), r["heldout_reach"] or (None, None)
        t["rows"].append([r["policy"], r["steps"], r["g"], r["total"], reach[1], reach[0], h[1], h[0], r["first"],
                          r["final"], r["before"], r["after"], r["length"], r["length99"], r["rate"],
                          r["group_rate"], r["rollout"], r["len_end"], r["heldout_len_end"]])
    if by_g:
        rec.add_table("group-events", "groups with a token straggler over each static run's first 5 "
                      "steps, measured and as the smallest G predicts for independent rollouts",
                      [c("g", "G"), c("groups", "groups judged"), c("measured", "measured share", "", 3),
                       c("independent", "independent rollouts", "", 3)],
                      [[g, n, r, pred] for g, n, r, pred in by_g])
    if rec.write(path):
        record.note_written(path)


def group_share(recs):
    """Groups with a rollout longer than kappa x their median tokens over the groups judged
    (metrics groups_judged / group_events, actors/sagc/timing.hpp), whichever rule the run used;
    None when no step reports them."""
    judged = sum(r.get("groups_judged", 0) for r in recs)
    return sum(r.get("group_events", 0) for r in recs) / judged if judged else None


def group_events_by_g(per_policy, first_steps=5):
    """Per static policy over its first `first_steps` steps (the same starting policy in every
    run): (G, groups judged, share with a token straggler, the share the smallest static G
    predicts for G if rollouts were independent: 1 - (1 - r0)^(G / G0), the extrapolation
    SAGC's P(event | G) makes, actors/sagc/timing.hpp). [] without two static policies."""
    found = []
    for p, recs in per_policy.items():
        if not p.startswith("static"):
            continue
        head = recs[:first_steps]
        judged = sum(r.get("groups_judged", 0) for r in head)
        if judged:
            found.append((int(p[len("static"):]), int(judged), sum(r.get("group_events", 0) for r in head) / judged))
    found.sort()
    if len(found) < 2:
        return []
    g0, _, r0 = found[0]
    return [(g, n, r, 1 - (1 - r0) ** (g / g0)) for g, n, r in found]


def main(out, target, policies, heldout_target=None, record_path=None):
    rows = []
    per_policy = {}
    for p in policies:
        recs = [json.loads(l) for l in open(f"{out}/{p}/metrics.jsonl") if l.strip()]
        recs.sort(key=lambda r: r["step"])
        per_policy[p] = recs
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
        # A run that stopped at run.stop_at_accuracy has no "after" evaluation: its last
        # evaluation during the run is the final one.
        during = [r["heldout_accuracy"] for r in recs if r.get("heldout_accuracy") is not None]
        if "after" not in accs and during:
            accs["after"] = during[-1]
        events = [r.get("straggler_event") for r in recs if r.get("straggler_event") is not None]
        lens = [r.get("resp_len_p50") for r in recs if r.get("resp_len_p50") is not None]
        lens99 = [r.get("resp_len_p99") for r in recs if r.get("resp_len_p99") is not None]
        # The trained responses' mean length over the last 3 steps: the learner counts every
        # token of every rollout it trains once (metrics tokens_trained / trained_rollouts).
        tail = recs[-3:]
        trained = sum(r.get("trained_rollouts", 0) for r in tail)
        len_end = sum(r.get("tokens_trained", 0) for r in tail) / trained if trained else None
        held_lens = [r["heldout_len"] for r in recs if r.get("heldout_len") is not None]
        rows.append(dict(policy=p, steps=len(recs), total=sum(walls), reach=reach,
                         len_end=len_end, heldout_len_end=held_lens[-1] if held_lens else None,
                         heldout_reach=heldout_reach(recs, heldout_target),
                         final=sum(rewards[-5:]) / max(1, len(rewards[-5:])),
                         first=sum(rewards[:5]) / max(1, len(rewards[:5])),
                         before=accs.get("before"), after=accs.get("after"),
                         length=sum(lens) / max(1, len(lens)),
                         length99=sum(lens99) / max(1, len(lens99)),
                         rate=sum(events) / max(1, len(events)),
                         group_rate=group_share(recs),
                         g=sum(r.get("G", 0) for r in recs) / max(1, len(recs)),
                         rollout=sum(r.get("rollout_s", 0) for r in recs) / max(1, len(recs))))
    fmt = lambda v, f: "n/a" if v is None else format(v, f)
    print(f"target reward {target} (trailing 5-step mean of the sampled reward)")
    if heldout_target is not None:
        print(f"held-out target {heldout_target} (first step whose greedy held-out accuracy, "
              f"every run.eval_every steps, is ≥ it; wall_s summed, evaluations left out)")
    print(f"{'policy':<12} {'steps':>5} {'mean G':>6} {'wall s':>7} {'to target s':>11} "
          f"{'(step)':>6} {'to target held-out':>18} {'reward 1-5':>10} {'last 5':>7} "
          f"{'held-out':>13} {'len p50':>7} {'len p99':>7} {'strag rate':>10} {'group rate':>10} "
          f"{'rollout s':>9} {'len end':>7} {'held len':>8}")
    for r in rows:
        reach_s = fmt(r["reach"][1] if r["reach"] else None, ".1f")
        reach_step = str(r["reach"][0]) if r["reach"] else "-"
        h = r["heldout_reach"]
        heldout_s = f"{h[1]:.1f} (step {h[0]})" if h else "—"
        held = f"{fmt(r['before'], '.2f')}→{fmt(r['after'], '.2f')}"
        print(f"{r['policy']:<12} {r['steps']:>5} {r['g']:>6.1f} {r['total']:>7.1f} {reach_s:>11} "
              f"{reach_step:>6} {heldout_s:>18} {r['first']:>10.3f} {r['final']:>7.3f} "
              f"{held:>13} {r['length']:>7.1f} {r['length99']:>7.1f} {r['rate']:>10.3f} "
              f"{fmt(r['group_rate'], '>10.3f')} {r['rollout']:>9.2f} {fmt(r['len_end'], '>7.1f')} "
              f"{fmt(r['heldout_len_end'], '>8.1f')}")
    by_g = group_events_by_g(per_policy)
    if by_g:
        print(f"groups with a token straggler in each static run's first 5 steps, against the share "
              f"static {by_g[0][0]}'s predicts if rollouts were independent")
        print(f"{'G':>4} {'groups':>7} {'measured':>9} {'independent':>11}")
        for g, n, r, pred in by_g:
            print(f"{g:>4} {n:>7} {r:>9.3f} {pred:>11.3f}")
    for sagc in (r for r in rows if r["policy"].startswith("sagc")):
        compare_to_best_static(rows, sagc, "reach", "the target")
        compare_to_best_static(rows, sagc, "heldout_reach", "the held-out target")
    if record_path and record_path != "none":
        write_record(record_path, out, target, heldout_target, policies, rows, by_g)


def compare_to_best_static(rows, sagc, key, what):
    """One line: sagc's wall-clock to `what` (rows' `key`: (step, seconds) or None) against the
    static G that got there first, whatever its straggler rate."""
    statics = [r for r in rows if r["policy"].startswith("static") and r[key]]
    if not (sagc and statics):
        return
    best = min(statics, key=lambda r: r[key][1])
    if sagc[key]:
        print(f"{sagc['policy']} vs best static ({best['policy']}) to {what}: "
              f"{best[key][1] / sagc[key][1]:.2f}x faster")
    else:
        print(f"{sagc['policy']} did not reach {what}; {best['policy']} did in {best[key][1]:.1f} s")

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="real_run_table.py")
    parser.add_argument("runs_dir")
    parser.add_argument("target", type=float, help="sampled-reward target")
    parser.add_argument("policies", nargs="+")
    parser.add_argument("--heldout-target", type=float, default=None,
                        help="greedy held-out accuracy target (needs run.eval_every > 0)")
    record.add_record_argument(parser, "sagc-real-run")
    args = parser.parse_args()
    main(args.runs_dir, args.target, args.policies, args.heldout_target, args.record)
