#!/usr/bin/env python3
"""End-to-end GRPO steps: TRL's GRPOTrainer against a sorl run of the same experiment file, on
the CPU, step by step: seconds per step (and where they go) and mean reward.

    python3 bench/interop/trl_grpo_compare.py [--config configs/smollm2-chain_sum.toml]
        [--steps 10] [--sorl-metrics runs/smollm2-chain_sum/metrics.jsonl] [--skip 1]
        [--json OUT] [--threads N] [--keep-padding-idx] [--output-dir DIR] [--load JSON]
        [--record PATH] [--sorl-binary build/sorl] [--sorl-log LOG] [--sorl-time TIME_V]
        [--seed N] [--eval-every N]

What it measures. TRL 1.16's GRPOTrainer runs --steps optimizer steps of the sorl experiment
file's job, in fp32 on the CPU with torch limited to [run].threads intra-op threads (2 in
configs/smollm2-chain_sum.toml; --threads overrides), generating with transformers `generate`
(use_vllm False; no gradient checkpointing), with no evaluation and no checkpoint. Per step it records:
  wall_s   seconds from the end of the previous optimizer step (for the first step, from the
           start of training) to the end of this one, read by a TrainerCallback's on_step_end;
  gen_s    seconds in GRPOTrainer._generate_and_score_completions: prompt rendering,
           generation, decoding, rewards and advantages (no old log-prob pass is made: one
           update per generation batch makes the old policy the current one);
  train_s  wall_s - gen_s: the loss forward and backward, gradient clipping, the AdamW update
           and the trainer's bookkeeping;
  reward   the mean reward over the step's prompts x group size completions (TRL's logged
           "reward"), plus TRL's logged loss, grad_norm, completion lengths, entropy;
  tokens_per_s  generated tokens / gen_s (sorl's tokens_per_s divides by rollout_s).
With --sorl-metrics (a sorl run's metrics.jsonl: one JSON object per step with "step",
"wall_s", "rollout_s", "learn_s", "sync_s", "reward_mean", "tokens_per_s"; runtime/metrics.hpp)
it prints, for the steps both have, TRL s/step, sorl s/step with its rollout / learn / sync
split, and both rewards; then the mean seconds per step of each over those steps after the
first --skip (default 1, warm-up), the ratio TRL s/step / sorl s/step, and the mean reward of
each over all the common steps. --json OUT writes the settings, every per-step record, the
table and the summary. --eval-every N scores TRL's policy on the held-out set every N steps
(bench/interop/heldout_eval.py, outside the step times; bench/interop/learning_parity.py uses
it). --load JSON reads TRL's steps back from such a file instead of training
again (to compare the same TRL run with another sorl run).

Setup: a virtualenv with
    python3 -m venv VENV && VENV/bin/pip install torch==2.15.0 trl==1.16.0 transformers==5.24.0 \\
        safetensors==0.8.0
(trl brings datasets and accelerate; reasoning-gym is not needed: the reward is computed here),
the model and the data the experiment file names (scripts/fetch-model smollm2-135m-instruct;
scripts/fetch-data reasoning-gym chain_sum --set max_terms=2 --set max_digits=2), and a sorl run
of the same file for the comparison (build/sorl train configs/smollm2-chain_sum.toml). Each
TRL step of configs/smollm2-chain_sum.toml takes about a minute on 2 cores.

What is matched, all read from the experiment file with tomllib (sorl's defaults, from
runtime/config.hpp and actors/learner/learner_core.hpp, for keys it does not set):
  model        [model].hf_dir (relative to the file), fp32 weights, its tokenizer and chat
               template; each prompt is one user message rendered with the template and the
               generation prompt (SmolLM2's template adds its default system message, as sorl
               does with [task].system_prompt empty).
  data         [task].path (relative to the file), records in file order. sorl takes the
               training prompts in file order (step k: records B(k-1) .. Bk-1); TRL's sampler is
               set to the same order (shuffle_dataset False), so both runs see the same
               prompts at the same step.
  batch        [algorithm].prompts_per_step B x [sagc].group_size G completions per step, one
               generation batch = one optimizer step in one micro-batch
               (per_device_train_batch_size B*G, gradient_accumulation_steps 1,
               steps_per_generation 1, num_iterations 1): one on-policy update per step, as
               sorl's minibatches = 1, epochs = 1.
  sampling     [task].max_new_tokens, [algorithm].temperature, top_p, top_k (1.0 and 0: off),
               no repetition penalty, stop at the tokenizer's EOS <|im_end|>, which is kept as
               the completion's last token and trained (as sorl keeps its stop token).
  loss         clipped token-level importance ratio, epsilon = clip_eps_low, epsilon_high =
               clip_eps_high, beta = kl_coef (0: no reference model), loss_type "dapo" for
               loss_norm "token" (with one micro-batch per generation batch it is the sum over
               trained tokens / trained tokens of the batch, sorl's token normalisation) and
               "grpo" for "sequence"; scale_rewards "group" (or "none" when sorl's
               scale_advantages is false).
  optimizer    AdamW, [algorithm].lr held constant (lr_scheduler_type "constant", no warmup;
               the HF default would decay it linearly to 0), betas 0.9 / 0.999, eps 1e-8,
               weight_decay, max_grad_norm (global L2 clip, 1.0 by default in both).
  reward       [task].match "first_number" (the only rule implemented here), as sorl's
               runtime/ml/tasks/jsonl_task.cpp scores it: the answer is the text inside the
               completion's last <answer>...</answer> (one optional whitespace character inside
               each tag dropped, then stripped), else the whole completion stripped; its first
               number (\\b-?\\d+(?:\\.\\d+)?\\b) equal to the record's "answer" as floats
               scores 1.0, another number 0.01, no number 0.0. TRL decodes completions with
               skip_special_tokens, so the <|im_end|> stop token is not in the scored text.
  seed         [run].seed for TRL's set_seed (the sampled completions still differ: another
               sampler and random stream).

What is not matched:
  - advantages: sorl divides by the population std of the group plus 1e-6, TRL by the Bessel
    (n - 1) std plus 1e-4, so TRL's advantages are sqrt((G-1)/G) (0.935 for G = 8) of sorl's.
    Under gradient clipping and Adam this changes little, but it is not the same update.
  - numerics of the rollouts: sorl's rollout workers sample with bf16 weights
    ([model].rollout_dtype) and its learner recomputes fp32 log-probs; TRL generates and
    trains in fp32 with one model.
  - positions: TRL left-pads prompts and passes no position ids to the training forward, so a
    shorter prompt's tokens sit at shifted RoPE positions (equal up to rounding, RoPE being
    relative); sorl packs rows without padding.
  - the embedding's padding_idx: transformers builds Llama's input embedding with padding_idx =
    pad_token_id, which for SmolLM2 is <|im_end|> (id 2), a token of every chat-templated
    prompt; nn.Embedding gives that row no gradient from its input lookups, while sorl trains
    it. This script clears padding_idx so TRL trains the same parameters as sorl
    (--keep-padding-idx runs TRL as shipped). Clearing it does not change any forward value.
  - timing scope: sorl's wall_s also holds the weight sync to the rollout workers (sync_s) and
    the trainer's bookkeeping; TRL has one model in one process and no sync. sorl's held-out
    evaluations (eval_s) are outside its wall_s; TRL runs none here.
  - DAPO's dynamic sampling and overlong handling, the SAGC / deadline group policies and
    sorl's reward processes are not mirrored: the script refuses files that use them.
"""
import argparse
import json
import math
import os
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    sys.exit("needs Python >= 3.11 (tomllib)")

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_CONFIG = os.path.join(REPO, "configs", "smollm2-chain_sum.toml")

# sorl's learner defaults that the experiment file cannot set (actors/learner/learner_core.hpp).
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8


# ---------------------------------------------------------------------------------------------
# The experiment file

def read_experiment(path):
    """The settings TRL needs, from a sorl experiment file, with sorl's defaults filled in.
    Exits with a message for what this comparison does not mirror."""
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    base = os.path.dirname(os.path.abspath(path))
    run, model, task = cfg.get("run", {}), cfg.get("model", {}), cfg.get("task", {})
    alg, sagc = cfg.get("algorithm", {}), cfg.get("sagc", {})

    def refuse(msg):
        sys.exit(f"{path}: {msg}; this comparison does not mirror it")

    if alg.get("name", "grpo") != "grpo":
        refuse(f"[algorithm].name = {alg.get('name')!r}")
    if alg.get("dynamic_sampling", False):
        refuse("[algorithm].dynamic_sampling")
    if alg.get("overlong", "none") != "none":
        refuse(f"[algorithm].overlong = {alg.get('overlong')!r}")
    if int(alg.get("epochs", 1)) != 1 or int(alg.get("minibatches", 1)) != 1:
        refuse("more than one update per step ([algorithm].epochs / minibatches)")
    if sagc.get("policy", "static") != "static":
        refuse(f"[sagc].policy = {sagc.get('policy')!r} (a varying group size)")
    if task.get("name", "arithmetic") != "jsonl":
        refuse(f"[task].name = {task.get('name')!r}")
    if task.get("match", "exact") != "first_number":
        refuse(f"[task].match = {task.get('match')!r}")
    if task.get("reward_command"):
        refuse("[task].reward_command")
    if task.get("system_prompt"):
        refuse("[task].system_prompt")
    if not model.get("hf_dir"):
        refuse("no [model].hf_dir")
    if not task.get("path"):
        refuse("no [task].path")
    loss_norm = alg.get("loss_norm", "token")
    return {
        "config": os.path.abspath(path),
        "name": run.get("name", "sorl"),
        "seed": int(run.get("seed", 0)),
        "threads": int(run.get("threads", 1)),
        "model_dir": os.path.normpath(os.path.join(base, model["hf_dir"])),
        "data_path": os.path.normpath(os.path.join(base, task["path"])),
        "eval_path": os.path.normpath(os.path.join(base, task["eval_path"])) if task.get("eval_path") else None,
        "eval_prompts": int(task.get("eval_prompts", 200)),
        "max_new_tokens": int(task.get("max_new_tokens", 64)),
        "prompts_per_step": int(alg.get("prompts_per_step", 8)),
        "group_size": int(sagc.get("group_size", 8)),
        "lr": float(alg.get("lr", 1e-4)),
        "clip_eps_low": float(alg.get("clip_eps_low", 0.2)),
        "clip_eps_high": float(alg.get("clip_eps_high", 0.2)),
        "kl_coef": float(alg.get("kl_coef", 0.0)),
        "loss_norm": loss_norm,
        "loss_type": {"token": "dapo", "sequence": "grpo"}[loss_norm],
        "scale_advantages": bool(alg.get("scale_advantages", True)),
        "max_grad_norm": float(alg.get("max_grad_norm", 1.0)),
        "weight_decay": float(alg.get("weight_decay", 0.0)),
        "temperature": float(alg.get("temperature", 1.0)),
        "top_p": float(alg.get("top_p", 1.0)),
        "top_k": int(alg.get("top_k", 0)),
        "adam_beta1": ADAM_BETA1,
        "adam_beta2": ADAM_BETA2,
        "adam_eps": ADAM_EPS,
    }


def read_records(path):
    """(prompt, answer) of every record of a sorl JSONL task file, in file order."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec.get("prompt"), str) or "answer" not in rec:
                sys.exit(f"{path}:{line_no}: a record needs a string \"prompt\" and an \"answer\"")
            out.append((rec["prompt"], str(rec["answer"])))
    if not out:
        sys.exit(f"{path}: no records")
    return out


# ---------------------------------------------------------------------------------------------
# The reward: sorl's first_number rule (runtime/ml/tasks/reasoning_checks.cpp, hf_eval.cpp)

ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
FIRST_NUMBER = re.compile(r"\b-?\d+(?:\.\d+)?\b")


def completion_answer(text):
    tagged = ANSWER_TAG.findall(text)
    return tagged[-1].strip() if tagged else text.strip()


def first_number_score(answer, expected):
    m = FIRST_NUMBER.search(answer)
    if m is None:
        return 0.0
    try:
        want = float(expected)
        got = float(m.group())
    except ValueError:
        return 0.0
    return 1.0 if got == want else 0.01


def completion_text(completion):
    """TRL hands a conversational completion as a list of messages, a plain one as text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # typed content blocks
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return content or ""
    return ""


def first_number_reward(prompts, completions, answer, **kwargs):
    return [first_number_score(completion_answer(completion_text(c)), a) for c, a in zip(completions, answer)]


# ---------------------------------------------------------------------------------------------
# TRL's run

def run_trl(s, steps, keep_padding_idx, output_dir, eval_every=0):
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(s["threads"])
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    print(f"torch {versions['torch']}, transformers {versions['transformers']}, trl {versions['trl']}, "
          f"{torch.get_num_threads()} threads")

    records = read_records(s["data_path"])
    need = steps * s["prompts_per_step"]
    if need > len(records):
        sys.exit(f"{s['data_path']}: {len(records)} records, {need} needed for {steps} steps")
    data = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": p}] for p, _ in records[:need]],
        "answer": [a for _, a in records[:need]],
    })
    tok = AutoTokenizer.from_pretrained(s["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(s["model_dir"], dtype=torch.float32)
    embed = model.get_input_embeddings()
    shipped_padding_idx = embed.padding_idx
    if not keep_padding_idx:
        embed.padding_idx = None  # see the file comment

    rows = s["prompts_per_step"] * s["group_size"]
    args = GRPOConfig(
        output_dir=output_dir, report_to="none", save_strategy="no", eval_strategy="no",
        logging_steps=1, disable_tqdm=True, use_cpu=True, bf16=False, fp16=False,
        activation_checkpointing=False, use_vllm=False, seed=s["seed"], max_steps=steps,
        per_device_train_batch_size=rows, gradient_accumulation_steps=1, steps_per_generation=1,
        num_iterations=1, num_generations=s["group_size"], shuffle_dataset=False,
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_p=s["top_p"],
        top_k=s["top_k"], repetition_penalty=1.0,
        loss_type=s["loss_type"], epsilon=s["clip_eps_low"], epsilon_high=s["clip_eps_high"],
        beta=s["kl_coef"], scale_rewards="group" if s["scale_advantages"] else "none",
        importance_sampling_level="token", mask_truncated_completions=False,
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        adam_beta1=s["adam_beta1"], adam_beta2=s["adam_beta2"], adam_epsilon=s["adam_eps"],
        weight_decay=s["weight_decay"], max_grad_norm=s["max_grad_norm"],
    )

    gen_seconds = {}  # optimizer step (1-based) -> seconds generating and scoring

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            step = self.state.global_step + 1
            gen_seconds[step] = gen_seconds.get(step, 0.0) + time.perf_counter() - t0
            return out

    per_step = {}
    evals = []
    if eval_every:
        from heldout_eval import heldout_accuracy
        if not s["eval_path"]:
            sys.exit(f"{s['config']}: --eval-every needs [task].eval_path")
        eval_records = read_records(s["eval_path"])[:s["eval_prompts"] or None]

    class StepClock(TrainerCallback):
        def __init__(self):
            self.last = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            step = state.global_step
            rec = per_step.setdefault(step, {"step": step})
            rec["wall_s"] = now - self.last
            rec["gen_s"] = gen_seconds.get(step)
            rec["train_s"] = rec["wall_s"] - rec["gen_s"] if rec["gen_s"] is not None else None
            if eval_every and (step % eval_every == 0 or step == steps):
                r = heldout_accuracy(model, tok, eval_records, s["max_new_tokens"])
                evals.append({"step": step, **r})
                print(f"TRL step {step}: held-out greedy accuracy {r['accuracy']:.3f}, mean length "
                      f"{r['mean_length']:.1f} tokens ({r['seconds']:.0f} s, outside the step's time)", flush=True)
                now = time.perf_counter()
            self.last = now

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            step = state.global_step
            rec = per_step.setdefault(step, {"step": step})
            rec["reward"] = logs.get("reward")
            for key, name in (("loss", "loss"), ("grad_norm", "grad_norm"), ("entropy", "entropy"),
                              ("completions/mean_length", "completion_mean_length"),
                              ("completions/clipped_ratio", "truncated_fraction"),
                              ("frac_reward_zero_std", "zero_std_groups_fraction"),
                              ("learning_rate", "learning_rate")):
                if key in logs:
                    rec[name] = logs[key]
            if rec.get("gen_s") and rec.get("completion_mean_length") is not None:
                rec["tokens_per_s"] = rec["completion_mean_length"] * rows / rec["gen_s"]
            print(f"TRL step {step}: {rec.get('wall_s', float('nan')):.1f} s (generation "
                  f"{rec.get('gen_s') or float('nan'):.1f}, training {rec.get('train_s') or float('nan'):.1f}), "
                  f"reward {rec['reward']:.4f}, loss {rec.get('loss', float('nan')):.4f}, "
                  f"grad_norm {rec.get('grad_norm', float('nan')):.3f}, "
                  f"mean length {rec.get('completion_mean_length', float('nan')):.1f}", flush=True)

    trainer = TimedGRPOTrainer(model=model, reward_funcs=first_number_reward, args=args, train_dataset=data,
                               processing_class=tok, callbacks=[StepClock()])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    print(f"TRL: {steps} steps of {s['prompts_per_step']} prompts x {s['group_size']} completions "
          f"(<= {s['max_new_tokens']} tokens, temperature {s['temperature']}), lr {s['lr']:g}, loss_type "
          f"{s['loss_type']}, epsilon {s['clip_eps_low']} / {s['clip_eps_high']}, beta {s['kl_coef']}; embedding "
          f"padding_idx {'kept at ' + str(shipped_padding_idx) if keep_padding_idx else 'cleared (was ' + str(shipped_padding_idx) + ')'}",
          flush=True)
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    return {"versions": versions, "threads": torch.get_num_threads(),
            "padding_idx": shipped_padding_idx if keep_padding_idx else None,
            "train_seconds": total, "steps": [per_step[k] for k in sorted(per_step)], "evals": evals}


# ---------------------------------------------------------------------------------------------
# The comparison

def read_sorl_metrics(path):
    """step -> that step's record (the last one written, should a resumed run repeat a step)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and "wall_s" in rec:
                out[rec["step"]] = rec
    return out


def mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def fmt(x, spec=".1f"):
    return format(x, spec) if x is not None else "-"


# sorl's step phases, each with a peak-RSS key rss_peak_PHASE_mib in its metrics.jsonl.
PHASES = ("rollout", "learn", "sync")


def compare(trl_steps, sorl, skip):
    trl = {r["step"]: r for r in trl_steps}
    common = sorted(set(trl) & set(sorl))
    rows = []
    for k in common:
        t, s = trl[k], sorl[k]
        rows.append({"step": k, "trl_s": t.get("wall_s"), "trl_gen_s": t.get("gen_s"),
                     "trl_train_s": t.get("train_s"), "sorl_s": s.get("wall_s"),
                     "sorl_rollout_s": s.get("rollout_s"), "sorl_learn_s": s.get("learn_s"),
                     "sorl_sync_s": s.get("sync_s"), "trl_reward": t.get("reward"),
                     "sorl_reward": s.get("reward_mean"), "trl_tokens_per_s": t.get("tokens_per_s"),
                     "sorl_tokens_per_s": s.get("tokens_per_s"),
                     **{f"sorl_rss_{p}": s.get(f"rss_peak_{p}_mib") for p in PHASES}})
    timed = [r for r in rows if r["step"] > skip]
    note = None
    if rows and not timed:
        timed, note = rows, f"no common step after the first {skip}: the time means include the warm-up"
    summary = {"common_steps": common, "skip": skip, "timed_steps": [r["step"] for r in timed]}
    for key in ("trl_s", "trl_gen_s", "trl_train_s", "sorl_s", "sorl_rollout_s", "sorl_learn_s",
                "sorl_sync_s", "trl_tokens_per_s", "sorl_tokens_per_s"):
        summary["mean_" + key] = mean([r[key] for r in timed])
    a, b = summary["mean_trl_s"], summary["mean_sorl_s"]
    summary["ratio_trl_over_sorl"] = a / b if a is not None and b else None
    summary["mean_trl_reward"] = mean([r["trl_reward"] for r in rows])
    summary["mean_sorl_reward"] = mean([r["sorl_reward"] for r in rows])
    if note:
        summary["note"] = note
    return rows, summary


def print_comparison(rows, summary, sorl_path):
    print(f"\nTRL against sorl ({sorl_path}): seconds per step and mean reward")
    head = (f"{'step':>4} {'TRL s':>7} {'(gen':>6} {'train)':>7} {'sorl s':>7} {'(rollout':>8} {'learn':>6} "
            f"{'sync)':>6} {'TRL reward':>10} {'sorl reward':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['step']:>4} {fmt(r['trl_s']):>7} {fmt(r['trl_gen_s']):>6} {fmt(r['trl_train_s']):>7} "
              f"{fmt(r['sorl_s']):>7} {fmt(r['sorl_rollout_s']):>8} {fmt(r['sorl_learn_s']):>6} "
              f"{fmt(r['sorl_sync_s']):>6} {fmt(r['trl_reward'], '.4f'):>10} {fmt(r['sorl_reward'], '.4f'):>11}")
    print("-" * len(head))
    timed = summary["timed_steps"]
    span = f"steps {timed[0]}-{timed[-1]}" if timed else "no steps"
    m = summary
    skipped = "none skipped" if m.get("note") else f"first {m['skip']} skipped as warm-up"
    print(f"mean s/step over {span} ({len(timed)} steps, {skipped}):")
    print(f"  TRL  {fmt(m['mean_trl_s'])} s (generation {fmt(m['mean_trl_gen_s'])}, training "
          f"{fmt(m['mean_trl_train_s'])}), {fmt(m['mean_trl_tokens_per_s'])} generated tokens/s")
    print(f"  sorl {fmt(m['mean_sorl_s'])} s (rollout {fmt(m['mean_sorl_rollout_s'])}, learn "
          f"{fmt(m['mean_sorl_learn_s'])}, sync {fmt(m['mean_sorl_sync_s'])}), "
          f"{fmt(m['mean_sorl_tokens_per_s'])} generated tokens/s")
    print(f"  TRL s/step / sorl s/step = {fmt(m['ratio_trl_over_sorl'], '.2f')}")
    if m.get("note"):
        print(f"  ({m['note']})")
    print(f"mean reward over the {len(m['common_steps'])} common steps: TRL {fmt(m['mean_trl_reward'], '.4f')}, "
          f"sorl {fmt(m['mean_sorl_reward'], '.4f')}")


def peak_rss_of_time_v(path):
    """MiB from `/usr/bin/time -v`'s "Maximum resident set size (kbytes): N" in `path`."""
    with open(path, encoding="utf-8", errors="replace") as f:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", f.read())
    if not m:
        sys.exit(f"{path}: no 'Maximum resident set size (kbytes)' line (the output of /usr/bin/time -v)")
    return int(m.group(1)) / 1024


def fill_record(rec, a, settings, trl_run, rows, summary, sorl):
    """The run's tables: per step, the means, and peak memory where measured. `sorl` is every
    step record of the sorl run (read_sorl_metrics), for its process's peak RSS."""
    c = record.column
    rec.set_threads(settings.get("threads"))
    rec.set_parameter("config", record.display_path(settings.get("config", a.config)))
    if a.sorl_metrics:
        rec.set_parameter("sorl_metrics", record.display_path(a.sorl_metrics))
    rec.set_parameter("steps", a.steps)
    rec.set_parameter("skip", a.skip)
    for name, version in trl_run.get("versions", {}).items():
        rec.set_parameter(name, version)
    if rows:
        t = rec.add_table("steps", "seconds per step and mean reward, TRL (the baseline) and sorl, step by step",
                          [c("step", "step"), c("trl_s", "TRL", "s", 1, baseline=True),
                           c("trl_gen_s", "TRL generation", "s", 1, baseline=True),
                           c("trl_train_s", "TRL training", "s", 1, baseline=True),
                           c("sorl_s", "sorl", "s", 1), c("sorl_rollout_s", "sorl rollout", "s", 1),
                           c("sorl_learn_s", "sorl learn", "s", 1), c("sorl_sync_s", "sorl sync", "s", 1),
                           c("trl_reward", "TRL reward", "", 4, baseline=True),
                           c("sorl_reward", "sorl reward", "", 4)])
        for r in rows:
            t["rows"].append([r["step"], r["trl_s"], r["trl_gen_s"], r["trl_train_s"], r["sorl_s"],
                              r["sorl_rollout_s"], r["sorl_learn_s"], r["sorl_sync_s"], r["trl_reward"],
                              r["sorl_reward"]])
        m = summary
        timed = m["timed_steps"]
        span = f"steps {timed[0]}-{timed[-1]}" if timed else "no steps"
        t = rec.add_table("means", f"mean over {span}; reward over every common step",
                          [c("run", "run"), c("s_per_step", "s/step", "s", 1),
                           c("generation_s", "generation / rollout", "s", 1),
                           c("training_s", "training / learn", "s", 1), c("sync_s", "sync", "s", 1),
                           c("tokens_per_s", "generated", "tokens/s", 1),
                           c("trl_over_this", "TRL s/step over this", "x", 2),
                           c("mean_reward", "mean reward", "", 4)], baseline_rows=[0])
        ratio = m["ratio_trl_over_sorl"]
        t["rows"].append(["TRL GRPOTrainer", m["mean_trl_s"], m["mean_trl_gen_s"], m["mean_trl_train_s"], None,
                          m["mean_trl_tokens_per_s"], 1.0 if m["mean_trl_s"] else None, m["mean_trl_reward"]])
        t["rows"].append(["sorl", m["mean_sorl_s"], m["mean_sorl_rollout_s"], m["mean_sorl_learn_s"],
                          m["mean_sorl_sync_s"], m["mean_sorl_tokens_per_s"], ratio, m["mean_sorl_reward"]])
    memory = []
    if a.sorl_time:
        # sorl's per-phase windows reset the kernel's high-water mark, so /usr/bin/time -v sees
        # only the last window (after the last step); the steps' rss_peak_process_mib holds the
        # peak before it.
        steps_peak = [r["rss_peak_process_mib"] for r in sorl.values()
                      if r.get("rss_peak_process_mib") is not None]
        if not steps_peak:
            print("warning: no rss_peak_process_mib in the sorl run's steps (no --sorl-metrics, or "
                  "an older sorl): if its phases were measured, the peak of --sorl-time covers only "
                  "what followed the last one", file=sys.stderr)
        memory.append(["sorl (build/sorl train, the run of --sorl-metrics)",
                       max([peak_rss_of_time_v(a.sorl_time)] + steps_peak)])
    if not a.load:
        # This process trained TRL: its high-water mark is TRL's peak (KiB on Linux).
        memory.append(["TRL GRPOTrainer (this process)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024])
    timed = [r for r in rows if r["step"] > a.skip]
    phases = [[p, max(vals), statistics.median(vals)]
              for p in PHASES
              for vals in [[r[f"sorl_rss_{p}"] for r in timed if r.get(f"sorl_rss_{p}") is not None]]
              if vals]
    if phases:
        rec.add_table("memory_phases", "sorl's peak RSS per phase of a step, over the timed steps",
                      [c("phase", "phase"), c("max", "peak RSS, max", "MiB", 0),
                       c("median", "peak RSS, median", "MiB", 0)], phases)
    if memory:
        rec.add_table("memory", "whole-process peak RSS", [c("process", "process"), c("peak_rss", "peak RSS", "MiB", 0)],
                      memory, baseline_rows=[len(memory) - 1] if not a.load else ())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="sorl experiment file (default %(default)s)")
    ap.add_argument("--steps", type=int, default=10, help="TRL optimizer steps (default 10)")
    ap.add_argument("--sorl-metrics", help="a sorl run's metrics.jsonl to compare with")
    ap.add_argument("--skip", type=int, default=1,
                    help="leading steps left out of the time means as warm-up (default 1)")
    ap.add_argument("--json", help="write the settings, per-step records and summary here")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default [run].threads)")
    ap.add_argument("--keep-padding-idx", action="store_true",
                    help="run TRL as shipped: keep the embedding's padding_idx (no gradient to that row)")
    ap.add_argument("--output-dir", help="TRL's output_dir (default a temporary directory; nothing is saved)")
    ap.add_argument("--seed", type=int, help="TRL's seed (default [run].seed)")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="held-out greedy accuracy every N steps and after the last, with "
                         "bench/interop/heldout_eval.py on [task].eval_path's first [task].eval_prompts "
                         "records, outside the step times (default 0: none)")
    ap.add_argument("--load", help="read TRL's steps from an earlier --json file instead of training")
    record.add_record_argument(ap, "trl-compare")
    ap.add_argument("--sorl-binary", default=os.path.join(REPO, "build", "sorl"),
                    help="the sorl binary that made --sorl-metrics, for the record (default %(default)s)")
    ap.add_argument("--sorl-log", help="that run's log (its 'CPU kernels:' line goes into the record)")
    ap.add_argument("--sorl-time", help="`/usr/bin/time -v` output of that run: its peak RSS goes into the record")
    a = ap.parse_args()
    if a.steps < 1 or a.skip < 0 or a.eval_every < 0:
        ap.error("--steps must be >= 1, --skip and --eval-every >= 0")
    # Read before hours of training: a record that cannot name the sorl build is refused now.
    try:
        sorl = record.sorl_build(a.sorl_binary) if a.sorl_metrics else None
    except RuntimeError as e:
        ap.error(f"--sorl-binary: {e}")
    log_text = open(a.sorl_log, encoding="utf-8", errors="replace").read() if a.sorl_log else None
    rec = record.Record("trl-compare", sorl=sorl,
                        runtime=record.sorl_runtime(a.sorl_binary, log_text) if a.sorl_metrics else None)

    if a.load:
        with open(a.load, encoding="utf-8") as f:
            earlier = json.load(f)
        settings, trl_run = earlier["settings"], earlier["trl"]
        print(f"TRL steps from {a.load} ({len(trl_run['steps'])} steps, {settings['config']})")
    else:
        settings = read_experiment(a.config)
        if a.threads is not None:
            settings["threads"] = a.threads
        if a.seed is not None:
            settings["seed"] = a.seed
        # Before torch is imported, so that its OpenMP pool is sized once.
        os.environ.setdefault("OMP_NUM_THREADS", str(settings["threads"]))
        os.environ.setdefault("MKL_NUM_THREADS", str(settings["threads"]))
        print(json.dumps(settings, indent=1))
        output_dir = a.output_dir or tempfile.mkdtemp(prefix="trl_grpo_compare_")
        try:
            trl_run = run_trl(settings, a.steps, a.keep_padding_idx, output_dir, a.eval_every)
        finally:
            if not a.output_dir:
                shutil.rmtree(output_dir, ignore_errors=True)
        settings["keep_padding_idx"] = a.keep_padding_idx

    result = {"settings": settings, "trl": trl_run}
    rows, summary, sorl = [], None, {}
    if a.sorl_metrics:
        sorl = read_sorl_metrics(a.sorl_metrics)
        rows, summary = compare(trl_run["steps"], sorl, a.skip)
        if not rows:
            print(f"\n{a.sorl_metrics}: no step in common with TRL's "
                  f"{[r['step'] for r in trl_run['steps']]}")
        else:
            print_comparison(rows, summary, a.sorl_metrics)
        result.update({"sorl_metrics": os.path.abspath(a.sorl_metrics),
                       "sorl": [sorl[k] for k in sorted(sorl) if k in {r["step"] for r in rows}],
                       "table": rows, "summary": summary})
    else:
        trl_wall = [r.get("wall_s") for r in trl_run["steps"] if r["step"] > a.skip] or \
                   [r.get("wall_s") for r in trl_run["steps"]]
        print(f"\nTRL: mean {fmt(mean(trl_wall))} s/step after the first {a.skip}, mean reward "
              f"{fmt(mean([r.get('reward') for r in trl_run['steps']]), '.4f')}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {a.json}")
    fill_record(rec, a, settings, trl_run, rows, summary, sorl)
    path = record.record_path("trl-compare", a.record)
    if rec.write(path):
        record.note_written(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
