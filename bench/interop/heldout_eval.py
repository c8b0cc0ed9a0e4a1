#!/usr/bin/env python3
"""Held-out greedy accuracy of Hugging Face model directories with transformers in fp32: one
evaluator for TRL's policy and sorl's, so that neither is scored by the other's kernels.

    python3 bench/interop/heldout_eval.py MODEL_DIR [MODEL_DIR ...] --data data/chain_sum/eval.jsonl
        [--max-new-tokens 32] [--limit N] [--batch 64] [--threads 2] [--json OUT]

Each record's prompt is one user message rendered with the model's chat template and its
generation prompt (SmolLM2's template adds its default system message, as `sorl eval` does);
the completion is greedy (do_sample False), at most --max-new-tokens tokens, stopped at the
tokenizer's EOS; it is correct when sorl's first_number rule scores it 1.0
(trl_grpo_compare.first_number_score, the rule of runtime/ml/tasks/jsonl_task.cpp). Prompts are
left-padded into batches of --batch; the attention mask and position ids keep padding out of
the result, so a prompt's greedy completion does not depend on its batch up to fp32 rounding.

A sorl policy is evaluated from `sorl export-hf CONFIG OUT --checkpoint STEP_DIR --dtype fp32`:
its bf16 weights widened exactly, so fp32 arithmetic scores the weights sorl's workers sample
with. TRL's policy is evaluated in the process that trains it (trl_grpo_compare.py
--eval-every), on its fp32 weights, with the same function.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trl_grpo_compare import completion_answer, first_number_score, read_records  # noqa: E402


def heldout_accuracy(model, tok, records, max_new_tokens, batch=64):
    """Greedy accuracy of `model` on `records` [(prompt, answer)]: a dict with "accuracy" (share
    scored 1.0), "mean_length" (generated tokens, EOS included when reached), "prompts" and
    "seconds". The model is put in eval mode and restored to its previous mode afterwards."""
    import torch

    was_training = model.training
    model.eval()
    pad_side = tok.padding_side
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    correct, lengths = 0, []
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            for start in range(0, len(records), batch):
                chunk = records[start:start + batch]
                texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p, _ in chunk]
                enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                     temperature=None, top_p=None, top_k=None)
                gen = out[:, enc["input_ids"].shape[1]:]
                for row, (_, answer) in zip(gen, chunk):
                    ids = row.tolist()
                    n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
                    lengths.append(n)
                    text = tok.decode(ids[:n], skip_special_tokens=True)
                    correct += first_number_score(completion_answer(text), answer) == 1.0
    finally:
        tok.padding_side = pad_side
        model.train(was_training)
    return {"accuracy": correct / len(records), "mean_length": sum(lengths) / len(lengths),
            "prompts": len(records), "seconds": time.perf_counter() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="Hugging Face model directories")
    ap.add_argument("--data", required=True, help="JSONL held-out set: prompt, answer")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="completion budget, tokens (default 32)")
    ap.add_argument("--limit", type=int, default=0, help="the first N records only (0 = all)")
    ap.add_argument("--batch", type=int, default=64, help="prompts per generate call (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    ap.add_argument("--json", help="write {model directory: result} here")
    a = ap.parse_args()
    if a.max_new_tokens < 1 or a.batch < 1 or a.limit < 0:
        ap.error("--max-new-tokens and --batch must be >= 1, --limit >= 0")
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    records = read_records(a.data)
    if a.limit:
        records = records[:a.limit]
    results = {}
    for path in a.models:
        if not os.path.isfile(os.path.join(path, "config.json")):
            sys.exit(f"{path}: not a Hugging Face model directory (no config.json)")
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        r = heldout_accuracy(model, tok, records, a.max_new_tokens, a.batch)
        results[path] = r
        print(f"{path}: accuracy {r['accuracy']:.3f} on {r['prompts']} prompts, mean length "
              f"{r['mean_length']:.1f} tokens ({r['seconds']:.0f} s)", flush=True)
        del model
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
