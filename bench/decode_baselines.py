#!/usr/bin/env python3
"""Decode throughput of two peer implementations on a Hugging Face model directory.

Measures, for the figures that bench/decode_model.cpp prints for sorl (bench/decode_model.sh
runs both and prints them side by side):

* hf-torch-X.Y: Hugging Face transformers `generate` on the newest PyPI torch (CPU) and on
  Debian's torch 1.13 (python3-torch), fp32 and bf16 weights, left-padded prompts, sampling
  with the given temperature / top-p and min_new_tokens = max_new_tokens, so that every
  sequence emits exactly --new-tokens tokens (EOS is masked until then).
* llama.cpp-pyV: llama.cpp as llama-cpp-python V builds it, on F32 and BF16 GGUF files
  converted from the same directory by the convert_hf_to_gguf.py that V vendors. Batches go
  through the low-level API: one llama_batch carries every sequence, each with its own
  sequence id and sampler chain (logit bias on EOS, temperature, top-k, top-p, dist), so batch
  B decodes B tokens per llama_decode call.

Each configuration runs --repeats times (after one untimed warm-up); the repeats loop is the
outer loop, so load from other processes spreads over every batch size. Per repeat:
  prefill_s       time to first token: the prompt forward pass and the first sampled token
  prompt_tok_s    batch * prompt tokens / prefill_s
  decode_tok_s    steady decode, batch * (new_tokens - 1) / (time of the last token - first)
  generate_tok_s  the whole call, batch * new_tokens / wall time of generate (or the loop)
Output: one JSON line per (impl, dtype, batch) with every repeat's figures (lists) to stdout
or --json FILE, then a table of medians on stderr, and the run's record of that table
(bench/record.py; --record PATH, default under runs/bench/; bench/decode_model.sh passes
"none" and keeps the peers in its own record).

Both implementations spin in their thread barriers, so a machine shared with a build skews
them far more than its load suggests (a run with 2 threads on 2 busy cores can be 20x
slower than with 1). --quiet-wait S waits up to S seconds before each timed run for other
processes to use under --quiet-below cores; the last "others' cores" figure seen before
each run is kept as busy_before, and the table shows its maximum.

Setup (once; re-runnable): bench/setup-baselines [VENV]  (default ~/.cache/sorl-bench-venv)
Run:   python3 bench/decode_baselines.py models/smollm2-135m-instruct \
           --batches 1,8,32 --new-tokens 64 --temperature 0.7 --threads 2 --repeats 3
Any python3 runs the driver; it starts one worker process per implementation with the
interpreter that has it (VENV/bin/python, VENV/debian-torch/bin/python) and writes the GGUF
files to VENV/gguf on first use.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record as bench_record  # noqa: E402  (bench/record.py; record() below is a row)

HERE = os.path.abspath(__file__)
BUILT_IN_PROMPT = "Write a short story about a robot who learns to paint."
DTYPES = ("fp32", "bf16")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="Hugging Face model directory (config.json, safetensors, tokenizer)")
    p.add_argument("--impls", default="hf-pypi,hf-debian,llama.cpp",
                   help="comma list of hf-pypi, hf-debian, llama.cpp (default: all)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0,
                   help="0 disables it (transformers would otherwise apply its default of 50)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--quiet-wait", type=float, default=0,
                   help="before each timed run, wait up to this many seconds for the machine "
                   "to go quiet (default 0: no wait); busy_before records what was left")
    p.add_argument("--quiet-below", type=float, default=0.3,
                   help="cores busy in other processes that count as quiet (default 0.3)")
    p.add_argument("--prompts", help="JSONL file, one prompt a line: {\"ids\": [...]} or "
                   "{\"prompt\": \"text\"}; cycled over the batch and left-padded to the longest. "
                   "Default: one short instruction in the model's chat template, repeated")
    p.add_argument("--venv", default=os.environ.get("SORL_BENCH_VENV",
                                                    os.path.expanduser("~/.cache/sorl-bench-venv")))
    p.add_argument("--gguf-dir", help="where the GGUF files go (default VENV/gguf)")
    p.add_argument("--json", help="write the JSON lines here instead of stdout")
    bench_record.add_record_argument(p, "decode-baselines")
    p.add_argument("--worker", choices=["hf", "llama.cpp"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.batches = [int(b) for b in a.batches.split(",") if b]
    a.dtypes = [d for d in a.dtypes.split(",") if d]
    a.impls = [i for i in a.impls.split(",") if i]
    for d in a.dtypes:
        if d not in DTYPES:
            p.error(f"unknown dtype {d}")
    for i in a.impls:
        if i not in ("hf-pypi", "hf-debian", "llama.cpp"):
            p.error(f"unknown implementation {i}")
    if a.new_tokens < 2 or a.repeats < 1 or min(a.batches) < 1:
        p.error("--new-tokens must be >= 2, --repeats and batches >= 1")
    a.gguf_dir = a.gguf_dir or os.path.join(a.venv, "gguf")
    return a


def log(msg):
    print(f"decode_baselines: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- shared by the workers

def limit_threads(n):
    # Must run before torch / numpy / ggml are imported: OpenMP and OpenBLAS size their pools
    # at load time, and Debian's torch calls OpenBLAS, which otherwise takes every core.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def load_prompts(args, tokenizer):
    """Token id lists, one per distinct prompt, tokenized by the model's own tokenizer so
    that every implementation gets the same ids."""
    if args.prompts:
        out = []
        with open(args.prompts) as f:
            for line in f:
                if not line.strip():
                    continue
                row = json.loads(line)
                if "ids" in row:
                    out.append([int(t) for t in row["ids"]])
                else:
                    text = row.get("prompt", row.get("text"))
                    out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not out:
            raise SystemExit(f"{args.prompts}: no prompts")
        return out
    messages = [{"role": "user", "content": BUILT_IN_PROMPT}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = BUILT_IN_PROMPT
    return [tokenizer(text, add_special_tokens=False)["input_ids"]]


def batch_prompts(prompts, batch):
    return [prompts[i % len(prompts)] for i in range(batch)]


def record(args, impl, dtype, batch, prompt_tokens, runs, extra):
    row = {
        "impl": impl, "dtype": dtype, "batch": batch, "new_tokens": args.new_tokens,
        "prompt_tokens": prompt_tokens, "threads": args.threads,
        "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
        "repeats": len(runs),
        "decode_tok_s": [r["decode_tok_s"] for r in runs],
        "generate_tok_s": [r["generate_tok_s"] for r in runs],
        "prefill_s": [r["prefill_s"] for r in runs],
        "prompt_tok_s": [r["prompt_tok_s"] for r in runs],
        "load": [r["load"] for r in runs],
        "busy_before": [r["busy_before"] for r in runs],
    }
    row.update(extra)
    print(json.dumps(row), flush=True)


def figures(batch, prompt_tokens, new_tokens, t0, t_first, t_last, t_end):
    return {
        "prefill_s": t_first - t0,
        "prompt_tok_s": batch * prompt_tokens / (t_first - t0),
        "decode_tok_s": batch * (new_tokens - 1) / (t_last - t_first),
        "generate_tok_s": batch * new_tokens / (t_end - t0),
        "load": os.getloadavg()[0],
    }


def busy_cores(interval=0.5):
    """Cores kept busy over `interval` by every process on the machine, from /proc/stat."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields[:8]), fields[3] + fields[4]
    total0, idle0 = sample()
    time.sleep(interval)
    total1, idle1 = sample()
    total = max(total1 - total0, 1)
    return (os.cpu_count() or 1) * (total - (idle1 - idle0)) / total


def wait_quiet(args):
    """Waits, up to --quiet-wait seconds, until other processes use under --quiet-below
    cores: the implementations spin in their thread barriers, and a core taken away from
    one of their threads stalls every step, which no repeat count averages out. Returns the
    busy cores last seen (this process is idle while it looks)."""
    deadline = time.monotonic() + args.quiet_wait
    while True:
        busy = busy_cores()
        if busy < args.quiet_below or time.monotonic() >= deadline:
            return busy


def run_repeats(args, configs, run_one):
    """configs: list of keys; run_one(key, timed) -> figures. Returns {key: [figures]}."""
    for key in configs:
        run_one(key, False)
    out = {key: [] for key in configs}
    for _ in range(args.repeats):
        for key in configs:
            busy = wait_quiet(args) if args.quiet_wait > 0 else None
            r = run_one(key, True)
            r["busy_before"] = busy
            out[key].append(r)
    return out


# ---------------------------------------------------------------- transformers worker

def hf_worker(args):
    limit_threads(args.threads)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    impl = "hf-torch-" + ".".join(torch.__version__.split(".")[:2])
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = load_prompts(args, tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id

    class Clock(BaseStreamer):
        # generate() hands the streamer the prompt first, then each step's new tokens right
        # after they are sampled: the second call marks the first token.
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    def inputs_for(batch):
        seqs = batch_prompts(prompts, batch)
        width = max(len(s) for s in seqs)
        ids = torch.full((batch, width), pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
        return ids, mask, width

    for dtype in args.dtypes:
        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        try:
            # transformers 5 renamed torch_dtype to dtype; 4.x knows only the old name.
            key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
            model = AutoModelForCausalLM.from_pretrained(args.model, **{key: torch_dtype})
        except Exception as e:  # noqa: BLE001 - reported and skipped, the other dtype still runs
            log(f"{impl} {dtype}: cannot load: {type(e).__name__}: {e}")
            continue
        model.eval()
        inputs = {b: inputs_for(b) for b in args.batches}
        seed = [args.seed]

        def run_one(batch, timed):
            ids, mask, width = inputs[batch]
            n = args.new_tokens if timed else 4
            clock = Clock()
            seed[0] += 1
            torch.manual_seed(seed[0])
            sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k) if args.temperature > 0 else dict(do_sample=False)
            t0 = time.perf_counter()
            # synced_gpus given, generate does not probe for FSDP: on Python 3.11 Debian's
            # torch 1.13 cannot import torch.distributed.fsdp.
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                     min_new_tokens=n, pad_token_id=pad_id, streamer=clock,
                                     synced_gpus=False, **sampling)
            t_end = time.perf_counter()
            if out.shape != (batch, width + n) or len(clock.times) != n + 1:
                raise RuntimeError(f"generate returned {tuple(out.shape)} with "
                                   f"{len(clock.times) - 1} steps, expected {n} new tokens")
            return figures(batch, width, n, t0, clock.times[1], clock.times[-1], t_end)

        try:
            results = run_repeats(args, args.batches, run_one)
        except Exception as e:  # noqa: BLE001
            log(f"{impl} {dtype}: generate failed: {type(e).__name__}: {e}")
            continue
        extra = {"torch": torch.__version__, "transformers": transformers.__version__,
                 "attn_implementation": getattr(model.config, "_attn_implementation", None)}
        cpu = getattr(torch.backends, "cpu", None)
        if cpu is not None and hasattr(cpu, "get_cpu_capability"):
            extra["cpu_capability"] = cpu.get_cpu_capability()
        for b in args.batches:
            record(args, impl, dtype, b, inputs[b][2], results[b], extra)
        del model


# ---------------------------------------------------------------- llama.cpp worker

def convert_script(venv):
    src = os.path.join(venv, "src")
    for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
        path = os.path.join(src, name, "vendor", "llama.cpp", "convert_hf_to_gguf.py")
        if os.path.isfile(path):
            return path
    raise SystemExit(f"no convert_hf_to_gguf.py under {src}: run bench/setup-baselines")


def gguf_for(args, dtype):
    os.makedirs(args.gguf_dir, exist_ok=True)
    name = os.path.basename(os.path.normpath(args.model))
    path = os.path.join(args.gguf_dir, f"{name}-{dtype}.gguf")
    newest = max(os.path.getmtime(os.path.join(args.model, f)) for f in os.listdir(args.model)
                 if f.endswith((".safetensors", ".json")))
    if os.path.exists(path) and os.path.getmtime(path) >= newest:
        return path
    outtype = {"fp32": "f32", "bf16": "bf16"}[dtype]
    log(f"converting {args.model} to {path}")
    tmp = path + ".tmp"
    proc = subprocess.run([sys.executable, convert_script(args.venv), args.model,
                           "--outtype", outtype, "--outfile", tmp], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{proc.stderr[-4000:]}")
    os.replace(tmp, path)
    return path


def llama_worker(args):
    limit_threads(args.threads)
    import llama_cpp as L
    from llama_cpp import _logger
    from transformers import AutoTokenizer

    _logger.set_verbose(False)

    impl = f"llama.cpp-py{L.__version__}"
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = load_prompts(args, tokenizer)
    L.llama_backend_init()
    system_info = L.llama_print_system_info().decode().strip()
    log(f"{impl}: {system_info}")

    for dtype in args.dtypes:
        path = gguf_for(args, dtype)
        mparams = L.llama_model_default_params()
        model = L.llama_model_load_from_file(path.encode(), mparams)
        if not model:
            log(f"{impl} {dtype}: cannot load {path}")
            continue
        vocab = L.llama_model_get_vocab(model)
        n_vocab = L.llama_vocab_n_tokens(vocab)
        eos = L.llama_vocab_eos(vocab)
        contexts = {}

        def context_for(batch):
            # One context per batch size, made once: its KV cache holds every sequence's
            # prompt and new tokens, and the prompt goes in as one llama_decode.
            if batch in contexts:
                return contexts[batch]
            seqs = batch_prompts(prompts, batch)
            width = max(len(s) for s in seqs)
            cp = L.llama_context_default_params()
            cp.n_seq_max = batch
            # Each sequence gets n_ctx / n_seq_max cells of its own KV stream; llama.cpp pads
            # per-sequence sizes to 256.
            cp.n_ctx = batch * (-(-(width + args.new_tokens + 1) // 256) * 256)
            cp.n_batch = cp.n_ubatch = max(sum(len(s) for s in seqs), batch)
            cp.n_threads = cp.n_threads_batch = args.threads
            ctx = L.llama_init_from_model(model, cp)
            if not ctx:
                raise RuntimeError(f"cannot create a context for batch {batch}")
            lb = L.llama_batch_init(cp.n_batch, 0, 1)
            contexts[batch] = (ctx, lb, seqs, width)
            return contexts[batch]

        def sampler(seed):
            chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
            # Masking EOS stands in for transformers' min_new_tokens: every sequence runs to
            # --new-tokens. The order then matches transformers': temperature, top-k, top-p.
            bias = (L.llama_logit_bias * 1)(L.llama_logit_bias(eos, float("-inf")))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(n_vocab, 1, bias))
            if args.temperature > 0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(args.temperature))
                if args.top_k > 0:
                    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(args.top_k))
                if args.top_p < 1:
                    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(args.top_p, 1))
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed))
            else:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            return chain

        seed = [args.seed]

        def run_one(batch, timed):
            ctx, lb, seqs, width = context_for(batch)
            n = args.new_tokens if timed else 4
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            chains = []
            for _ in range(batch):
                seed[0] += 1
                chains.append(sampler(seed[0]))
            # Sequences are not padded: each keeps its own positions in its own sequence id,
            # which is what left padding emulates in transformers.
            lengths = [len(s) for s in seqs]
            t0 = time.perf_counter()
            k = 0
            last = []
            for sid, s in enumerate(seqs):
                for pos, tok in enumerate(s):
                    lb.token[k] = tok
                    lb.pos[k] = pos
                    lb.n_seq_id[k] = 1
                    lb.seq_id[k][0] = sid
                    lb.logits[k] = int(pos == len(s) - 1)
                    k += 1
                last.append(k - 1)
            lb.n_tokens = k
            if L.llama_decode(ctx, lb) != 0:
                raise RuntimeError("llama_decode failed on the prompt")
            toks = [L.llama_sampler_sample(chains[i], ctx, last[i]) for i in range(batch)]
            t_first = time.perf_counter()
            for step in range(1, n):
                for i in range(batch):
                    lb.token[i] = toks[i]
                    lb.pos[i] = lengths[i] + step - 1
                    lb.n_seq_id[i] = 1
                    lb.seq_id[i][0] = i
                    lb.logits[i] = 1
                lb.n_tokens = batch
                if L.llama_decode(ctx, lb) != 0:
                    raise RuntimeError(f"llama_decode failed at step {step}")
                toks = [L.llama_sampler_sample(chains[i], ctx, i) for i in range(batch)]
            t_last = t_end = time.perf_counter()
            for c in chains:
                L.llama_sampler_free(c)
            return figures(batch, width, n, t0, t_first, t_last, t_end)

        try:
            results = run_repeats(args, args.batches, run_one)
        except Exception as e:  # noqa: BLE001
            log(f"{impl} {dtype}: failed: {type(e).__name__}: {e}")
            results = None
        if results:
            extra = {"gguf": os.path.basename(path), "api": "llama_batch",
                     "system_info": system_info}
            for b in args.batches:
                record(args, impl, dtype, b, contexts[b][3], results[b], extra)
        for ctx, lb, _, _ in contexts.values():
            L.llama_batch_free(lb)
            L.llama_free(ctx)
        L.llama_model_free(model)


# ---------------------------------------------------------------- driver

def interpreter(args, impl):
    rel = {"hf-pypi": "bin/python", "hf-debian": "debian-torch/bin/python",
           "llama.cpp": "bin/python"}[impl]
    return os.path.join(args.venv, rel)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def busy(row):
    seen = [b for b in row.get("busy_before", []) if b is not None]
    return f"{max(seen):.2f}" if seen else "-"


def table(rows):
    head = ("impl", "dtype", "threads", "batch", "prompt", "new", "prefill s", "prompt tok/s",
            "decode tok/s", "(min-max)", "generate tok/s", "others' cores")
    lines = [head]
    for r in rows:
        d = r["decode_tok_s"]
        lines.append((r["impl"], r["dtype"], str(r["threads"]), str(r["batch"]), str(r["prompt_tokens"]),
                      str(r["new_tokens"]), f"{median(r['prefill_s']):.3f}",
                      f"{median(r['prompt_tok_s']):.0f}", f"{median(d):.1f}",
                      f"({min(d):.1f}-{max(d):.1f})", f"{median(r['generate_tok_s']):.1f}",
                      busy(r)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i >= 2 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(line, widths))) for line in lines)


def add_record_table(rec, rows):
    """The table of medians, as table() prints it, into the run's record."""
    c = bench_record.column
    t = rec.add_table("peers", "peer implementations' decode on the same prompt and settings, medians of the repeats",
                      [c("impl", "impl"), c("dtype", "dtype"), c("threads", "threads"), c("batch", "batch"),
                       c("prompt", "prompt", "tokens"), c("new", "new", "tokens"),
                       c("prefill_s", "prefill", "s", 3, baseline=True),
                       c("prompt_tok_s", "prompt", "tokens/s", 0, baseline=True),
                       c("decode_tok_s", "decode", "tokens/s", 1, baseline=True),
                       c("decode_min", "decode min", "tokens/s", 1, baseline=True),
                       c("decode_max", "decode max", "tokens/s", 1, baseline=True),
                       c("generate_tok_s", "generate", "tokens/s", 1, baseline=True),
                       c("others_cores", "others' cores", "", 2)])
    for r in rows:
        d = r["decode_tok_s"]
        seen = [b for b in r.get("busy_before", []) if b is not None]
        t["rows"].append([r["impl"], r["dtype"], r["threads"], r["batch"], r["prompt_tokens"], r["new_tokens"],
                          median(r["prefill_s"]), median(r["prompt_tok_s"]), median(d), min(d), max(d),
                          median(r["generate_tok_s"]), max(seen) if seen else None])


def driver(args):
    rec = bench_record.Record("decode-baselines", threads=args.threads)
    rec.set_parameter("model", bench_record.display_path(args.model))
    for key in ("new_tokens", "temperature", "top_p", "top_k", "repeats", "seed"):
        rec.set_parameter(key, getattr(args, key))
    rows = []
    out = open(args.json, "w") if args.json else sys.stdout
    for impl in args.impls:
        python = interpreter(args, impl)
        if not os.path.exists(python):
            log(f"{impl}: {python} is missing (bench/setup-baselines creates it); skipped")
            continue
        worker = "llama.cpp" if impl == "llama.cpp" else "hf"
        log(f"{impl}: running with {python}")
        cmd = [python, HERE, args.model, "--worker", worker, "--venv", args.venv,
               "--gguf-dir", args.gguf_dir, "--dtypes", ",".join(args.dtypes),
               "--batches", ",".join(map(str, args.batches)), "--new-tokens", str(args.new_tokens),
               "--temperature", str(args.temperature), "--top-p", str(args.top_p),
               "--top-k", str(args.top_k), "--threads", str(args.threads),
               "--repeats", str(args.repeats), "--seed", str(args.seed),
               "--quiet-wait", str(args.quiet_wait), "--quiet-below", str(args.quiet_below)]
        if args.prompts:
            cmd += ["--prompts", os.path.abspath(args.prompts)]
        started = time.time()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
                print(line, file=out, flush=True)
        log(f"{impl}: {time.time() - started:.0f} s" +
            (f", exit {proc.returncode}" if proc.returncode else ""))
    if out is not sys.stdout:
        out.close()
    if rows:
        print(table(rows), file=sys.stderr)
        add_record_table(rec, rows)
        path = bench_record.record_path("decode-baselines", args.record)
        if rec.write(path):
            bench_record.note_written(path)
    return 0 if rows else 1


def main(argv):
    args = parse_args(argv)
    args.model = os.path.abspath(args.model)
    if args.worker == "hf":
        hf_worker(args)
        return 0
    if args.worker == "llama.cpp":
        llama_worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
