#!/usr/bin/python3
"""Hugging Face `generate` on the prompts a sorl run samples, the baseline of the device
check's rollout throughput (gpu/check_device.sh).

    gpu/hf_generate_baseline.py --model DIR --data FILE.jsonl [--device cuda] [--prompts 4]
        [--group 8] [--max-new-tokens 32] [--temperature 0.7] [--repeats 3]

The first --prompts prompts of FILE ({"prompt": ...} per line) go through the model's chat
template, each sampled --group times (num_return_sequences) in one batch of prompts x group
sequences, as one sorl step of that many rollouts. Prints the generated tokens per second
(up to and including each sequence's EOS), the median over --repeats timed calls after one
warm-up call.
"""

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).to(args.device).eval()
    with open(args.data) as f:
        prompts = [json.loads(line)["prompt"] for _, line in zip(range(args.prompts), f)]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                     add_generation_prompt=True) for p in prompts]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(args.device)

    def generate():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**batch, do_sample=True, temperature=args.temperature, top_p=1.0,
                                 top_k=0, max_new_tokens=args.max_new_tokens,
                                 num_return_sequences=args.group, pad_token_id=tok.pad_token_id)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        new = out[:, batch["input_ids"].shape[1]:]
        tokens = 0
        for row in new.tolist():
            n = len(row)
            if tok.eos_token_id in row:
                n = row.index(tok.eos_token_id) + 1
            tokens += n
        return tokens, seconds

    generate()  # warm-up: kernels, allocations
    runs = [generate() for _ in range(args.repeats)]
    rates = [t / s for t, s in runs]
    print(f"hf generate: {args.prompts} prompts x {args.group} on {args.device}, "
          f"{statistics.median(t for t, _ in runs):.0f} tokens in "
          f"{statistics.median(s for _, s in runs):.3f} s: {statistics.median(rates):.0f} tokens/s "
          f"(median of {args.repeats}; transformers, bf16)")


if __name__ == "__main__":
    main()
