#!/usr/bin/env python3
"""Replays recorded rollout turns through ArcticInference's suffix decoding cache, with the
protocol of `war_bench draft` (bench/war/war_bench.cpp), so the two drafters see the same
text in the same order and their figures compare directly.

Input: JSONL from `war_bench record`, one policy turn per line, in finishing order:
    {"group": int, "prompt": [int, ...], "response": [int, ...]}

Per line i: start_request(i, prompt); at each position t a draft of at most
min(--max-spec-tokens, len(response) - t - 1) tokens is proposed from the last --context
tokens of prompt + response[:t] (timed around the speculate call alone, as vLLM calls it);
its longest prefix equal to response[t:] is accepted; those tokens plus one more are fed back
with add_active_response; stop_request(i) at the end (the response stays in the global tree,
as the library keeps it).

Needs arctic-inference 0.3.0 (it builds its C++ extension from source in about 2 minutes) and
numpy, which its cache module imports without declaring:
    python3 -m venv VENV && VENV/bin/pip install arctic-inference==0.3.0 numpy
bench/war/run.sh does this into .venv-arctic on first use.

Prints one JSON object with the keys `war_bench draft` prints, and writes the run's record
(bench/record.py: table "draft", ArcticInference's row) to --record PATH, else
$SORL_BENCH_RECORD, else runs/bench/arctic-draft-UTC.json; bench/war/run.sh passes "none" and
puts the row beside sorl's drafter in its own record.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)

from arctic_inference.suffix_decoding import SuffixDecodingCache


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("--max-depth", type=int, default=32, help="max_tree_depth of the cache")
    ap.add_argument("--max-spec-tokens", type=int, default=16)
    ap.add_argument("--spec-factor", type=float, default=1.0)
    ap.add_argument("--min-token-prob", type=float, default=0.1)
    ap.add_argument("--max-cached-requests", type=int, default=-1, help="-1 = no limit")
    ap.add_argument("--context", type=int, default=32, help="tokens of context passed to speculate")
    record.add_record_argument(ap, "arctic-draft")
    args = ap.parse_args()
    rec = record.Record("arctic-draft", threads=1)

    lines = []
    with open(args.jsonl) as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                lines.append(([int(x) for x in obj["prompt"]], [int(x) for x in obj["response"]]))

    cache = SuffixDecodingCache(max_tree_depth=args.max_depth, max_cached_requests=args.max_cached_requests)
    lat = []
    proposed = accepted = steps = skipped = tokens = 0
    clock = time.perf_counter_ns
    wall0 = time.perf_counter()
    for i, (prompt, response) in enumerate(lines):
        cache.start_request(i, prompt)
        seq = list(prompt)
        n = len(response)
        tokens += n
        t = 0
        while t < n:
            room = min(args.max_spec_tokens, n - t - 1)
            draft = ()
            if room <= 0:
                skipped += 1
            else:
                t0 = clock()
                d = cache.speculate(i, seq[-args.context:], max_spec_tokens=room, max_spec_factor=args.spec_factor,
                                    min_token_prob=args.min_token_prob, use_tree_spec=False)
                lat.append(clock() - t0)
                draft = d.token_ids
            a = 0
            while a < len(draft) and draft[a] == response[t + a]:
                a += 1
            proposed += len(draft)
            accepted += a
            steps += 1
            emitted = response[t:t + a + 1]
            cache.add_active_response(i, emitted)
            seq.extend(emitted)
            t += a + 1
        cache.stop_request(i)
    calls = len(lat)
    c = record.column
    rec.set_parameter("trajectories", record.display_path(args.jsonl))
    rec.add_table("draft", "ArcticInference's suffix decoding cache replayed on recorded turns",
                  [c("drafter", "drafter"), c("us_per_call", "per call", "µs", 2),
                   c("us_per_call_p50", "p50 per call", "µs", 2), c("acceptance", "acceptance", "", 4),
                   c("tokens_per_step", "tokens per step", "", 4), c("accepted", "accepted"), c("proposed", "proposed")],
                  [["arctic-inference", sum(lat) / calls / 1e3 if calls else None,
                    statistics.median(lat) / 1e3 if calls else None, accepted / proposed if proposed else None,
                    tokens / steps if steps else None, accepted, proposed]], baseline_rows=[0])
    path = record.record_path("arctic-draft", args.record)
    if rec.write(path):
        record.note_written(path)
    print(json.dumps({
        "trajectories": len(lines), "tokens": tokens, "calls": calls, "skipped_calls": skipped,
        "us_per_call": sum(lat) / calls / 1e3 if calls else 0.0,
        "us_per_call_p50": statistics.median(lat) / 1e3 if calls else 0.0,
        "proposed": proposed, "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "steps": steps, "tokens_per_step": tokens / steps if steps else 0.0,
        "mean_accepted_per_call": accepted / calls if calls else 0.0,
        "wall_s": time.perf_counter() - wall0}))


if __name__ == "__main__":
    sys.exit(main())
