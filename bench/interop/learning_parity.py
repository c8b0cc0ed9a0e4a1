#!/usr/bin/env python3
"""Does sorl learn as well as TRL? Both train the same experiment file over several seeds; one
evaluator (transformers in fp32, greedy, bench/interop/heldout_eval.py) scores both policies on
the held-out set every --eval-every steps, and the sampled training reward is compared over the
same prompts, step by step.

    python3 bench/interop/learning_parity.py [--config configs/smollm2-chain_sum.toml]
        [--seeds 1,2] [--trl-seeds 1,2] [--steps 40] [--eval-every 10] [--work runs/learning-parity]
        [--python PY] [--sorl build/sorl] [--record PATH]

Per seed S:
  sorl  `sorl train CONFIG` with run.seed = S, run.steps, run.checkpoint_every and
        run.eval_every = --eval-every, into WORK/sorl-seedS/; every checkpoint exported with
        `sorl export-hf --dtype fp32` (the bf16 weights its workers sample with, widened
        exactly) and scored by heldout_eval.py. sorl's own evaluation of the same weights
        (heldout_accuracy in its metrics.jsonl, bf16 kernels) goes beside it as a check of the
        evaluator.
  TRL   bench/interop/trl_grpo_compare.py --seed S --eval-every E (TRL's GRPOTrainer on the same
        file, the same prompts in the same order, fp32 throughout), its policy scored in its own
        process by the same function after the same steps.
The base model is scored once (step 0 of both). Both runs see the same prompts at the same step
(file order), so the per-step sampled rewards are paired; seeds change the sampling only.

Each part is kept in WORK as it finishes (sorl's run directory, TRL's --json, the evaluations)
and reused when the script is run again with the same WORK, so an interrupted comparison
resumes where it stopped. TRL's step is about 42 s on 2 cores, sorl's about 13 s, and each
evaluation about 40 s: 40 steps of two seeds take about 95 minutes alone on the machine. PY (default: the bench virtualenv's python,
~/.cache/sorl-bench-venv/bin/python, made by bench/setup-baselines, plus
`pip install trl==1.16.0`) runs TRL and the evaluator; this script needs only the standard
library.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import record  # noqa: E402  (bench/record.py)

sys.path.insert(0, HERE)
from trl_grpo_compare import read_experiment, read_sorl_metrics  # noqa: E402  (standard library only)

REPO = os.path.dirname(os.path.dirname(HERE))


def run(cmd, log=None):
    print("+ " + " ".join(record.shell_quote(c) for c in cmd), flush=True)
    if log:
        with open(log, "a", encoding="utf-8") as f:  # a resumed run adds to its log
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    else:
        p = subprocess.run(cmd)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}" + (f"; its output is in {log}" if log else ""))


def evaluate(a, models, out_json, settings):
    """heldout_eval.py on `models` (those not in out_json yet): {directory: result}."""
    done = {}
    if os.path.exists(out_json):
        with open(out_json, encoding="utf-8") as f:
            done = json.load(f)
    todo = [m for m in models if m not in done]
    if todo:
        part = out_json + ".part"
        run([a.python, os.path.join(HERE, "heldout_eval.py"), *todo, "--data", settings["eval_path"],
             "--max-new-tokens", str(settings["max_new_tokens"]), "--limit", str(settings["eval_prompts"]),
             "--threads", str(settings["threads"]), "--json", part])
        with open(part, encoding="utf-8") as f:
            done.update(json.load(f))
        with open(out_json, "w", encoding="utf-8") as f:
            json.dump(done, f, indent=1)
        os.remove(part)
    return done


def sorl_seed(a, settings, seed, eval_steps):
    """sorl's run of one seed: (per-step records, {step: transformers accuracy dict})."""
    name = f"sorl-seed{seed}"
    run_dir = os.path.join(a.work, name)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    steps = read_sorl_metrics(metrics) if os.path.exists(metrics) else {}
    if len(steps) < a.steps:
        resume = ["--resume"] if steps else []
        run([a.sorl, "train", a.config, *resume, "--set", f"run.seed={seed}", "--set", f"run.name={name}",
             "--set", f"run.output_dir={os.path.abspath(a.work)}", "--set", f"run.steps={a.steps}",
             "--set", f"run.checkpoint_every={a.eval_every}", "--set", f"run.eval_every={a.eval_every}"],
            log=os.path.join(a.work, f"{name}.log"))
        steps = read_sorl_metrics(metrics)
    exported = []
    for k in eval_steps:
        out = os.path.join(run_dir, f"hf-step{k}")
        if not os.path.isfile(os.path.join(out, "config.json")):
            ckpt = os.path.join(run_dir, "checkpoints", f"step-{k:010d}")
            run([a.sorl, "export-hf", a.config, out, "--checkpoint", ckpt, "--dtype", "fp32", "--overwrite"])
        exported.append(out)
    evals = evaluate(a, exported, os.path.join(a.work, f"{name}-heldout.json"), settings)
    return steps, {k: evals[d] for k, d in zip(eval_steps, exported)}


def trl_seed(a, seed):
    out = os.path.join(a.work, f"trl-seed{seed}.json")
    if not os.path.exists(out):
        run([a.python, os.path.join(HERE, "trl_grpo_compare.py"), "--config", a.config, "--seed", str(seed),
             "--steps", str(a.steps), "--eval-every", str(a.eval_every), "--json", out + ".part",
             "--record", "none"], log=os.path.join(a.work, f"trl-seed{seed}.log"))
        os.replace(out + ".part", out)
    with open(out, encoding="utf-8") as f:
        t = json.load(f)["trl"]
    return {r["step"]: r for r in t["steps"]}, {e["step"]: e for e in t["evals"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(REPO, "configs", "smollm2-chain_sum.toml"))
    ap.add_argument("--seeds", default="1,2", help="comma-separated run seeds (default 1,2)")
    ap.add_argument("--trl-seeds", help="TRL's seeds, when fewer than sorl's (its step takes about 3x as "
                    "long; default --seeds)")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per run (default 40)")
    ap.add_argument("--eval-every", type=int, default=10, help="steps between held-out evaluations (default 10)")
    ap.add_argument("--work", default=os.path.join("runs", "learning-parity"),
                    help="where the runs and evaluations are kept (default %(default)s)")
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/sorl-bench-venv/bin/python"),
                    help="the python with torch, transformers and trl (default %(default)s)")
    ap.add_argument("--sorl", default=os.path.join(REPO, "build", "sorl"), help="the sorl binary")
    record.add_record_argument(ap, "learning-parity")
    a = ap.parse_args()
    try:
        seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
        trl_seeds = [int(x) for x in (a.trl_seeds or a.seeds).split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seeds {a.seeds!r}, --trl-seeds {a.trl_seeds!r}: comma-separated integers")
    if not seeds or not trl_seeds or a.steps < 1 or a.eval_every < 1 or a.steps % a.eval_every:
        ap.error("needs a seed, --steps >= 1 and --eval-every >= 1 dividing --steps")
    for path, what in ((a.python, "--python"), (a.sorl, "--sorl")):
        if not os.access(path, os.X_OK):
            ap.error(f"{what} {path}: not an executable (bench/setup-baselines makes the bench "
                     f"virtualenv; scripts/build makes build/sorl)")
    settings = read_experiment(a.config)
    if not settings["eval_path"]:
        ap.error(f"{a.config}: no [task].eval_path to evaluate on")
    os.makedirs(a.work, exist_ok=True)
    try:
        sorl_build = record.sorl_build(a.sorl)
    except RuntimeError as e:
        ap.error(f"--sorl: {e}")
    rec = record.Record("learning-parity", threads=settings["threads"], sorl=sorl_build,
                        runtime=record.sorl_runtime(a.sorl))
    eval_steps = list(range(a.eval_every, a.steps + 1, a.eval_every))

    base = evaluate(a, [settings["model_dir"]], os.path.join(a.work, "base-heldout.json"), settings)
    base_acc = base[settings["model_dir"]]["accuracy"]
    arms = {"sorl": {}, "TRL": {}}
    for seed in seeds:
        arms["sorl"][seed] = sorl_seed(a, settings, seed, eval_steps)
    for seed in trl_seeds:
        arms["TRL"][seed] = trl_seed(a, seed)

    c = record.column
    windows = [(lo, min(lo + a.eval_every - 1, a.steps)) for lo in range(1, a.steps + 1, a.eval_every)]
    held_cols = [c("arm", "arm"), c("seed", "seed"), c("acc_0", "held-out, step 0", "", 3)] + \
                [c(f"acc_{k}", f"step {k}", "", 3) for k in eval_steps] + \
                [c(f"len_{eval_steps[-1]}", f"mean length, step {eval_steps[-1]}", "tokens", 1)]
    rew_cols = [c("arm", "arm"), c("seed", "seed")] + \
               [c(f"reward_{lo}_{hi}", f"sampled reward, steps {lo}-{hi}", "", 3) for lo, hi in windows] + \
               [c("reward_all", f"steps 1-{a.steps}", "", 3)]
    held_rows, rew_rows = [], []
    for arm in ("TRL", "sorl"):
        accs = {k: [] for k in eval_steps}
        rews = {w: [] for w in windows + [(1, a.steps)]}
        for seed in sorted(arms[arm]):
            steps, evals = arms[arm][seed]
            reward = {k: (r.get("reward") if arm == "TRL" else r.get("reward_mean")) for k, r in steps.items()}
            row = [arm, seed, base_acc] + [evals[k]["accuracy"] if k in evals else None for k in eval_steps]
            row.append(evals[eval_steps[-1]]["mean_length"] if eval_steps[-1] in evals else None)
            held_rows.append(row)
            for k in eval_steps:
                if k in evals:
                    accs[k].append(evals[k]["accuracy"])
            rrow = [arm, seed]
            for w in windows + [(1, a.steps)]:
                vals = [reward[k] for k in range(w[0], w[1] + 1) if reward.get(k) is not None]
                m = statistics.fmean(vals) if vals else None
                rrow.append(m)
                if m is not None:
                    rews[w].append(m)
            rew_rows.append(rrow)
        held_rows.append([arm, "mean", base_acc] + [statistics.fmean(v) if v else None for v in accs.values()] + [None])
        rew_rows.append([arm, "mean"] + [statistics.fmean(v) if v else None for v in rews.values()])
    n_trl = len(trl_seeds) + 1
    rec.add_table("heldout", f"held-out greedy accuracy ({settings['eval_prompts']} prompts of "
                  f"{record.display_path(settings['eval_path'])}, transformers fp32 for both), TRL the baseline",
                  held_cols, held_rows, baseline_rows=list(range(n_trl)))
    rec.add_table("reward", "mean sampled training reward (the same prompts at the same step in both)",
                  rew_cols, rew_rows, baseline_rows=list(range(n_trl)))
    # sorl's own evaluator (bf16 kernels) on the same weights, to check the shared evaluator.
    check = []
    for seed in seeds:
        steps, evals = arms["sorl"][seed]
        for k in eval_steps:
            own = steps.get(k, {}).get("heldout_accuracy")
            if k in evals and own is not None:
                check.append([seed, k, own, evals[k]["accuracy"]])
    rec.add_table("evaluators", "sorl's policy scored by sorl's own evaluation (bf16 kernels) and by "
                  "transformers fp32", [c("seed", "seed"), c("step", "step"), c("sorl_eval", "sorl's own", "", 3),
                                        c("hf_eval", "transformers fp32", "", 3)], check)
    rec.set_parameter("config", record.display_path(a.config))
    rec.set_parameter("seeds", a.seeds)
    rec.set_parameter("trl_seeds", a.trl_seeds or a.seeds)
    rec.set_parameter("steps", a.steps)
    rec.set_parameter("eval_every", a.eval_every)
    for k in ("lr", "prompts_per_step", "group_size", "max_new_tokens", "temperature"):
        rec.set_parameter(k, settings[k])
    for r in held_rows + rew_rows:
        print("  ".join("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))
    path = record.record_path("learning-parity", a.record)
    if rec.write(path):
        record.note_written(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
