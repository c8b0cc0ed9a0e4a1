#!/usr/bin/python3
"""SALT against plain GRPO / DAPO over group sizes and seeds, on `sorl train` runs.

    bench/salt/salt_eval.py [--config FILE] [--steps N] [--eval-every N] [--prompts P]
        [--groups "8 16 32"] [--seeds "1 2 3"] [--arms "grpo grpo+measure grpo+salt grpo+salt4
        dapo dapo+salt4"] [--target R] [--jobs J] [--out DIR] [--table-only] [--record PATH]

Each arm is a config made from FILE (default configs/default.toml) with the run name, output
directory, steps, seed, run.eval_every, algorithm.prompts_per_step, a static group size G and
the arm's [algorithm] and [salt] settings replaced; everything else (model, warm start, task,
learning rate, sampling) is FILE's, so the arms of one (G, seed) differ in their update only.

  grpo          GRPO as published: sequence-level loss, symmetric clip 0.2, no dynamic sampling
  dapo          DAPO: token-level loss, clip-higher 0.28, dynamic sampling, soft overlong shaping
  +measure      SALT on with beta = 0: the plain update bit for bit (actors/learner/salt.hpp),
                so its c and update norm are plain GRPO's own; costs what K costs
  +salt         SALT with its defaults (c0 = 0.5)
  +salt4        SALT with c0 = 4: amplifies whenever c < 4, i.e. on these tasks nearly always

J runs go side by side (default 2, each on one libtorch thread: run.threads); the arms of one
(G, seed) are queued together so that they share the machine alike. Then one table per G:
held-out greedy accuracy (the task's eval_prompts, every --eval-every steps; the records of
metrics.jsonl, so the evaluations before the first step and after the last are not among
them) at the middle and last evaluation, steps to the first evaluation at or above --target
(default: halfway between the plain arm's mean accuracy at its first and last evaluation), learner seconds per step and its overhead over the plain
arm of the same algorithm, and SALT's mean c, gamma, rank and update norm before / after.
Means over seeds with their spread (min..max). Runs land in DIR (default runs/salt-eval);
the table goes to DIR/table.md and stdout, held-out curves to DIR/heldout.png when
matplotlib is there. --table-only rebuilds the table from the runs already in DIR. The run's
record (bench/record.py: one table per G, "g8", "g16", ..., the plain arms the baselines; the
build of build/sorl, which with --table-only may not be the one that made the runs) goes to
--record PATH, else $SORL_BENCH_RECORD, else runs/bench/salt-eval-UTC.json.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import record  # noqa: E402  (bench/record.py)

ALGORITHMS = {
    "grpo": {"name": '"grpo"', "dynamic_sampling": "false", "clip_eps_high": "0.2",
             "loss_norm": '"sequence"'},
    "dapo": {"name": '"dapo"', "dynamic_sampling": "true", "clip_eps_high": "0.28",
             "loss_norm": '"token"'},
}
SALT = {
    "": None,
    "measure": {"enabled": "true", "beta": "0.0"},
    "salt": {"enabled": "true"},
    "salt4": {"enabled": "true", "c0": "4.0"},
}


def parse_arm(arm):
    algo, _, salt = arm.partition("+")
    if algo not in ALGORITHMS or salt not in SALT:
        sys.exit(f"salt_eval: unknown arm {arm!r} (ALGO[+measure|+salt|+salt4], ALGO grpo or dapo)")
    return algo, salt


def set_key(text, table, key, value, config):
    """TOML text with [table]'s `key` set to `value` (its line replaced, or added at the top
    of the table); the table is appended when FILE has none."""
    m = re.search(r"(?ms)^\[" + re.escape(table) + r"\]\n(.*?)(?=^\[|\Z)", text)
    if not m:
        return text.rstrip("\n") + f"\n\n[{table}]\n{key} = {value}\n"
    body, n = re.subn(r"(?m)^" + re.escape(key) + r" = [^\n]*", lambda _: f"{key} = {value}", m.group(1), count=1)
    if n == 0:
        body = f"{key} = {value}\n" + body
    return text[:m.start(1)] + body + text[m.end(1):]


def make_config(base, config_path, out, arm, g, seed, args):
    algo, salt = parse_arm(arm)
    text = base
    # A checkpoint or data path relative to the config's folder becomes absolute.
    here = os.path.dirname(config_path)
    text = re.sub(r'(?m)^(checkpoint|hf_dir|path|eval_path) = "(?!/)([^"]+)"',
                  lambda m: f'{m.group(1)} = "{os.path.normpath(os.path.join(here, m.group(2)))}"', text)
    name = run_name(arm, g, seed)
    for key, value in (("name", f'"{name}"'), ("output_dir", f'"{out}"'), ("steps", str(args.steps)),
                       ("seed", str(seed)), ("eval_every", str(args.eval_every)),
                       ("checkpoint_every", str(args.steps)), ("threads", "1")):
        text = set_key(text, "run", key, value, config_path)
    text = set_key(text, "algorithm", "prompts_per_step", str(args.prompts), config_path)
    for key, value in ALGORITHMS[algo].items():
        text = set_key(text, "algorithm", key, value, config_path)
    # [sagc] and [salt] are the arm's alone: FILE's own tables go.
    text = re.sub(r"(?ms)^\[(sagc|salt)\]\n.*?(?=^\[|\Z)", "", text)
    text = set_key(text, "sagc", "policy", '"static"', config_path)
    text = set_key(text, "sagc", "group_size", str(g), config_path)
    if SALT[salt]:
        for key, value in SALT[salt].items():
            text = set_key(text, "salt", key, value, config_path)
    return name, text


def run_name(arm, g, seed):
    return f"{arm.replace('+', '-')}-g{g}-s{seed}"


def records(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):
                out.append(json.loads(line))
    return out


def mean(v):
    v = [x for x in v if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(v) / len(v) if v else None


def summarise(recs):
    evals = [(r["step"], r["heldout_accuracy"]) for r in recs if r.get("heldout_accuracy") is not None]
    learn = [r["learn_s"] for r in recs if "learn_s" in r]
    s = {
        "evals": evals,
        "learn_s": mean(learn[1:] if len(learn) > 1 else learn),  # step 1 warms the caches
        "steps": max((r["step"] for r in recs), default=0),
    }
    for key in ("salt_cancellation", "salt_gamma", "salt_rank", "salt_norm_before", "salt_norm_after",
                "salt_share"):
        s[key] = mean([r.get(key) for r in recs])
    s["reward"] = [r.get("reward_mean") for r in recs]
    return s


def fmt(values, digits=3, pct=False):
    v = [x for x in values if x is not None]
    if not v:
        return "—"
    f = (lambda x: f"{100 * x:.0f} %") if pct else (lambda x: f"{x:.{digits}f}")
    m = sum(v) / len(v)
    if len(v) == 1 or min(v) == max(v):
        return f(m)
    return f"{f(m)} ({f(min(v))}..{f(max(v))})"


def steps_to(evals, target):
    for step, acc in evals:
        if acc >= target - 1e-12:
            return step
    return None


def table(out, arms, groups, seeds, target):
    runs = {}
    for arm in arms:
        for g in groups:
            for seed in seeds:
                path = os.path.join(out, run_name(arm, g, seed), "metrics.jsonl")
                if os.path.exists(path):
                    runs[(arm, g, seed)] = summarise(records(path))
    lines = []
    detail = {}
    per_g = []  # (G, target, rows of cells as printed, indices of the plain arms' rows)
    for g in groups:
        base_of = {}
        # The target: halfway from the start to the plain arm's last evaluation, per G.
        t = target
        plain = [a for a in arms if "+" not in a] or arms[:1]
        if t is None:
            starts, ends = [], []
            for seed in seeds:
                r = runs.get((plain[0], g, seed))
                if r and r["evals"]:
                    starts.append(r["evals"][0][1])
                    ends.append(r["evals"][-1][1])
            t = (mean(starts) + mean(ends)) / 2 if starts else None
        lines.append(f"\nG = {g}" + (f", target held-out accuracy {t:.3f}" if t is not None else "") + "\n")
        lines.append("| arm | acc mid | acc last | steps to target | vs plain | learn s/step | overhead | c | γ | r | ‖Σa g‖ before → after |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        per_g.append((g, t, [], []))
        for arm in arms:
            rs = [runs[(arm, g, s)] for s in seeds if (arm, g, s) in runs]
            if not rs:
                continue
            algo, _ = parse_arm(arm)
            mids, lasts, reach, learn, over, speed = [], [], [], [], [], []
            for s in seeds:
                r = runs.get((arm, g, s))
                if not r:
                    continue
                ev = r["evals"]
                if ev:
                    mids.append(ev[len(ev) // 2][1])
                    lasts.append(ev[-1][1])
                st = steps_to(ev, t) if t is not None else None
                reach.append(st)
                learn.append(r["learn_s"])
                p = runs.get((algo, g, s))
                if p and p["learn_s"] and r["learn_s"]:
                    over.append(r["learn_s"] / p["learn_s"] - 1)
                ps = steps_to(p["evals"], t) if p and t is not None else None
                if ps is not None and st is not None:
                    speed.append(ps / st)
            reached = [x for x in reach if x is not None]
            reach_s = fmt(reached, 1) + (f", {len(reach) - len(reached)} of {len(reach)} never" if len(reached) < len(reach) else "")
            norms = "—"
            nb = [r["salt_norm_before"] for r in rs if r["salt_norm_before"] is not None]
            na = [r["salt_norm_after"] for r in rs if r["salt_norm_after"] is not None]
            if nb:
                norms = f"{fmt(nb)} → {fmt(na)}"
            cells = [arm, fmt(mids), fmt(lasts), reach_s, fmt(speed, 2) + '×' if speed else '—', fmt(learn),
                     fmt(over, pct=True) if arm != algo else '', fmt([r['salt_cancellation'] for r in rs], 2),
                     fmt([r['salt_gamma'] for r in rs], 2), fmt([r['salt_rank'] for r in rs], 1), norms]
            lines.append("| " + " | ".join(cells) + " |")
            if arm == algo:
                per_g[-1][3].append(len(per_g[-1][2]))
            per_g[-1][2].append(cells)
            detail[f"{arm} G{g}"] = {"seeds": [s for s in seeds if (arm, g, s) in runs], "steps_to_target": reach,
                                     "acc_last": lasts, "learn_s": learn, "overhead": over, "target": t}
    return "\n".join(lines) + "\n", runs, detail, per_g


def plot(out, runs, arms, groups, seeds):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("salt_eval: matplotlib missing (python3-matplotlib): no heldout.png", file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), sharey=True, squeeze=False)
    for ax, g in zip(axes[0], groups):
        for i, arm in enumerate(arms):
            curves = [runs[(arm, g, s)]["evals"] for s in seeds if (arm, g, s) in runs]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            steps = [curves[0][k][0] for k in range(n)]
            acc = [sum(c[k][1] for c in curves) / len(curves) for k in range(n)]
            ax.plot(steps, acc, marker=".", linewidth=1.4, label=arm, color=f"C{i}")
        ax.set_title(f"G = {g}")
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(f"held-out accuracy (mean of {len(seeds)} seeds)")
    axes[0][-1].legend(loc="lower right")
    fig.tight_layout()
    path = os.path.join(out, "heldout.png")
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser(prog="bench/salt/salt_eval.py", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/default.toml")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--groups", default="8 16 32")
    ap.add_argument("--seeds", default="1 2 3")
    ap.add_argument("--arms", default="grpo grpo+measure grpo+salt grpo+salt4 dapo dapo+salt4")
    ap.add_argument("--target", type=float)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--table-only", action="store_true")
    record.add_record_argument(ap, "salt-eval")
    args = ap.parse_args()
    record_path = record.record_path("salt-eval", args.record)
    if record_path != "none":
        record_path = os.path.abspath(record_path)  # before the chdir below
    os.chdir(ROOT)
    groups = [int(x) for x in args.groups.split()]
    seeds = [int(x) for x in args.seeds.split()]
    arms = args.arms.split()
    for a in arms:
        parse_arm(a)
    if args.steps < 1 or args.eval_every < 1 or args.prompts < 1 or args.jobs < 1 or not groups or not seeds:
        sys.exit("salt_eval: --steps, --eval-every, --prompts, --jobs must be >= 1, --groups and --seeds non-empty")
    config = os.path.abspath(args.config)
    if not os.path.exists(config):
        sys.exit(f"salt_eval: no config {args.config}")
    out = os.path.abspath(args.out or os.path.join("runs", "salt-eval"))
    os.makedirs(out, exist_ok=True)
    sorl = os.path.join(ROOT, "build", "sorl")
    rec = record.Record("salt-eval", threads=args.jobs, sorl=record.sorl_build(sorl)) if record_path != "none" else None

    if not args.table_only:
        base = open(config).read()
        # The warm start first, alone: every arm then starts from the same checkpoint.
        jobs = []
        for g in groups:
            for seed in seeds:
                for arm in arms:
                    name, text = make_config(base, config, out, arm, g, seed, args)
                    path = os.path.join(out, name + ".toml")
                    with open(path, "w") as f:
                        f.write(text)
                    jobs.append((name, path))
        first = jobs[0]
        total = len(jobs)
        done = [0]
        t0 = time.time()

        def run(job):
            name, path = job
            with open(os.path.join(out, name + ".log"), "w") as log:
                rc = subprocess.call([sorl, "train", path, "--overwrite"], stdout=log, stderr=subprocess.STDOUT)
            done[0] += 1
            print(f"[{done[0]}/{total}] {name}: {'ok' if rc == 0 else f'FAILED rc {rc} (see {name}.log)'}  "
                  f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            return rc

        rcs = [run(first)]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            rcs += list(pool.map(run, jobs[1:]))
        if any(rcs):
            print(f"salt_eval: {sum(1 for r in rcs if r)} of {total} runs failed", file=sys.stderr)

    text, runs, detail, per_g = table(out, arms, groups, seeds, args.target)
    # The plain update and SALT with beta = 0 must train identically (the bit-exact guarantee).
    for g in groups:
        for s in seeds:
            for algo in ALGORITHMS:
                a, b = runs.get((algo, g, s)), runs.get((algo + "+measure", g, s))
                if a and b and a["reward"] != b["reward"]:
                    text += f"\nWARNING: {algo} and {algo}+measure differ at G = {g}, seed {s}\n"
    header = (f"SALT evaluation: {os.path.relpath(config, ROOT)}, {args.steps} steps, {args.prompts} prompts per step, "
              f"held-out every {args.eval_every} steps, seeds {' '.join(map(str, seeds))}; "
              "means over seeds (min..max)\n")
    text = header + text
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(detail, f, indent=1)
    print(text)
    p = plot(out, runs, arms, groups, seeds)
    if p:
        print(p)
    if rec is not None:
        write_record(rec, record_path, out, sorl, args, config, seeds, per_g)


def write_record(rec, path, out, sorl, args, config, seeds, per_g):
    """The tables printed, one per G, into the run's record."""
    logs = sorted(f for f in os.listdir(out) if f.endswith(".log"))
    log_text = open(os.path.join(out, logs[0]), encoding="utf-8", errors="replace").read() if logs else None
    rec.data["runtime"] = record.sorl_runtime(sorl, log_text)
    for key, value in (("config", os.path.relpath(config, ROOT)), ("steps", args.steps), ("prompts", args.prompts),
                       ("eval_every", args.eval_every), ("seeds", " ".join(map(str, seeds))), ("jobs", args.jobs)):
        rec.set_parameter(key, value)
    c = record.column
    for g, target, rows, plain in per_g:
        title = f"G = {g}, means over seeds (min..max)" + (f"; target held-out accuracy {target:.3f}" if target else "")
        rec.add_table(f"g{g}", title,
                      [c("arm", "arm"), c("acc_mid", "held-out, middle evaluation"), c("acc_last", "held-out, last"),
                       c("steps_to_target", "steps to target"), c("vs_plain", "vs plain"),
                       c("learn_s", "learner", "s/step"), c("overhead", "overhead"), c("c", "c"), c("gamma", "γ"),
                       c("rank", "r"), c("norms", "‖Σa g‖ before → after")], rows, plain)
    if rec.write(path):
        record.note_written(path)


if __name__ == "__main__":
    main()
