#!/usr/bin/python3
"""Eager PyTorch reference for bench/decode_bench.cpp.

Runs the configurations that decode_bench recorded (JSON lines: preset dims, batch, prompt
length, new tokens, threads, repeats, and the tokens/s of every sorl and libtorch-loop run)
through a plain eager PyTorch decode loop written the way Hugging Face's Llama code is
(rotate_half RoPE, repeat_kv, a preallocated KV cache, softmax + multinomial sampling with
log-probs), as many times, and prints the three as median (min-max) with the ratios of the
medians. With --parity DIR it first loads the weights decode_bench dumped, computes the
logits itself and compares sorl's (full and cached paths) and the libtorch loop model's with
them: PASS or FAIL against the tolerance decode_bench wrote, exit 1 on any FAIL. With --record
PATH (the record decode_bench wrote in the same run, bench/record.py) it adds the eager loop's
columns and sorl over it to the record's "decode" table.

Run with Debian's /usr/bin/python3 (python3-torch); bench/decode.sh does everything.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402  (bench/record.py)

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
    """Same protocol as decode_bench: prefill (not timed), then new_tokens - 1 timed decode
    steps; row["repeats"] runs after one warm-up. Returns the tokens/s of each run."""
    dims = Dims(row)
    model = Model(dims, seed=0)
    B, P, N = int(row["batch"]), int(row["prompt"]), int(row["new_tokens"])
    g = torch.Generator().manual_seed(1)

    def once(B, new_tokens):
        ids = torch.randint(0, dims.vocab, (B, P), generator=g)
        cache = model.new_cache(B, P + new_tokens)
        logits = model.forward(ids, cache, 0)[:, -1]
        t0 = time.perf_counter()
        pos = P
        for _ in range(new_tokens - 1):
            logp = torch.log_softmax(logits, dim=-1)  # temperature 1
            tok = torch.multinomial(logp.exp(), 1, generator=g)
            _ = logp.gather(1, tok)  # the sampled log-prob, as the rollout records it
            logits = model.forward(tok, cache, pos)[:, -1]
            pos += 1
        return (new_tokens - 1) * B / (time.perf_counter() - t0)

    with torch.inference_mode():
        once(1, 4)  # warm-up
        return [once(B, N) for _ in range(int(row["repeats"]))]


def load(dir_, name, dtype, shape):
    return torch.from_numpy(np.fromfile(os.path.join(dir_, name), dtype=dtype)).view(*shape)


def parity(dir_):
    """Compares the dumped logits with this file's model on the dumped weights; prints one
    PASS/FAIL line per comparison and returns whether all passed."""
    meta = open(os.path.join(dir_, "meta.txt")).read().split()
    B, T, vocab, d_model, n_layers, n_heads, n_kv, d_ff = map(int, meta[:8])
    theta, eps, tolerance = map(float, meta[8:11])
    dims = Dims(dict(vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                     d_ff=d_ff, rope_theta=theta, norm_eps=eps))
    weights = {}
    with open(os.path.join(dir_, "params.txt")) as f:
        for i, line in enumerate(f):
            name, *shape = line.split()
            weights[name] = load(dir_, f"param_{i}.bin", np.float32, map(int, shape))
    ids = load(dir_, "ids.bin", np.int64, (B, T))
    with torch.inference_mode():
        model = Model(dims, weights)
        ref = model.forward(ids)
        # The reference's own cached path, token by token.
        cache = model.new_cache(B, T)
        ref_cached = torch.cat([model.forward(ids[:, t:t + 1], cache, t) for t in range(T)], dim=1)
    scale = ref.abs().max().item()
    bound = tolerance * max(1.0, scale)
    print(f"parity vs torch eager (tiny preset, {B} x {T} tokens, max |logit| {scale:.2f}; "
          f"tolerance max |delta| <= {tolerance:.0e} x max(1, max |logit|) = {bound:.2e}):")
    ok = True
    for label, theirs in (("sorl full forward", load(dir_, "logits_full.bin", np.float32, (B, T, vocab))),
                          ("sorl cached path (ragged chunks)", load(dir_, "logits_cached.bin", np.float32, (B, T, vocab))),
                          ("libtorch loop model, full", load(dir_, "logits_libtorch.bin", np.float32, (B, T, vocab))),
                          ("torch eager's own cached path", ref_cached)):
        diff = (theirs - ref).abs().max().item()
        passed = diff <= bound
        ok = ok and passed
        print(f"  {label:<34} max |delta| {diff:.2e}  {'PASS' if passed else 'FAIL'}")
    return ok


def spread(runs, tag=""):
    """median (min-max) of tokens/s runs, as a fixed-width cell."""
    return f"{statistics.median(runs):8.1f} ({min(runs):.0f}-{max(runs):.0f}){tag}"


def best_loop(row):
    """The libtorch loop's runs with the GEMM whose median is higher, and its tag."""
    aten, onednn = row["libtorch_tokens_per_s"], row["libtorch_onednn_tokens_per_s"]
    return (aten, " L") if statistics.median(aten) >= statistics.median(onednn) else (onednn, " D")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sorl", required=True, help="JSON lines written by decode_bench --json")
    ap.add_argument("--parity", help="directory written by decode_bench --dump")
    ap.add_argument("--record", help="decode_bench's record of the same run: the eager columns are added to it")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.sorl) if line.strip()]
    if not rows:
        sys.exit("decode_reference: no rows in " + args.sorl)
    torch.set_num_threads(int(rows[0]["threads"]))
    if args.parity and not parity(args.parity):
        print("decode_reference.py: parity FAILED: throughput of models that compute different logits "
              "is not compared", file=sys.stderr)
        sys.exit(1)

    blas = next((part.split("=")[1] for part in torch.__config__.show().replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "?")
    gemm = {"auto": "oneDNN for products >= 2^18 multiply-adds, else at::linear",
            "aten": "at::linear"}[rows[0]["gemm"]]
    print(f"decode throughput, tokens/s: median (min-max) of {rows[0]['repeats']} runs (steady decode after "
          f"prefill; prompt {rows[0]['prompt']} tokens, temperature-1 sampling, fp32, threads {rows[0]['threads']}, "
          f"torch {torch.__version__})")
    print(f"GEMM: sorl decode = {gemm}; torch eager F.linear = libtorch BLAS (BLAS_INFO={blas})")
    print("libtorch loop = the same decode loop as torch eager (dense preallocated KV cache) driven from C++, "
          "timed with at::linear (L) and with sorl's oneDNN routing (D); the faster median is shown")
    header = (f"{'preset':<7}{'params':>9}{'batch':>6}{'new':>5}  {'sorl':<22}{'libtorch loop':<24}"
              f"{'torch eager':<22}{'vs loop':>8}{'vs eager':>9}")
    print(header)
    print("-" * len(header))
    loads = [float(row["load_1min"]) for row in rows if float(row.get("load_1min", -1)) >= 0]
    eager_runs = {}
    for row in rows:
        loads.append(os.getloadavg()[0])
        ours, (loop, tag), eager = row["sorl_tokens_per_s"], best_loop(row), run(row)
        eager_runs[(row["preset"], row["batch"])] = (eager, statistics.median(ours))
        m = statistics.median(ours)
        print(f"{row['preset']:<7}{row['params'] / 1e6:>8.2f}M{row['batch']:>6}{row['new_tokens']:>5}  "
              f"{spread(ours):<22}{spread(loop, tag):<24}{spread(eager):<22}"
              f"{m / statistics.median(loop):>7.2f}x{m / statistics.median(eager):>8.2f}x")
    print("vs loop, vs eager = median sorl / median baseline (higher is better for sorl)")
    cores = os.cpu_count()
    print(f"1-minute load average as the runs started: {min(loads):.1f} to {max(loads):.1f} on {cores} cores"
          + (" (other work competed for the cores: expect a wide min-max)" if max(loads) > cores / 2 else ""))
    if args.record and args.record != "none":
        add_eager_to_record(args.record, eager_runs)


def add_eager_to_record(path, eager_runs):
    """The eager loop's median, min, max and sorl over it as columns of the record's "decode"
    table, matched by preset and batch."""
    data = record.load(path)
    t = record.table(data, "decode")
    if t is None:
        sys.exit(f"decode_reference: {path} has no \"decode\" table")
    c = record.column
    t["columns"] += [c("eager_tok_s", "torch eager", "tokens/s", 1, baseline=True),
                     c("eager_min", "torch eager min", "tokens/s", 0, baseline=True),
                     c("eager_max", "torch eager max", "tokens/s", 0, baseline=True),
                     c("sorl_over_eager", "sorl / torch eager", "x", 2)]
    for r in t["rows"]:
        eager, ours = eager_runs.get((r[0], r[2]), (None, None))
        r += ([statistics.median(eager), min(eager), max(eager), ours / statistics.median(eager)]
              if eager else [None] * 4)
    data["parameters"]["torch_eager"] = torch.__version__
    record.write(data, path)


if __name__ == "__main__":
    main()
