#!/usr/bin/env python3
"""Reward parity: sorl's built-in reasoning checkers (runtime/ml/tasks/reasoning_checks.hpp, through
build/bench/interop/sorl_score_answers) against reasoning-gym's own score_answer, case by case.

For each task (countdown, gsm_symbolic) it makes seeded entries with reasoning-gym and, per
entry, answers of the kinds a policy writes: the reference answer; with spaces, parentheses or
an equivalent reordering; a number changed, dropped or repeated; another operator; the value
instead of an expression; extra words; an equals sign; empty text; unbalanced parentheses;
Python spellings sympy reads (**, ^, //, %, !, 1_000, .5, leading zeros); and for
gsm_symbolic the answer inside a sentence, with units, negative, decimal, or absent. Prints
per task the number of cases, how many scores are identical, a histogram of reasoning-gym's
scores, and the first mismatches. It then sends the same cases, each as a completion with the
answer in <answer> tags, to the reward-process scorer scripts/rewards/reasoning_gym_reward.py
(--adapter) in one protocol request and checks its rewards the same way. Exits 1 on any
mismatch.

    python3 bench/interop/reward_parity.py [--entries N] [--sorl-score-answers BIN] [--record PATH]

The run's record (bench/record.py: table "parity", one row per task and scorer) goes to
--record PATH, else $SORL_BENCH_RECORD, else runs/bench/reward-parity-UTC.json.

Needs reasoning-gym 0.1.25 (scripts/fetch-data installs it into .venv-data/; run this with
that virtualenv's python).
"""
import argparse
import collections
import json
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)

import reasoning_gym


def countdown_variants(e, rng):
    ref = e["answer"]
    nums = [int(x) for x in e["metadata"]["numbers"]]
    target = int(e["metadata"]["target"])
    out = [ref, " " + ref + " ", ref.replace(" ", ""), "(" + ref + ")", ref + " = " + str(target),
           "The answer is " + ref, "", "   ", str(target), ref + ")", "(" + ref, ref.replace("*", "x"),
           ref.replace("*", "**", 1), ref.replace("+", "^"), ref.replace("/", "//"), ref.replace("-", "%"),
           ref + " + 0", ref + " * 1", ref + "!", "0" + ref, ref.replace(" ", "\t"), ref + "\n",
           "-(" + ref + ")", "+" + ref, ref + " + 1 - 1", ref + " / 0", "1_000 + " + ref, ".5*2*(" + ref + ")",
           " + ".join(map(str, nums)), " * ".join(map(str, nums)), "(" + " - ".join(map(str, nums)) + ")"]
    # A number changed, dropped or repeated.
    ints = list(re.finditer(r"\d+", ref))
    if ints:
        m = rng.choice(ints)
        out.append(ref[:m.start()] + str(int(m.group()) + 1) + ref[m.end():])
        out.append(ref[:m.start()] + m.group() + m.group() + ref[m.end():])
        out.append(ref + " + " + m.group())
    # The numbers in another order and with other operators.
    shuffled = nums[:]
    rng.shuffle(shuffled)
    expr = str(shuffled[0])
    for n in shuffled[1:]:
        expr += rng.choice([" + ", " - ", " * ", " / "]) + str(n)
    out.append(expr)
    return out


def gsm_variants(e, rng):
    ref = str(e["answer"])
    v = int(float(ref))
    return [ref, " " + ref, ref + ".", "The answer is " + ref + ".", ref + " apples", "$" + ref,
            str(v + 1), "-" + ref, "x-" + ref, ref + ".0", ref + ".5", "about " + ref + " or " + str(v + 2),
            "", "none", "12abc " + ref, "3.14", "1,234", "answer: " + str(v - 1), "\u0663" + ref,
            "n" + ref, ref + "th", "(" + ref + ")", "-" + ref + "-"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100, help="entries per task")
    ap.add_argument("--sorl-score-answers", default="build/bench/interop/sorl_score_answers")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--adapter", default="scripts/rewards/reasoning_gym_reward.py",
                    help="the reward-process scorer to check too, with this python ('' to skip)")
    record.add_record_argument(ap, "reward-parity")
    args = ap.parse_args()
    rec = record.Record("reward-parity", threads=1, sorl=record.sorl_build_of_tool(args.sorl_score_answers))
    c = record.column
    table = rec.add_table("parity", "scores identical to reasoning-gym's score_answer, case by case",
                          [c("task", "task"), c("scorer", "scorer"), c("cases", "cases"), c("identical", "identical")])
    rng = random.Random(args.seed)
    ok = True
    for task, variants in (("countdown", countdown_variants), ("gsm_symbolic", gsm_variants)):
        ds = reasoning_gym.create_dataset(task, size=args.entries, seed=args.seed)
        cases = []
        for i in range(args.entries):
            e = ds[i]
            for a in variants(e, rng):
                cases.append((a, e))
        ref_scores = [ds.score_answer(a, e) for a, e in cases]
        lines = "\n".join(json.dumps({"task": task, "answer": a, "entry": e}, default=str) for a, e in cases)
        run = subprocess.run([args.sorl_score_answers], input=lines, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"sorl_score_answers failed: {run.stderr.strip()}")
        ours = [float(x) for x in run.stdout.split()]
        same = sum(1 for r, o in zip(ref_scores, ours) if r == o)
        hist = collections.Counter(ref_scores)
        print(f"{task}: {len(cases)} cases, {same} identical; reasoning-gym scores "
              + ", ".join(f"{k:g}: {v}" for k, v in sorted(hist.items())))
        shown = 0
        for (a, e), r, o in zip(cases, ref_scores, ours):
            if r != o and shown < 10:
                print(f"  MISMATCH answer={a!r} reasoning-gym={r} sorl={o}")
                shown += 1
        ok &= same == len(cases) == len(ours)
        table["rows"].append([task, "sorl_score_answers", len(cases), same])
        if args.adapter:
            ok &= check_adapter(args.adapter, task, ds, cases, table)
    rec.set_parameter("entries", args.entries)
    rec.set_parameter("seed", args.seed)
    rec.set_parameter("reasoning_gym", getattr(reasoning_gym, "__version__", "unknown"))
    path = record.record_path("reward-parity", args.record)
    if rec.write(path):
        record.note_written(path)
    sys.exit(0 if ok else 1)


def check_adapter(adapter, task, ds, cases, table):
    """The reward process speaks its protocol (runtime/ml/tasks/reward_process.hpp): every case sent
    as a completion with the answer in <answer> tags, in one request; its rewards must be
    reasoning-gym's score of the tagged answer, item by item."""
    from reasoning_gym.utils import extract_answer
    items = [{"prompt": e["question"], "completion": f"<answer>{a}</answer>", "answer": str(e["answer"]),
              "entry": json.loads(json.dumps(e, default=str))} for a, e in cases]
    request = json.dumps({"id": 1, "items": items})
    run = subprocess.run([sys.executable, adapter], input=request + "\n", capture_output=True, text=True)
    if run.returncode != 0 or not run.stdout.strip():
        print(f"  adapter failed (exit {run.returncode}): {run.stderr.strip()[-500:]}")
        return False
    reply = json.loads(run.stdout.splitlines()[0])
    want = [ds.score_answer(extract_answer(it["completion"]), e) for it, (_, e) in zip(items, cases)]
    got = reply.get("rewards", [])
    same = sum(1 for w, g in zip(want, got) if g is not None and w == g)
    print(f"{task}: reward process {adapter}: {len(items)} items in one request, {same} identical")
    table["rows"].append([task, adapter, len(items), same])
    for it, w, g in zip(items, want, got):
        if g != w:
            print(f"  MISMATCH completion={it['completion']!r} reasoning-gym={w} reward process={g}")
            break
    return reply.get("id") == 1 and same == len(items) == len(got)


if __name__ == "__main__":
    main()
