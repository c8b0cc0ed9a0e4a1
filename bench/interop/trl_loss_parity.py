#!/usr/bin/env python3
"""GRPO loss parity: sorl's policy loss and gradient (build/bench/interop/sorl_grpo_loss) against
TRL's GRPOTrainer on identical batches, in fp32 on the CPU.

    python3 bench/interop/trl_loss_parity.py MODEL_DIR SORL_GRPO_LOSS [--tol 1e-4] [--keep DIR]
                                             [--time-train-step] [--record PATH]

MODEL_DIR is a Hugging Face Llama / Qwen2 directory with a chat template (e.g.
SmolLM2-135M-Instruct); SORL_GRPO_LOSS the built tool (CMake target sorl_grpo_loss). Needs
torch >= 2, transformers, trl and datasets, e.g. in a virtualenv:
    python3 -m venv VENV && VENV/bin/pip install torch==2.15.0 transformers==5.24.0 trl==1.16.0

The rollouts (fixed seeds): 3 prompts rendered with the model's chat template, 4 completions each
sampled from the model itself (transformers `generate`, temperature 1, no top-k / top-p), cut
to ragged lengths (right padding), with a span of "environment" tokens inside two completions
(fed to the model, not trained). Old log-probs are the model's own fp32 log-probs plus fixed
Gaussian noise (sd 0.3), so that ratios leave 1 and tokens are clipped on both sides. Clip bounds:
epsilon 0.2 below, 0.28 above (clip-higher). Two batches share these rollouts and differ in the
advantages, which both sides are given:
  "hand-set": fixed advantages of both signs that do not sum to zero;
  "group":    GRPO's, from fixed rewards normalised per group as TRL does (Bessel std). They sum
              to zero in each group, so at ratios near 1 the loss is a near-total cancellation:
              kappa = (the same aggregate of |per-token loss|) / |loss| is ~50 for the
              sequence-level loss, and fp32 rounding of the log-probs (~1e-5 nats per token, which
              differs between libtorch builds and BLAS libraries) reaches the loss multiplied by
              kappa. That loss is therefore compared on the scale of its terms:
              |delta| / (kappa |loss|) <= tol. Every other loss and every gradient norm is compared
              by plain relative difference, |delta| / |TRL's| <= tol.

sorl's side: the tool packs the rows as the learner does, recomputes the completion log-probs
with one differentiable forward, calls policy_loss (kl_coef 0), backpropagates and reports the
global L2 gradient norm over every parameter (the tied embedding / LM head once).

TRL's side: a real GRPOTrainer (a fresh fp32 model instance, a dummy one-column dataset and a
constant reward function, use_vllm False, use_cpu, no bf16 / fp16, no gradient checkpointing,
beta 0, gradient_accumulation_steps 1) and its own `compute_loss(model, inputs)` on the inputs
dict `_generate_and_score_completions` would build: prompt_ids / prompt_mask (left-padded),
completion_ids / completion_mask (right-padded, 0 = padding, not attended), tool_mask (0 =
environment token: attended, not trained), advantages [B], old_per_token_logps [B, C] and
num_items_in_batch (trained tokens of the generation batch). Generation and scoring are skipped
because the batch is given. `current_gradient_accumulation_steps`, which the training loop sets
to the number of micro-batches of the optimizer step, is set to 1. Then `loss.backward()` and
`torch.nn.utils.clip_grad_norm_(model.parameters(), inf)`, the norm the HF Trainer logs
(model.parameters() lists the tied embedding once).

One deliberate change on TRL's side: the input embedding's `padding_idx` is cleared. transformers
builds Llama's `nn.Embedding` with padding_idx = config.pad_token_id, and nn.Embedding gives that
row no gradient from its input lookups. SmolLM2's pad token is its EOS `<|im_end|>`, which every
chat-templated prompt contains, so TRL as shipped silently drops that part of the gradient
(the tied LM head still updates the row); sorl trains it. The last line shows the
as-shipped gradient norm for reference.

How TRL's loss types map onto sorl's loss_norm (TRL 1.16 `_compute_loss`):
  "grpo" = sequence: mean over each row's trained tokens, then mean over rows. TRL averages over
           every row of the micro-batch, sorl over the rows with at least one trained token; they
           differ only when a row has none (TRL's loss is then sorl's x rows_with_tokens / rows),
           so these batches have none.
  "bnpo" = token: sum over trained tokens / trained tokens of the micro-batch.
  "dapo" = token when the generation batch is one optimizer step in one micro-batch (as here):
           TRL divides by num_items_in_batch, the trained tokens of the whole generation batch,
           times gradient_accumulation_steps / steps_per_generation.
  "dr_grpo" (sum / (rows x max_completion_length)) has no sorl counterpart and is not checked.
TRL's epsilon / epsilon_high are sorl's clip_eps_low / clip_eps_high; its importance ratio is per
token (importance_sampling_level "token"); temperature 1 on both sides.

Prints one line per batch and pairing: loss both ways, relative difference, kappa, gradient norm
both ways, relative difference, the largest per-token log-prob difference, PASS / FAIL. Exits 1
on any FAIL. --time-train-step also times one whole GRPOTrainer step (generation included).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)

SEED = 1234
PROMPTS = [
    "What is 17 + 25? Answer with the number only.",
    "Name a prime number between 20 and 30, and explain briefly.",
    "Write one sentence about the sea.",
]
GROUP = 4
MAX_NEW = 24
# Per completion, the most tokens kept: ragged lengths, so rows are right-padded.
KEEP = [24, 21, 17, 24, 12, 24, 19, 23, 24, 15, 22, 9]
# (row, first, end) spans of "environment" tokens inside a completion: attended, not trained.
ENV_SPANS = [(1, 4, 8), (6, 2, 5)]
EPS_LOW, EPS_HIGH = 0.2, 0.28
NOISE_SD = 0.3
HAND_SET = [1.0, -0.6, 0.8, 1.5, -0.4, 0.7, 1.2, -1.0, 0.5, 0.9, -0.3, 1.1]
REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.5, 1.0, 0.0], [0.2, 0.9, 0.4, 0.7]]


def group_advantages():
    out = []
    for rewards in REWARDS:
        r = torch.tensor(rewards)
        out += [float(a) for a in (r - r.mean()) / (r.std() + 1e-4)]  # TRL's scale_rewards="group"
    return out


def build_rollouts(model, tok):
    """Rows as plain lists: prompt ids, completion ids, trained-token mask (environment spans 0),
    old log-probs. Advantages are added per batch."""
    rows = []
    for p, text in enumerate(PROMPTS):
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        prompt = tok(rendered, add_special_tokens=False)["input_ids"]
        torch.manual_seed(SEED + p)
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=MAX_NEW,
                                 min_new_tokens=MAX_NEW // 2, num_return_sequences=GROUP,
                                 pad_token_id=tok.pad_token_id)
        for g in range(GROUP):
            comp = out[g, len(prompt):].tolist()
            if tok.eos_token_id in comp:  # keep the EOS, drop what follows (padding)
                comp = comp[: comp.index(tok.eos_token_id) + 1]
            rows.append({"prompt_ids": prompt, "completion_ids": comp[: KEEP[len(rows)]]})
    for i, row in enumerate(rows):
        mask = [1] * len(row["completion_ids"])
        for r, first, end in ENV_SPANS:
            if r == i:
                assert end < len(mask), "environment span beyond the completion"
                mask[first:end] = [0] * (end - first)
        row["completion_mask"] = mask
    # Old log-probs: the model's own, one unpadded forward per row, plus fixed noise.
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
            plen, n = len(row["prompt_ids"]), len(row["completion_ids"])
            lp = logp[plen - 1: plen - 1 + n].gather(1, torch.tensor(row["completion_ids"])[:, None])[:, 0]
            row["old_logprobs"] = [float(x) for x in (lp + torch.randn(n, generator=gen) * NOISE_SD).float()]
    return rows


def run_sorl(tool, model_dir, rows, norm, path):
    with open(path, "w") as f:
        json.dump({"model_dir": os.path.abspath(model_dir), "loss_norm": norm, "clip_eps_low": EPS_LOW,
                   "clip_eps_high": EPS_HIGH, "temperature": 1.0, "rows": rows}, f)
    res = subprocess.run([tool, path], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{tool} failed ({res.returncode}): {res.stderr.strip()}")
    return json.loads(res.stdout)


def trl_inputs(rows, pad_id):
    """The inputs dict of GRPOTrainer._generate_and_score_completions, for these rows."""
    P = max(len(r["prompt_ids"]) for r in rows)
    C = max(len(r["completion_ids"]) for r in rows)
    B = len(rows)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, C), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((B, C), dtype=torch.long)
    tool_mask = torch.ones((B, C), dtype=torch.long)  # TRL pads tool_mask with 1
    old = torch.zeros((B, C), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        prompt_ids[i, P - p:] = torch.tensor(r["prompt_ids"])  # left padding
        prompt_mask[i, P - p:] = 1
        completion_ids[i, :c] = torch.tensor(r["completion_ids"])  # right padding
        completion_mask[i, :c] = 1
        tool_mask[i, :c] = torch.tensor(r["completion_mask"])
        old[i, :c] = torch.tensor(r["old_logprobs"], dtype=torch.float32)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
        "old_per_token_logps": old,
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
    }


def zero_reward(prompts, completions, **kwargs):
    return [0.0 for _ in completions]


def make_trainer(model_dir, tok, loss_type, scratch, n_rows, max_steps=-1):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=os.path.join(scratch, f"trl_{loss_type}"), report_to="none", save_strategy="no",
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, use_vllm=False, seed=SEED,
        per_device_train_batch_size=n_rows, num_generations=GROUP, gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW, temperature=1.0, top_k=0, top_p=1.0,
        loss_type=loss_type, epsilon=EPS_LOW, epsilon_high=EPS_HIGH, beta=0.0,
        max_steps=max_steps, logging_steps=1, learning_rate=1e-6,
    )
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS] * GROUP})
    return GRPOTrainer(model=model, reward_funcs=zero_reward, args=args, train_dataset=data,
                       processing_class=tok)


def trl_loss_and_grad(trainer, inputs):
    """TRL's loss on `inputs` and the global gradient norm after its backward."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    # Set by the training loop to the micro-batches of the optimizer step: one here.
    trainer.current_gradient_accumulation_steps = 1
    t0 = time.perf_counter()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    seconds = time.perf_counter() - t0
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    model.zero_grad(set_to_none=True)
    return loss.item(), grad_norm, seconds


def trl_logps(trainer, inputs):
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att,
                                                                 inputs["completion_ids"].size(1))
    return logps


def kappa(rows, new_logprobs, norm):
    """Condition number of the loss: the aggregate of |per-token loss| over |loss| (float64)."""
    sums, abs_sums, counts = [], [], []
    for r, lp in zip(rows, new_logprobs):
        s = a = n = 0.0
        for t, m in enumerate(r["completion_mask"]):
            if m:
                ratio = math.exp(lp[t] - r["old_logprobs"][t])
                adv = r["advantage"]
                term = -min(ratio * adv, min(max(ratio, 1 - EPS_LOW), 1 + EPS_HIGH) * adv)
                s, a, n = s + term, a + abs(term), n + 1
        sums.append(s), abs_sums.append(a), counts.append(n)
    if norm == "token":
        loss, loss_abs = sum(sums) / sum(counts), sum(abs_sums) / sum(counts)
    else:
        kept = [i for i, n in enumerate(counts) if n > 0]
        loss = sum(sums[i] / counts[i] for i in kept) / len(kept)
        loss_abs = sum(abs_sums[i] / counts[i] for i in kept) / len(kept)
    return loss_abs / max(abs(loss), 1e-30)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("sorl_grpo_loss")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    ap.add_argument("--keep", help="write the batch files and TRL's output folders here")
    ap.add_argument("--time-train-step", action="store_true",
                    help="also time one whole GRPOTrainer training step (generation included)")
    record.add_record_argument(ap, "trl-loss-parity")
    a = ap.parse_args()
    rec = record.Record("trl-loss-parity", threads=torch.get_num_threads(),
                        sorl=record.sorl_build_of_tool(a.sorl_grpo_loss))
    c = record.column
    checks = rec.add_table("checks", "sorl's GRPO loss and gradient norm against TRL's compute_loss on the same batches",
                           [c("batch", "batch"), c("trl_loss_type", "TRL loss_type"), c("sorl_norm", "sorl loss_norm"),
                            c("sorl_loss", "sorl loss", "", 9), c("trl_loss", "TRL loss", "", 9, baseline=True),
                            c("loss_rel", "loss rel", "", significant=2), c("kappa", "kappa", "", 1),
                            c("sorl_grad", "sorl |grad|", "", 7), c("trl_grad", "TRL |grad|", "", 7, baseline=True),
                            c("grad_rel", "|grad| rel", "", significant=2),
                            c("max_dlogp", "max |Δ log-prob|", "nats", significant=2), c("verdict", "verdict")])

    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scratch = a.keep or tempfile.mkdtemp(prefix="trl_loss_parity_")
    os.makedirs(scratch, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"{torch.get_num_threads()} threads; scratch {scratch}")
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32).eval()
    rollouts = build_rollouts(model, tok)
    del model
    batches = {}
    for name, advantages in (("hand-set", HAND_SET), ("group", group_advantages())):
        batches[name] = [dict(r, advantage=adv) for r, adv in zip(rollouts, advantages)]
    print(f"rollouts: {len(rollouts)} rows ({len(PROMPTS)} prompts x {GROUP}), completion lengths "
          f"{[len(r['completion_ids']) for r in rollouts]}, "
          f"{sum(sum(r['completion_mask']) for r in rollouts)} trained tokens, clip eps {EPS_LOW} / {EPS_HIGH}")

    failed = False
    sorl = {}
    for name, rows in batches.items():
        for norm in ("token", "sequence"):
            s = run_sorl(a.sorl_grpo_loss, a.model_dir, rows, norm, os.path.join(scratch, f"batch_{name}_{norm}.json"))
            sorl[name, norm] = s
    s = sorl["hand-set", "token"]
    print(f"sorl: {s['tokens']} trained tokens, clipped low {s['clip_frac_low']:.3f} / high "
          f"{s['clip_frac_high']:.3f} (hand-set), ratio mean {s['ratio_mean']:.3f} max {s['ratio_max']:.3f}, "
          f"its log-probs vs the learner's response_logprobs max |d| {s['logprob_vs_learner_max_abs']:.1e}, "
          f"forward + loss + backward {s['seconds']:.1f} s")
    for name in batches:
        s = sorl[name, "token"]
        if not (s["clip_frac_low"] > 0 and s["clip_frac_high"] > 0):
            print(f"FAIL: batch {name} clips no token on one side; it would not test clipping")
            failed = True

    print(f"\n{'batch':9} {'TRL':5} {'sorl':8} {'sorl loss':>13} {'TRL loss':>13} {'rel':>7} {'kappa':>6} "
          f"{'sorl |grad|':>11} {'TRL |grad|':>11} {'rel':>7} {'max|dlogp|':>10}")
    as_shipped = None
    trl_seconds = []
    for loss_type, norm in (("grpo", "sequence"), ("bnpo", "token"), ("dapo", "token")):
        trainer = make_trainer(a.model_dir, tok, loss_type, scratch, len(rollouts))
        embed = trainer.model.get_input_embeddings()
        shipped_padding_idx = embed.padding_idx
        embed.padding_idx = None  # see the file comment
        for name, rows in batches.items():
            inputs = trl_inputs(rows, tok.pad_token_id)
            t_loss, t_grad, secs = trl_loss_and_grad(trainer, inputs)
            trl_seconds.append(secs)
            s = sorl[name, norm]
            logps = trl_logps(trainer, inputs)
            dl = max((torch.tensor(s["new_logprobs"][i]) - logps[i, :len(r["completion_ids"])]).abs().max().item()
                     for i, r in enumerate(rows))
            k = kappa(rows, s["new_logprobs"], norm)
            rl, rg = rel(s["loss"], t_loss), rel(s["grad_norm"], t_grad)
            loss_ok = (rl / k if name == "group" and norm == "sequence" else rl) <= a.tol
            ok = loss_ok and rg <= a.tol and math.isfinite(s["loss"]) and math.isfinite(t_loss)
            failed |= not ok
            print(f"{name:9} {loss_type:5} {norm:8} {s['loss']:13.9f} {t_loss:13.9f} {rl:7.1e} {k:6.1f} "
                  f"{s['grad_norm']:11.7f} {t_grad:11.7f} {rg:7.1e} {dl:10.1e}  {'PASS' if ok else 'FAIL'}")
            checks["rows"].append([name, loss_type, norm, s["loss"], t_loss, rl, k, s["grad_norm"], t_grad, rg, dl,
                                   "PASS" if ok else "FAIL"])
            if loss_type == "grpo" and name == "hand-set" and shipped_padding_idx is not None:
                embed.padding_idx = shipped_padding_idx
                _, grad, _ = trl_loss_and_grad(trainer, inputs)
                embed.padding_idx = None
                as_shipped = (shipped_padding_idx, grad, rel(s["grad_norm"], grad))
        del trainer
    print("(the group batch's sequence loss passes on |delta| / (kappa |loss|); every other check on rel)")
    if as_shipped is not None:
        print(f"info: TRL as shipped (embedding padding_idx {as_shipped[0]}: no gradient from that token's "
              f"input lookups), hand-set grpo: |grad| {as_shipped[1]:.7f}, rel to sorl {as_shipped[2]:.1e}")
    print(f"TRL compute_loss + backward: {sum(trl_seconds) / len(trl_seconds):.1f} s on average")
    if a.time_train_step:
        trainer = make_trainer(a.model_dir, tok, "dapo", scratch, len(rollouts), max_steps=1)
        t0 = time.perf_counter()
        trainer.train()
        print(f"one GRPOTrainer step ({len(rollouts)} completions of <= {MAX_NEW} tokens, generation included): "
              f"{time.perf_counter() - t0:.1f} s")
    print("FAIL" if failed else f"PASS: losses and gradient norms agree within {a.tol:g}")
    for key, value in (("model_dir", record.display_path(a.model_dir)), ("tol", a.tol), ("torch", torch.__version__),
                       ("transformers", transformers.__version__), ("trl", trl.__version__)):
        rec.set_parameter(key, value)
    path = record.record_path("trl-loss-parity", a.record)
    if rec.write(path):
        record.note_written(path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
