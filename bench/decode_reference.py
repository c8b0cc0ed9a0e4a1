#!/usr/bin/python3
"""Eager PyTorch reference for bench/decode_bench.cpp.

Runs the configurations that decode_bench recorded (JSON lines: preset dims, batch, prompt
length, new tokens, threads) through a plain eager PyTorch decode loop written the way
Hugging Face's Llama code is (rotate_half RoPE, repeat_kv, a preallocated KV cache, softmax +
multinomial sampling with log-probs), and prints both throughputs side by side with their
ratio. With --parity DIR it also loads the weights decode_bench dumped and compares logits.

Run with Debian's /usr/bin/python3 (python3-torch); bench/decode.sh does everything.
"""

import argparse
import json
import math
import os
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"decode_reference.py: {e.name} is missing: install Debian's python3-torch and "
          f"python3-numpy (scripts/install-deps --with-extras) and run with /usr/bin/python3",
          file=sys.stderr)
    sys.exit(2)


class Dims:
    def __init__(self, row):
        self.vocab = int(row["vocab"])
        self.d_model = int(row["d_model"])
        self.n_layers = int(row["n_layers"])
        self.n_heads = int(row["n_heads"])
        self.n_kv_heads = int(row["n_kv_heads"])
        self.d_ff = int(row["d_ff"])
        self.rope_theta = float(row["rope_theta"])
        self.norm_eps = float(row["norm_eps"])
        self.head_dim = self.d_model // self.n_heads


class Model:
    """Llama-style decoder with a tied LM head, weights in HF names."""

    def __init__(self, dims, weights=None, seed=0, std=0.02):
        self.d = dims
        if weights is None:
            g = torch.Generator().manual_seed(seed)
            weights = {}
            hd, d = dims.head_dim, dims.d_model

            def normal(*shape):
                return torch.randn(*shape, generator=g) * std

            weights["model.embed_tokens.weight"] = normal(dims.vocab, d)
            for i in range(dims.n_layers):
                p = f"model.layers.{i}."
                weights[p + "self_attn.q_proj.weight"] = normal(dims.n_heads * hd, d)
                weights[p + "self_attn.k_proj.weight"] = normal(dims.n_kv_heads * hd, d)
                weights[p + "self_attn.v_proj.weight"] = normal(dims.n_kv_heads * hd, d)
                weights[p + "self_attn.o_proj.weight"] = normal(d, dims.n_heads * hd)
                weights[p + "mlp.gate_proj.weight"] = normal(dims.d_ff, d)
                weights[p + "mlp.up_proj.weight"] = normal(dims.d_ff, d)
                weights[p + "mlp.down_proj.weight"] = normal(d, dims.d_ff)
                weights[p + "input_layernorm.weight"] = torch.ones(d)
                weights[p + "post_attention_layernorm.weight"] = torch.ones(d)
            weights["model.norm.weight"] = torch.ones(d)
        self.w = weights
        self.lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        inv_freq = 1.0 / (dims.rope_theta ** (torch.arange(0, dims.head_dim, 2, dtype=torch.float64) / dims.head_dim))
        t = torch.arange(4096, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().float()
        self.sin = emb.sin().float()

    def rms_norm(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.d.norm_eps))

    @staticmethod
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def new_cache(self, batch, max_len):
        shape = (batch, self.d.n_kv_heads, max_len, self.d.head_dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(self.d.n_layers)]

    def forward(self, ids, cache=None, start=0):
        """ids [B, T] at positions start..start+T-1; returns logits [B, T, vocab]."""
        d = self.d
        B, T = ids.shape
        hd, H, KV = d.head_dim, d.n_heads, d.n_kv_heads
        cos = self.cos[start:start + T][None, None]
        sin = self.sin[start:start + T][None, None]
        x = torch.nn.functional.embedding(ids, self.w["model.embed_tokens.weight"])
        S = start + T
        mask = None
        if T > 1:
            mask = torch.full((T, S), float("-inf")).triu(start + 1)
        for i in range(d.n_layers):
            p = f"model.layers.{i}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = torch.nn.functional.linear(h, self.w[p + "self_attn.q_proj.weight"]).view(B, T, H, hd).transpose(1, 2)
            k = torch.nn.functional.linear(h, self.w[p + "self_attn.k_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
            v = torch.nn.functional.linear(h, self.w[p + "self_attn.v_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            if cache is not None:
                kc, vc = cache[i]
                kc[:, :, start:S] = k
                vc[:, :, start:S] = v
                k, v = kc[:, :, :S], vc[:, :, :S]
            rep = H // KV  # repeat_kv
            k = k[:, :, None].expand(B, KV, rep, S, hd).reshape(B, H, S, hd)
            v = v[:, :, None].expand(B, KV, rep, S, hd).reshape(B, H, S, hd)
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
            if mask is not None:
                scores = scores + mask
            attn = torch.matmul(torch.softmax(scores, dim=-1), v)
            x = x + torch.nn.functional.linear(attn.transpose(1, 2).reshape(B, T, H * hd), self.w[p + "self_attn.o_proj.weight"])
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            gate = torch.nn.functional.linear(h, self.w[p + "mlp.gate_proj.weight"])
            up = torch.nn.functional.linear(h, self.w[p + "mlp.up_proj.weight"])
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, self.w[p + "mlp.down_proj.weight"])
        return torch.nn.functional.linear(self.rms_norm(x, self.w["model.norm.weight"]), self.lm_head)


def run(row):
    """Same protocol as decode_bench: prefill (untimed), then new_tokens - 1 timed decode steps."""
    dims = Dims(row)
    model = Model(dims, seed=0)
    B, P, N = int(row["batch"]), int(row["prompt"]), int(row["new_tokens"])
    g = torch.Generator().manual_seed(1)

    def once(B, new_tokens):
        ids = torch.randint(0, dims.vocab, (B, P), generator=g)
        cache = model.new_cache(B, P + new_tokens)
        t0 = time.perf_counter()
        logits = model.forward(ids, cache, 0)[:, -1]
        t1 = time.perf_counter()
        pos = P
        for _ in range(new_tokens - 1):
            logp = torch.log_softmax(logits, dim=-1)  # temperature 1
            tok = torch.multinomial(logp.exp(), 1, generator=g)
            _ = logp.gather(1, tok)  # the sampled log-prob, as the rollout records it
            logits = model.forward(tok, cache, pos)[:, -1]
            pos += 1
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, (new_tokens - 1) * B

    with torch.inference_mode():
        once(1, 4)  # warm-up
        prefill_s, decode_s, tokens = once(B, N)
    return prefill_s, decode_s, tokens


def parity(dir_):
    meta = open(os.path.join(dir_, "meta.txt")).read().split()
    B, T, vocab, d_model, n_layers, n_heads, n_kv, d_ff = map(int, meta[:8])
    theta, eps, cached_vs_full, max_logit = map(float, meta[8:12])
    dims = Dims(dict(vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                     d_ff=d_ff, rope_theta=theta, norm_eps=eps))
    weights = {}
    with open(os.path.join(dir_, "params.txt")) as f:
        for i, line in enumerate(f):
            name, *shape = line.split()
            data = np.fromfile(os.path.join(dir_, f"param_{i}.bin"), dtype=np.float32)
            weights[name] = torch.from_numpy(data).view(*map(int, shape))
    ids = torch.from_numpy(np.fromfile(os.path.join(dir_, "ids.bin"), dtype=np.int64)).view(B, T)
    ours = torch.from_numpy(np.fromfile(os.path.join(dir_, "logits.bin"), dtype=np.float32)).view(B, T, vocab)
    with torch.inference_mode():
        model = Model(dims, weights)
        ref = model.forward(ids)
        # The reference's own cached path, token by token.
        cache = model.new_cache(B, T)
        steps = [model.forward(ids[:, t:t + 1], cache, t) for t in range(T)]
        ref_cached = torch.cat(steps, dim=1)
    return (ours - ref).abs().max().item(), cached_vs_full, (ref - ref_cached).abs().max().item(), max_logit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sorl", required=True, help="JSON lines written by decode_bench --json")
    ap.add_argument("--parity", help="directory written by decode_bench --dump")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.sorl) if line.strip()]
    if not rows:
        sys.exit("decode_reference: no rows in " + args.sorl)
    torch.set_num_threads(int(rows[0]["threads"]))

    blas = next((part.split("=")[1] for part in torch.__config__.show().replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "?")
    gemm = {"auto": "oneDNN where available", "aten": "at::linear"}[rows[0].get("gemm", "auto")]
    print(f"decode throughput, tokens/s (steady decode after prefill; prompt {rows[0]['prompt']} tokens, "
          f"temperature-1 sampling, fp32, {rows[0]['threads']} threads, torch {torch.__version__})")
    print(f"GEMM: sorl decode = {gemm}; torch eager F.linear = libtorch BLAS (BLAS_INFO={blas})")
    header = f"{'preset':<7}{'params':>9}{'batch':>7}{'new':>6}{'sorl':>12}{'torch eager':>13}{'ratio':>8}"
    print(header)
    print("-" * len(header))
    for row in rows:
        _, decode_s, tokens = run(row)
        ref = tokens / decode_s
        ours = float(row["tokens_per_s"])
        print(f"{row['preset']:<7}{row['params'] / 1e6:>8.2f}M{row['batch']:>7}{row['new_tokens']:>6}"
              f"{ours:>12.1f}{ref:>13.1f}{ours / ref:>7.2f}x")
    print("ratio = sorl / torch eager (higher is better for sorl)")
    if args.parity:
        d_ref, d_cached, d_ref_cached, scale = parity(args.parity)
        print(f"parity (tiny preset, 3 x 24 tokens, max |logit| {scale:.3f}): "
              f"max |sorl - torch| = {d_ref:.2e}; sorl cached vs full = {d_cached:.2e}; "
              f"torch cached vs full = {d_ref_cached:.2e}")


if __name__ == "__main__":
    main()
