#!/usr/bin/env python3
"""Chat-template parity: sorl's renderer (runtime/ml/formats/chat_template.hpp, through
build/bench/interop/sorl_chat_render) against transformers' apply_chat_template on the same
model directory, over seeded random conversations (system or not, 1-9 messages, multi-turn,
with and without the generation prompt; contents with Unicode, newlines, braces and Jinja-like
text). Identical text is required on every one.

    python3 bench/interop/chat_template_parity.py MODEL_DIR [--sorl-chat-render BIN] [--n 500]
        [--record PATH]

The run's record (bench/record.py: table "parity") goes to --record PATH, else
$SORL_BENCH_RECORD, else runs/bench/chat-template-parity-UTC.json.

Needs `transformers` (tokenizers and Jinja only: torch is not imported), e.g. in a virtualenv:
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)

CONTENTS = [
    "What is 2+3?", "5", "", " leading space", "trailing space ", "two\nlines", "\n\nblank lines\n",
    "{{ not jinja }}", "{% raw %}", "tab\there", "naïve café 東京 😀👍🏽", "1234567890", "'quoted' \"double\"",
    "<b>html</b>", "a" * 300, "Answer: 42", "```python\ndef f(x):\n    return x\n```",
]


def conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(CONTENTS)})
    for i in range(rng.randint(1, 8)):
        messages.append({"role": "user" if i % 2 == 0 else "assistant",
                         "content": " ".join(rng.choice(CONTENTS) for _ in range(rng.randint(1, 3)))})
    return {"messages": messages, "add_generation_prompt": rng.random() < 0.5}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--sorl-chat-render", default="build/bench/interop/sorl_chat_render")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    record.add_record_argument(ap, "chat-template-parity")
    args = ap.parse_args()
    rec = record.Record("chat-template-parity", threads=1, sorl=record.sorl_build_of_tool(args.sorl_chat_render))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model_dir)
    rng = random.Random(args.seed)
    chats = [conversation(rng) for _ in range(args.n)]
    run = subprocess.run([args.sorl_chat_render, args.model_dir], input="\n".join(json.dumps(c) for c in chats),
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"sorl_chat_render failed: {run.stderr.strip()}")
    ours = [json.loads(line) for line in run.stdout.splitlines()]
    same = 0
    for c, o in zip(chats, ours):
        ref = tok.apply_chat_template(c["messages"], tokenize=False,
                                      add_generation_prompt=c["add_generation_prompt"])
        if ref == o:
            same += 1
        else:
            print(f"MISMATCH\n  chat: {json.dumps(c)}\n  transformers: {ref!r}\n  sorl:         {o!r}")
    print(f"chat templates: {same} / {len(chats)} identical ({args.model_dir})")
    import transformers
    rec.set_parameter("model_dir", record.display_path(args.model_dir))
    rec.set_parameter("seed", args.seed)
    rec.set_parameter("transformers", transformers.__version__)
    c = record.column
    rec.add_table("parity", "sorl_chat_render against transformers' apply_chat_template on random conversations",
                  [c("conversations", "conversations"), c("identical", "identical text")], [[len(chats), same]])
    path = record.record_path("chat-template-parity", args.record)
    if rec.write(path):
        record.note_written(path)
    sys.exit(0 if same == len(chats) == len(ours) else 1)


if __name__ == "__main__":
    main()
