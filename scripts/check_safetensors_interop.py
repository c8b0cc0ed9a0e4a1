#!/usr/bin/env python3
"""Checks that safetensors files written by sorl open in Hugging Face's `safetensors`.

Not part of the required tests: it needs the PyPI packages `safetensors` and `numpy`
(`pip install safetensors numpy`, in a virtual environment), and exits with 77 (the
conventional "skipped" code) when they are missing.

    check_safetensors_interop.py [FILE]
        Opens FILE with safetensors.safe_open and compares every tensor bit for bit with
        the fixture that tests/ml/checkpoint_test.cpp ("safetensors round trip is
        bit-exact ...") writes. FILE defaults to that test's output under
        build-ml-data/. Run the test first.

    check_safetensors_interop.py --write OUT
        Writes the same fixture with the Python library (BF16 excepted: numpy has no
        bfloat16), for checking the other direction with sorl's reader.

With numpy alone BF16 tensors can't be materialised, so for them the library checks
dtype, shape and the file's layout (safe_open validates offsets against the file), and
the bits are read at the offsets the header gives. With torch importable, BF16 is also
loaded through the library.
"""

import json
import struct
import sys
from pathlib import Path

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: {e} (pip install safetensors numpy)")
    sys.exit(77)

DEFAULT_FILE = (Path(__file__).resolve().parent.parent / "build-ml-data" / "tests" / "ml" /
                "data" / "checkpoint_round_trip" / "model.safetensors")

# name -> (safetensors dtype, shape, raw bit patterns as numpy array). Mirrors
# tricky_f32(), tricky_bf16() and the list in checkpoint_test.cpp.
FIXTURE = {
    "w.f32": ("F32", [2, 3], np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000,
                                       0x7FC00001, 0x00000001], dtype=np.uint32)),
    "w.bf16": ("BF16", [4], np.array([0x3F80, 0x8000, 0x7FC1, 0x0001], dtype=np.uint16)),
    "empty": ("F32", [0, 4], np.array([], dtype=np.uint32)),
    "ids.i64": ("I64", [2], np.array([-1, 1 << 40], dtype=np.int64)),
    "ids.i32": ("I32", [1, 1], np.array([-7], dtype=np.int32)),
    "half": ("F16", [2], np.array([0x3C00, 0xFC00], dtype=np.uint16)),
    "bytes": ("U8", [3], np.array([0, 255, 7], dtype=np.uint8)),
    "scalar": ("F32", [], np.array([0x40490FDB], dtype=np.uint32)),
}
METADATA = {"format": "pt", "note": "héllo"}
NUMPY_VIEW = {"F32": np.uint32, "F16": np.uint16, "I64": np.int64, "I32": np.int32,
              "U8": np.uint8}


def raw_bits(path, name, dtype):
    """Bits of `name` read at the header's offsets (the library has validated them)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    begin, end = json.loads(data[8:8 + n])[name]["data_offsets"]
    return np.frombuffer(data[8 + n + begin:8 + n + end], dtype=dtype)


def check(path):
    failures = []
    with safe_open(str(path), framework="numpy") as f:
        if f.metadata() != METADATA:
            failures.append(f"metadata {f.metadata()!r} != {METADATA!r}")
        if set(f.keys()) != set(FIXTURE):
            failures.append(f"names {sorted(f.keys())} != {sorted(FIXTURE)}")
        for name, (dtype, shape, bits) in FIXTURE.items():
            if name not in f.keys():
                continue
            sl = f.get_slice(name)
            if sl.get_dtype() != dtype or list(sl.get_shape()) != shape:
                failures.append(f"{name}: {sl.get_dtype()} {sl.get_shape()} != {dtype} {shape}")
                continue
            if dtype == "BF16":
                got = raw_bits(path, name, np.uint16)
            else:
                arr = f.get_tensor(name)
                if list(arr.shape) != shape:
                    failures.append(f"{name}: numpy shape {list(arr.shape)} != {shape}")
                got = np.ascontiguousarray(arr).reshape(-1).view(NUMPY_VIEW[dtype])
            if not np.array_equal(got, bits.view(got.dtype)):
                failures.append(f"{name}: bits {got.tolist()} != {bits.tolist()}")
    try:
        import torch  # noqa: F401
        from safetensors.torch import load_file
        t = load_file(str(path))["w.bf16"]
        got = t.view(torch.int16).numpy().view(np.uint16)
        if not np.array_equal(got, FIXTURE["w.bf16"][2]):
            failures.append(f"w.bf16 via torch: {got.tolist()}")
    except ImportError:
        print("note: torch not importable; BF16 bits checked at the header's offsets")
    return failures


def write(out):
    tensors = {name: bits.view({"F32": np.float32, "F16": np.float16}.get(dtype, bits.dtype))
               .reshape(shape)
               for name, (dtype, shape, bits) in FIXTURE.items() if dtype != "BF16"}
    save_file(tensors, str(out), metadata=METADATA)
    print(f"wrote {out} ({len(tensors)} tensors; BF16 omitted)")


def main(argv):
    if len(argv) == 3 and argv[1] == "--write":
        write(Path(argv[2]))
        return 0
    path = Path(argv[1]) if len(argv) > 1 else DEFAULT_FILE
    if not path.exists():
        print(f"{path} does not exist: run the C++ test that writes it first")
        return 2
    failures = check(path)
    for line in failures:
        print("FAIL", line)
    if not failures:
        print(f"ok: {path} opens in safetensors and matches the fixture bit for bit")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
