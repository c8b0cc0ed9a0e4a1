#!/usr/bin/env python3
"""Token-id parity and speed of sorl's hf_tokenizer against the Python `tokenizers` library.

Usage:
    tokenizer_parity.py TOKENIZER_JSON SORL_TOKENIZE [--repeat N] [--show K]

TOKENIZER_JSON is a Hugging Face tokenizer.json; SORL_TOKENIZE the sorl_tokenize binary
(build/bench/interop/sorl_tokenize). Needs the `tokenizers` package (pip install tokenizers).

Encodes a built-in corpus (several hundred texts: English, contractions in every case, code,
whitespace runs, CJK, Arabic, Devanagari, combining marks and NFC/NFD pairs, emoji with ZWJ
sequences and flags, digit runs, special-token spellings, random code points and random
bytes decoded with replacement) both ways and in both modes:
    plain    Python with `encode_special_tokens = True`  vs  sorl `encode`
    special  Python's default                            vs  sorl `encode_with_special`
(both without post-processing: add_special_tokens=False). Prints, per mode, the number of
texts, how many got identical ids, and the first mismatches with both id lists. Then times
both over the corpus repeated N times (encode only, one thread: Python's `encode` loop and
its `encode_batch` with TOKENIZERS_PARALLELISM=false, sorl's time inside `encode`) and
prints tokens/s and the ratio. Exits 1 when any text differs. With --pipelines the same
vocabulary is also checked under Llama 3's and Qwen2's pre-tokenizer pipelines. The run's
record (bench/record.py: tables "parity" and "speed", Python's rows the baselines) goes to
--record PATH, else $SORL_BENCH_RECORD, else runs/bench/tokenizer-parity-UTC.json.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import unicodedata

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as sorl_tokenize
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizers import Tokenizer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import record  # noqa: E402  (bench/record.py)


def hand_written():
    """Texts chosen for the cases where tokenizers differ most often."""
    texts = [
        "Hello world",
        "The quick brown fox jumps over the lazy dog.",
        " leading space",
        "  two leading spaces",
        "trailing space ",
        "trailing spaces   ",
        "\ttab\tseparated\tvalues\t",
        "line one\nline two\n",
        "windows\r\nline\r\nendings\r\n",
        "blank lines\n\n\nafter",
        "\n\n\n",
        "   \n   \n",
        " ",
        "",
        "a",
        "mixed \t \n \r\n whitespace \u00a0 nbsp \u2003 em \u3000 ideographic",
        "it's it'S IT'S It's",
        "don't DON'T Don't dOn'T",
        "we're WE'RE we've WE'VE I'm I'M you'll YOU'LL he'd HE'D",
        "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D",
        "rock'n'roll o'clock y'all ma'am",
        "'hello' \"quoted\" `backticks`",
        "long s: it'\u017f, Kelvin: \u212a, dotted I: \u0130stanbul, sharp s: STRASSE stra\u00dfe",
        "contractions after digits: 1's 2'll 3'D",
        "12345",
        "1234567890123456789012345678901234567890",
        "3.14159 2,718 1e-10 0x1F 0b1010 1_000_000",
        "Call 555-0123 or +1 (800) 555-0199.",
        "Prices: $5.99, \u20ac10, \u00a320, \u00a51000",
        "Dates 2024-01-15 and 15/01/2024 at 23:59:59",
        "full-width digits \uff11\uff12\uff13 arabic-indic \u0661\u0662\u0663 devanagari \u0967\u0968\u0969",
        "superscripts x\u00b2 y\u00b3 fractions \u00bd \u2153 roman \u2162 \u216b circled \u2460\u2461",
        "def add(a, b):\n    return a + b\n",
        "class Foo:\n    def __init__(self):\n        self.x = 1\n\n    def bar(self) -> int:\n        return self.x\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
        "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v.size() == 3 ? 0 : 1;\n}\n",
        "if x:\n        y = [i**2 for i in range(10) if i % 2 == 0]\n",
        "    indented with four spaces",
        "\t\tindented with tabs",
        "x=1;y=2;z=x+y",
        "a  b   c    d     e",
        "<html><body><p class=\"x\">Hi</p></body></html>",
        '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
        "https://example.com/path?query=1&other=two#frag",
        "user@example.com",
        "**bold** _italic_ `code` # Heading\n- item 1\n- item 2",
        "!!!???...---___===+++",
        "\u2014em dash\u2013en dash\u2026ellipsis \u201cquotes\u201d \u2018single\u2019",
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f",
        "\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629 \u0645\u0639 \u062a\u0634\u0643\u064a\u0644",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u0436\u0438\u043a",
        "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
        "Tie\u0302\u0301ng Vie\u0323\u0302t",
        "Ti\u1ebfng Vi\u1ec7t",
        "caf\u00e9 vs cafe\u0301",
        "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m vs \u212bngstr\u00f6m",
        "\u1e9b\u0323 and \u0073\u0323\u0307 and \u1e69",
        "e\u0301\u0301\u0301 stacked marks a\u0300\u0301\u0302\u0303\u0304",
        "\ud55c vs \u1112\u1161\u11ab (precomposed vs jamo)",
        "\u0915\u094d\u200d\u0937 zero-width joiner, a\u200bb zero-width space, a\u2060b word joiner",
        "\ufeffbyte order mark",
        "mongolian vowel separator a\u180eb",
        "soft\u00adhyphen",
        "emoji \U0001f600\U0001f601\U0001f602 \U0001f44d\U0001f3fd",
        "family \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 and \U0001f469\u200d\u2764\ufe0f\u200d\U0001f468",
        "flags \U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5 \U0001f1e9\U0001f1ea \U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
        "keycaps 1\ufe0f\u20e3 #\ufe0f\u20e3 and text \u2764 vs \u2764\ufe0f",
        "\U0001f9d1\u200d\U0001f4bb coding \U0001f680\U0001f680\U0001f680",
        "math \u2200x\u2208\u211d: x\u00b2 \u2265 0 \u2227 \u221a4 = 2 \u2211 \u222b",
        "box drawing \u250c\u2500\u2510\u2502 \u2514\u2500\u2518",
        "private use \ue000\uf8ff and plane 15 \U000f0000",
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|><|im_end|><|endoftext|>",
        "text<|im_end|>text",
        " <|im_end|> ",
        "<|im_end",
        "|im_end|>",
        "<|im_end|",
        "<<|im_end|>>",
        "<|im_start|>system\nYou are helpful.<|im_end|>",
        "<repo_name>sorl<file_sep>main.cpp<filename>x.py",
        "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
        "<|begin_of_text|><|eot_id|> not in this vocabulary",
        "<s></s><unk>[CLS][SEP]",
        "\u00e9<|im_end|>\u0301",
        "e<|im_end|>\u0301 combining mark after a special token",
        "ABC" * 30,
        "ab" * 100,
        "!" * 64,
        " " * 100 + "x",
        "\n" * 50 + "end",
        "x" + " " * 300,
        "\t" * 40 + "tabs",
        "9" * 250,
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
        "\u4e00" * 60,
        "\U0001f600" * 40,
        "a\u0301" * 50,
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud "
        "exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.",
        "Mixed \u4e2d\u6587English\u6df7\u5408123\u6570\u5b57",
        "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_CASE",
        "__dunder__ __init__.py ../relative/path ~/home C:\\Windows\\System32",
        "a\u0000b null byte and \u0001\u0002\u001f control characters \u007f",
        "\u0085next line \u2028line separator \u2029paragraph separator",
        "\r\r\n\n\r",
        "   leading\n   and trailing   \n",
        "tab then newline\t\n\tand back",
        "Q: What's 2+2?\nA: It's 4.",
        "SELECT * FROM users WHERE id = 42 AND name LIKE '%o''neil%';",
        "$ ls -la | grep '.cpp' && echo \"done\" > /dev/null 2>&1",
        "x\u0301 y\u0308 z\u0327",
        "\u0130\u0131 \u03a3\u03c3\u03c2",
    ]
    return texts


def generated(seed=20240611, count=260):
    """Random texts: word salads in several scripts, random code points, random bytes."""
    rng = random.Random(seed)
    words = [
        "the", "of", "and", "tokenizer", "byte", "pair", "encoding", "merge", "rank",
        "it's", "DON'T", "we'll", "I'D", "Hello", "WORLD", "\u4f60\u597d", "\u4e16\u754c",
        "\u6771\u4eac", "\u0645\u0631\u062d\u0628\u0627", "\u0928\u092e\u0938\u094d\u0924\u0947",
        "caf\u00e9", "cafe\u0301", "na\u00efve", "nai\u0308ve", "\u00fcber", "u\u0308ber",
        "2024", "3.14", "1000000", "42", "\U0001f600", "\U0001f44d\U0001f3fb",
        "\U0001f1eb\U0001f1f7", "\U0001f469\u200d\U0001f52c", "<|im_end|>", "<|im_start|>",
        "<|endoftext|>", "def", "return", "{", "}", "();", "->", "::", "==", "!=", "//", "/*",
        "\u041f\u0440\u0438\u0432\u0435\u0442", "\u03b1\u03b2\u03b3", "\u00df", "\u0130",
    ]
    seps = [" ", " ", " ", "", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "   ", "\u00a0", ", ", ". "]
    ranges = [
        (0x20, 0x7E), (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
        (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
        (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x22FF), (0x3000, 0x30FF),
        (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF),
        (0x1F900, 0x1F9FF), (0x9, 0xD),
    ]
    out = []
    for i in range(count):
        kind = i % 5
        if kind in (0, 1):
            n = rng.randint(1, 30)
            out.append("".join(rng.choice(words) + rng.choice(seps) for _ in range(n)))
        elif kind == 2:
            n = rng.randint(1, 60)
            chars = []
            for _ in range(n):
                lo, hi = rng.choice(ranges)
                cp = rng.randint(lo, hi)
                if 0xD800 <= cp <= 0xDFFF:
                    cp = 0x41
                chars.append(chr(cp))
            out.append("".join(chars))
        elif kind == 3:
            n = rng.randint(1, 80)
            data = bytes(rng.randint(0, 255) for _ in range(n))
            out.append(data.decode("utf-8", errors="replace"))
        else:
            parts = []
            for _ in range(rng.randint(1, 8)):
                r = rng.random()
                if r < 0.25:
                    parts.append(str(rng.randint(0, 10 ** rng.randint(1, 40))))
                elif r < 0.5:
                    parts.append(rng.choice([" ", "\t", "\n", "\r\n", "\u3000"]) * rng.randint(1, 40))
                elif r < 0.75:
                    parts.append(rng.choice(words).upper() + "'" + rng.choice(["s", "S", "ll", "LL", "Ll", "d", "D", "ve", "VE", "re", "t", "m"]))
                else:
                    parts.append(rng.choice(words))
            out.append("".join(parts))
    return out


def corpus():
    texts = hand_written()
    # NFC / NFD / NFKC forms of every hand-written text that has non-ASCII characters.
    forms = []
    for t in texts:
        if any(ord(c) > 127 for c in t):
            for form in ("NFD", "NFC"):
                n = unicodedata.normalize(form, t)
                if n != t:
                    forms.append(n)
    return texts + forms + generated()


def run_sorl(binary, path, texts, special, repeat):
    args = [binary, path, "json=1"] + (["special=1"] if special else [])
    payload = "".join(json.dumps(t) + "\n" for t in texts * repeat).encode()
    proc = subprocess.run(args, input=payload, capture_output=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"sorl_tokenize failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    lines = proc.stdout.decode().split("\n")[: len(texts)]
    ids = [[int(x) for x in line.split()] for line in lines]
    stats = dict(kv.split("=") for kv in proc.stderr.decode().split())
    return ids, float(stats["encode_seconds"]), int(stats["tokens"])


def compare(name, texts, py_ids, sorl_ids, show, table):
    same = sum(1 for a, b in zip(py_ids, sorl_ids) if a == b)
    print(f"{name}: {len(texts)} texts, {same} identical")
    table["rows"].append([name, len(texts), same])
    shown = 0
    for text, a, b in zip(texts, py_ids, sorl_ids):
        if a != b and shown < show:
            shown += 1
            print(f"  text  {text!r}")
            print(f"  python {a}")
            print(f"  sorl   {b}")
    return same == len(texts)


# The split patterns of the families' tokenizer.json files (as
# runtime/ml/formats/tokenizer_json.hpp).
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def pipeline_variants(path):
    """The vocabulary of `path` under Llama 3's pipeline (Split with its pattern, then
    ByteLevel without its own split, ignore_merges) and Qwen2's (NFC, Split with its pattern,
    ByteLevel), as (label, temporary tokenizer.json path) pairs."""
    with open(path, encoding="utf-8") as f:
        base = json.load(f)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    out = []
    for label, pattern, normalizer, ignore in (("llama3 ", LLAMA3, None, True),
                                               ("qwen2 ", QWEN2, {"type": "NFC"}, False)):
        doc = json.loads(json.dumps(base))
        doc["normalizer"] = normalizer
        doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}, byte_level]}
        doc["model"]["ignore_merges"] = ignore
        fd, tmp = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        out.append((label, tmp))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tokenizer_json")
    parser.add_argument("sorl_tokenize")
    parser.add_argument("--repeat", type=int, default=20, help="corpus passes for the timing")
    parser.add_argument("--show", type=int, default=5, help="mismatches to print per mode")
    parser.add_argument("--pipelines", action="store_true",
                        help="also check the file's vocabulary under Llama 3's and Qwen2's pipelines")
    record.add_record_argument(parser, "tokenizer-parity")
    args = parser.parse_args()
    rec = record.Record("tokenizer-parity", threads=1, sorl=record.sorl_build_of_tool(args.sorl_tokenize))
    c = record.column
    parity = rec.add_table("parity", "token ids identical to the tokenizers library's, per mode",
                           [c("mode", "mode"), c("texts", "texts"), c("identical", "identical")])

    texts = corpus()
    ok = True
    variants = pipeline_variants(args.tokenizer_json) if args.pipelines else []
    for label, path in [("", args.tokenizer_json)] + variants:
        tk = Tokenizer.from_file(path)
        for special in (False, True):
            name = label + ("special" if special else "plain")
            tk.encode_special_tokens = not special
            py_ids = [tk.encode(t, add_special_tokens=False).ids for t in texts]
            sorl_ids, _, _ = run_sorl(args.sorl_tokenize, path, texts, special, 1)
            ok &= compare(name, texts, py_ids, sorl_ids, args.show, parity)
    for _, path in variants:
        os.unlink(path)
    tk = Tokenizer.from_file(args.tokenizer_json)

    # Speed, plain mode, the corpus `repeat` times.
    tk.encode_special_tokens = True
    many = texts * args.repeat
    t0 = time.perf_counter()
    py_tokens = sum(len(tk.encode(t, add_special_tokens=False).ids) for t in many)
    py_loop = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = tk.encode_batch(many, add_special_tokens=False)
    py_batch = time.perf_counter() - t0
    assert sum(len(e.ids) for e in batch) == py_tokens
    _, sorl_seconds, sorl_tokens = run_sorl(args.sorl_tokenize, args.tokenizer_json, texts, False, args.repeat)
    print(f"speed ({len(many)} texts, {py_tokens} tokens, one thread):")
    print(f"  python encode loop   {py_tokens / py_loop:12.0f} tokens/s")
    print(f"  python encode_batch  {py_tokens / py_batch:12.0f} tokens/s")
    print(f"  sorl encode          {sorl_tokens / sorl_seconds:12.0f} tokens/s")
    print(f"  sorl / python loop {py_loop / sorl_seconds:.2f}x, sorl / python batch {py_batch / sorl_seconds:.2f}x")
    import tokenizers
    rec.set_parameter("tokenizer_json", record.display_path(args.tokenizer_json))
    rec.set_parameter("texts_timed", len(many))
    rec.set_parameter("tokens_timed", py_tokens)
    rec.set_parameter("tokenizers", tokenizers.__version__)
    rec.add_table("speed", "encoding the corpus repeated, plain mode, one thread",
                  [c("encoder", "encoder"), c("tokens_per_s", "speed", "tokens/s", 0),
                   c("sorl_over", "sorl over it", "x", 2)],
                  [["python encode loop", py_tokens / py_loop, py_loop / sorl_seconds],
                   ["python encode_batch", py_tokens / py_batch, py_batch / sorl_seconds],
                   ["sorl encode", sorl_tokens / sorl_seconds, 1.0]], baseline_rows=[0, 1])
    path = record.record_path("tokenizer-parity", args.record)
    if rec.write(path):
        record.note_written(path)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
