#!/usr/bin/env python3
"""A reward process (runtime/ml/tasks/reward_process.hpp) that scores with reasoning-gym.

Each item is scored by reasoning-gym's own score_answer for the dataset its entry names
(entry["metadata"]["source_dataset"], as scripts/fetch-data writes the whole entry), so
rewards are exactly the library's, partial credit included (countdown gives 0.05 to a wrong
expression, 0.01 to one it cannot parse).

The answer scored is the text of the completion's last <answer>...</answer> (reasoning-gym's
extract_answer), or the whole completion stripped when it has no such tag.

Protocol: one JSON request per stdin line, {"id", "items": [{"prompt", "completion",
"answer", "entry"}]}; one reply per request on stdout, {"id", "rewards", "errors"}, flushed
at once. An item that cannot be scored (no entry, an unknown dataset, score_answer raising)
gets a null reward and its reason in "errors"; it never ends the process. stdout carries
replies only: anything else the libraries print goes to stderr with the logs.

Usage: python reasoning_gym_reward.py [--dataset NAME]
  --dataset NAME  the dataset of items whose entry names none (default: none, an error)
Needs reasoning-gym (tested with 0.1.25) in the interpreter that runs it.
"""

import argparse
import json
import math
import re
import sys

# Replies go to the real stdout only; a print() anywhere else lands in the log.
PROTOCOL = sys.stdout
sys.stdout = sys.stderr

ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def log(message):
    print(f"reasoning_gym_reward: {message}", file=sys.stderr, flush=True)


def make_extractor(rg_utils):
    """The completion's answer: the last <answer> tag's text, else the whole completion."""
    extract = getattr(rg_utils, "extract_answer", None)

    def tagged(completion):
        if extract is not None:
            return extract(completion)
        matches = ANSWER_TAG.findall(completion)
        return matches[-1].strip() if matches else None

    def answer_of(completion):
        found = tagged(completion)
        return found if found is not None else completion.strip()

    return answer_of


class Scorers:
    """score_answer of each dataset, made once: some datasets load data when built."""

    def __init__(self, reasoning_gym):
        self.rg = reasoning_gym
        self.known = {}  # name -> (function or None, error or None)

    def get(self, name):
        if name not in self.known:
            self.known[name] = self._make(name)
        fn, error = self.known[name]
        if fn is None:
            raise LookupError(error)
        return fn

    def _make(self, name):
        reasons = []
        if hasattr(self.rg, "get_score_answer_fn"):
            try:
                return self.rg.get_score_answer_fn(name), None
            except Exception as e:  # a dataset whose default config cannot be built
                reasons.append(f"get_score_answer_fn: {type(e).__name__}: {e}")
        try:
            return self.rg.create_dataset(name, size=1, seed=0).score_answer, None
        except Exception as e:
            reasons.append(f"create_dataset: {type(e).__name__}: {e}")
        error = f"no scorer for dataset {name!r} ({'; '.join(reasons)})"
        log(error)
        return None, error


def score_item(item, scorers, answer_of, default_dataset):
    """(reward, None) or (None, reason)."""
    if not isinstance(item, dict):
        return None, "item is not an object"
    entry = item.get("entry")
    completion = item.get("completion")
    if not isinstance(completion, str):
        return None, "item has no completion string"
    if not isinstance(entry, dict):
        return None, "item has no reasoning-gym entry (an object with metadata.source_dataset)"
    metadata = entry.get("metadata")
    name = metadata.get("source_dataset") if isinstance(metadata, dict) else None
    name = name or default_dataset
    if not isinstance(name, str) or not name:
        return None, "entry has no metadata.source_dataset (and no --dataset was given)"
    try:
        fn = scorers.get(name)
        reward = fn(answer=answer_of(completion), entry=entry)
        reward = float(reward)
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    if not math.isfinite(reward):
        return None, f"score_answer returned {reward}"
    return reward, None


def reply_to(line, scorers, answer_of, default_dataset):
    try:
        request = json.loads(line)
    except ValueError as e:
        log(f"request is not JSON: {e}")
        return {"id": None, "rewards": [], "errors": []}
    if not isinstance(request, dict):
        log("request is not a JSON object")
        return {"id": None, "rewards": [], "errors": []}
    items = request.get("items")
    if not isinstance(items, list):
        log("request has no items list")
        return {"id": request.get("id"), "rewards": [], "errors": []}
    rewards, errors = [], []
    for item in items:
        try:
            reward, error = score_item(item, scorers, answer_of, default_dataset)
        except Exception as e:  # score_item catches the scorer's; this is a last resort
            reward, error = None, f"{type(e).__name__}: {e}"
        rewards.append(reward)
        errors.append(error)
    return {"id": request.get("id"), "rewards": rewards, "errors": errors}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=None,
                        help="dataset of items whose entry names none")
    args = parser.parse_args()

    try:
        import reasoning_gym
        import reasoning_gym.utils
    except ImportError as e:
        log(f"cannot import reasoning_gym ({e}); install reasoning-gym into {sys.executable}'s environment")
        sys.exit(1)

    scorers = Scorers(reasoning_gym)
    answer_of = make_extractor(reasoning_gym.utils)
    log("ready")
    stdin = sys.stdin.buffer
    while True:
        raw = stdin.readline()
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        reply = reply_to(line, scorers, answer_of, args.dataset)
        PROTOCOL.write(json.dumps(reply, allow_nan=False) + "\n")
        PROTOCOL.flush()


if __name__ == "__main__":
    main()
