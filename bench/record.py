"""Benchmark records from Python: the format bench/record.hpp writes from C++, defined once here
for the Python drivers and table makers (standard library only).

A record is one JSON file per run: what was measured (named tables whose columns carry units,
with the baselines measured in the same run), by which sorl binary (version, commit, dirty
flag), the command, the UTC date-time, and the machine (CPU model, cores used and available,
the 1-minute load average at the start). bench/render-records turns records into the docs'
tables; docs/benchmarks.md describes every field.

    import record                      # bench/ on sys.path
    rec = record.Record("trl-compare", threads=2, sorl=record.sorl_build("build/sorl"))
    t = rec.add_table("steps", "mean over steps 2-10", [record.column("who", "run"),
                      record.column("s_per_step", "s/step", "s", digits=1)])
    t["rows"].append(["sorl", 9.4])
    rec.write(record.record_path("trl-compare", args.record))
"""

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time

FORMAT = "sorl-bench-record"
FORMAT_VERSION = 1

_KEY = re.compile(r"^[A-Za-z0-9_.-]+$")
_VERSION_LINE = re.compile(r"^sorl (\S+) \(commit ([0-9a-f]+|unknown)(, dirty)?\)$")


def repo_root():
    """The repository this file lives in (bench/..)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def utc_now():
    """The current time as "YYYY-MM-DDTHH:MM:SSZ" (UTC, whole seconds)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def shell_quote(arg):
    """`arg` quoted for a POSIX shell when it needs it (the same rule as bench/record.hpp)."""
    return shlex.quote(arg)


def display_path(path):
    """`path` relative to the working directory when it lies under it, else as given: what a
    record's parameters show of a file."""
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else rel


def command_line(argv=None):
    """$SORL_BENCH_COMMAND when a driver set it, else `argv` (default sys.argv, run as
    `python3 SCRIPT ...`) shell-quoted with the script relative to the working directory."""
    env = os.environ.get("SORL_BENCH_COMMAND")
    if env:
        return env
    argv = list(sys.argv if argv is None else argv)
    if argv:
        script = os.path.abspath(argv[0])
        rel = os.path.relpath(script)
        argv[0] = rel if not rel.startswith("..") else argv[0]
        if argv[0].endswith(".py"):
            argv = ["python3"] + argv
    return " ".join(shell_quote(a) for a in argv)


def _proc_field(path, key):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(key) and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine(threads=None):
    """The machine's facts now: CPU model, cores online and available to this process, the
    threads the bench ran with, the 1-minute load average, memory and GPU (bench/record.hpp's
    record_machine)."""
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    mem_kb = _proc_field("/proc/meminfo", "MemTotal").split()
    return {
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or "unknown",
        "cores_online": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)),
        "threads_used": threads,
        "load_1min_at_start": load,
        "memory_gib": round(int(mem_kb[0]) / (1024 * 1024), 1) if mem_kb else 0.0,
        "gpu": gpu_models(),
    }


def gpu_models(folder="/proc/driver/nvidia/gpus"):
    """The GPU models the NVIDIA driver lists under `folder` (each GPU's `information` file's
    "Model:" line), sorted and comma-separated, or "none" (bench/record.hpp record_gpu_models)."""
    gpus = set()
    if os.path.isdir(folder):
        for d in os.listdir(folder):
            model = _proc_field(os.path.join(folder, d, "information"), "Model")
            if model:
                gpus.add(model)
    return ", ".join(sorted(gpus)) or "none"


def sorl_build(binary=None):
    """The sorl build a record describes: `binary --version` (the binary that was measured,
    e.g. "build/sorl") when given, else the repository's git state (for a bench that measures
    no sorl binary). Raises RuntimeError naming the binary when it cannot say its version."""
    if binary is not None:
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
        except OSError as e:
            raise RuntimeError(f"{binary} --version: {e}") from e
        m = _VERSION_LINE.match(out.stdout.strip())
        if out.returncode != 0 or not m:
            raise RuntimeError(f"{binary} --version printed {out.stdout.strip()!r} "
                               f"(exit {out.returncode}), not 'sorl VERSION (commit HASH)'")
        return {"version": m.group(1), "commit": m.group(2), "dirty": m.group(3) is not None,
                "source": f"{binary} --version"}
    root = repo_root()

    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    dirty = commit != "unknown" and git("diff", "--quiet", "HEAD", "--").returncode != 0
    version = "unknown"
    try:
        with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
            m = re.search(r"project\(sorl VERSION (\S+)", f.read())
            version = m.group(1) if m else version
    except OSError:
        pass
    return {"version": version, "commit": commit, "dirty": dirty,
            "source": "git checkout (no sorl binary measured)"}


def sorl_build_of_tool(tool):
    """The sorl build behind a measurement tool that does not report its own build (the tools
    of build/bench/interop/, sorl_grpo_loss among them): the repository's git state, with a
    source saying so and naming the tool, so that a reader knows the commit is the checkout's
    at record time."""
    build = sorl_build()
    build["source"] = f"git checkout at record time ({tool} reports no build of its own)"
    return build


def sorl_runtime(binary=None, log_text=None):
    """The numeric libraries of a sorl binary a Python driver measured: libtorch's version from
    the libtorch_cpu the binary links (ldd), the BLAS and the CPU-kernels line from a sorl
    log's "CPU kernels: ..." line (`sorl train` logs it). Unknown fields are None."""
    rt = {"libtorch": None, "blas": None, "cpu_kernels": None}
    if binary is not None:
        try:
            out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60).stdout
            m = re.search(r"libtorch_cpu\.so\.([0-9][0-9.]*)", out)
            rt["libtorch"] = m.group(1) if m else None
        except OSError:
            pass
    if log_text:
        m = re.search(r"CPU kernels: (.*)", log_text)
        if m:
            rt["cpu_kernels"] = m.group(1).strip()
            b = re.match(r"BLAS (\S+)", rt["cpu_kernels"])
            rt["blas"] = b.group(1) if b and b.group(1) != "none" else None
    return rt


def run_threads(run_dir):
    """[run] threads of a sorl run, from the config.resolved.toml sorl writes into its run
    folder (every default filled in), or None when there is none."""
    try:
        with open(os.path.join(run_dir, "config.resolved.toml"), encoding="utf-8") as f:
            run = re.search(r"(?ms)^\[run\]$(.*?)(?=^\[|\Z)", f.read())
    except OSError:
        return None
    m = re.search(r"(?m)^threads = (\d+)", run.group(1)) if run else None
    return int(m.group(1)) if m else None


def record_path(bench, flag=None):
    """Where a record goes: `flag` (the script's --record PATH) when given, else
    $SORL_BENCH_RECORD when set, else runs/bench/<bench>-<utc>.json under the working
    directory. "none" for either means no record."""
    if flag:
        return flag
    env = os.environ.get("SORL_BENCH_RECORD")
    if env:
        return env
    stamp = utc_now().replace("-", "").replace(":", "")
    return os.path.join("runs", "bench", f"{bench}-{stamp}.json")


def add_record_argument(parser, bench):
    """Adds --record PATH to an argparse parser."""
    parser.add_argument("--record", metavar="PATH",
                        help=f"write the run's record here (default $SORL_BENCH_RECORD, else "
                             f"runs/bench/{bench}-UTC.json; 'none': no record; docs/benchmarks.md)")


def pop_record_flag(argv):
    """(PATH, the other arguments) for a script that reads its arguments by hand: `--record
    PATH` taken out of `argv` (PATH None when absent). Raises ValueError when PATH is missing."""
    if "--record" not in argv:
        return None, list(argv)
    i = argv.index("--record")
    if i + 1 >= len(argv):
        raise ValueError("--record needs a path")
    return argv[i + 1], argv[:i] + argv[i + 2:]


def column(key, label, unit="", digits=None, baseline=False, significant=None):
    """One column of a result table (bench/record.hpp record_column): `key` is what a docs
    marker selects it by, `digits` the decimals shown (None: the number as written),
    `baseline` true for a figure measured in the same run as a point of comparison,
    `significant` the significant digits shown instead (figures that span decades)."""
    if not _KEY.match(key):
        raise ValueError(f"column key {key!r}: letters, digits, '_', '.' or '-' only")
    c = {"key": key, "label": label, "unit": unit}
    if digits is not None:
        c["digits"] = digits
    if baseline:
        c["baseline"] = True
    if significant:
        c["significant"] = significant
    return c


def clean_cell(v):
    """A cell as JSON stores it: None for a missing or non-finite number; a numpy scalar as the
    Python number it holds."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    return v


def driver_start():
    """$SORL_BENCH_START, "YYYY-MM-DDTHH:MM:SSZ LOAD" (bench/record.sh sets it when a driver
    starts), as (date, load, seconds since then); None when unset or malformed."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) ([0-9.]+)$", os.environ.get("SORL_BENCH_START", ""))
    if not m:
        return None
    then = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    elapsed = (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()
    return m.group(1), float(m.group(2)), elapsed


class Record:
    """One run's record, started at the bench's start (date, load and machine are read then;
    a driver's start from $SORL_BENCH_START instead, as bench/record.hpp does)."""

    def __init__(self, bench, argv=None, threads=None, sorl=None, runtime=None):
        if not _KEY.match(bench):
            raise ValueError(f"bench name {bench!r}: letters, digits, '_', '.' or '-' only")
        self._start = time.monotonic()
        start = driver_start()
        self.data = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "bench": bench,
            "command": command_line(argv),
            "argv": list(sys.argv if argv is None else argv),
            "date_utc": utc_now(),
            "duration_s": None,
            "sorl": sorl if sorl is not None else sorl_build(),
            "machine": machine(threads),
            "runtime": runtime if runtime is not None else {"libtorch": None, "blas": None,
                                                            "cpu_kernels": None},
            "parameters": {},
            "tables": [],
        }
        if start:
            self.data["date_utc"], self.data["machine"]["load_1min_at_start"] = start[0], start[1]
            self._start -= start[2]

    def set_threads(self, threads):
        self.data["machine"]["threads_used"] = threads

    def set_parameter(self, key, value):
        self.data["parameters"][key] = clean_cell(value)

    def add_table(self, name, title, columns, rows=(), baseline_rows=()):
        """Adds a table and returns it (a dict; append rows to its "rows", one cell per
        column). Raises ValueError on a repeated table name or column key."""
        return add_table(self.data, name, title, columns, rows, baseline_rows)

    def write(self, path):
        """Writes the record to `path` (record_path's result) and returns whether it did;
        "none" writes nothing. The duration is the time since the record was started."""
        self.data["duration_s"] = round(time.monotonic() - self._start, 1)
        return write(self.data, path)


def add_table(data, name, title, columns, rows=(), baseline_rows=()):
    """Adds a table to a record's dict (Record.add_table, or a record read back with load)."""
    if not _KEY.match(name):
        raise ValueError(f"table name {name!r}: letters, digits, '_', '.' or '-' only")
    if any(t["name"] == name for t in data["tables"]):
        raise ValueError(f"a second table named {name!r}")
    keys = [c["key"] for c in columns]
    if len(set(keys)) != len(keys):
        raise ValueError(f"table {name!r}: a column key repeated in {keys}")
    t = {"name": name, "title": title, "columns": list(columns), "rows": [list(r) for r in rows]}
    if baseline_rows:
        t["baseline_rows"] = list(baseline_rows)
    data["tables"].append(t)
    return t


def table(data, name):
    """The table called `name` in a record's dict, or None."""
    return next((t for t in data["tables"] if t["name"] == name), None)


def write(data, path):
    """Writes a record's dict to `path` (creating its folder) after checking every row has one
    cell per column; "none" writes nothing. Returns whether a file was written."""
    if path == "none":
        return False
    for t in data["tables"]:
        t["rows"] = [[clean_cell(v) for v in r] for r in t["rows"]]
        for i, r in enumerate(t["rows"]):
            if len(r) != len(t["columns"]):
                raise ValueError(f"table {t['name']!r} row {i}: {len(r)} cells for "
                                 f"{len(t['columns'])} columns")
    data["parameters"] = {k: clean_cell(v) for k, v in data.get("parameters", {}).items()}
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"  # before the file is opened
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return True


def load(path):
    """A record read back; raises ValueError naming the file when it is not a record of this
    format's version."""
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not JSON: {e.msg}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a sorl bench record (no \"format\": \"{FORMAT}\")")
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: record format_version {data.get('format_version')!r}, this "
                         f"reader knows {FORMAT_VERSION}")
    for key in ("bench", "command", "date_utc", "sorl", "machine", "tables"):
        if key not in data:
            raise ValueError(f"{path}: record without \"{key}\"")
    return data


def merge(out_path, parts):
    """One record of a driver's several bench runs: `parts` is [(record path, table, new
    name)], each source's table renamed into the output. The first source gives the command,
    date, machine and runtime; every source's argv, date, duration and load go to "parts".
    Raises ValueError when the sources were measured with different sorl builds."""
    sources = [(load(p), table_name, new) for p, table_name, new in parts]
    if not sources:
        raise ValueError("merge: no records to merge")
    first = sources[0][0]
    out = {k: v for k, v in first.items() if k != "tables"}
    out["tables"], out["parts"] = [], []
    for (data, table_name, new), (path, _, _) in zip(sources, parts):
        if (data["sorl"].get("commit"), data["sorl"].get("dirty")) != \
                (first["sorl"].get("commit"), first["sorl"].get("dirty")):
            raise ValueError(f"merge: {path} was measured with sorl {data['sorl'].get('commit')}, "
                             f"{parts[0][0]} with {first['sorl'].get('commit')}")
        t = table(data, table_name)
        if t is None:
            raise ValueError(f"merge: {path} has no table {table_name!r}")
        add_table(out, new, t["title"], t["columns"], t["rows"], t.get("baseline_rows", ()))
        out["parts"].append({"argv": data.get("argv"), "date_utc": data["date_utc"],
                             "duration_s": data.get("duration_s"),
                             "load_1min_at_start": data["machine"].get("load_1min_at_start")})
    out["duration_s"] = round(sum(p["duration_s"] or 0 for p in out["parts"]), 1)
    return write(out, out_path)


def note_written(path):
    """Says on stderr where the record went (stdout stays the bench's own output)."""
    if path != "none":
        print(f"record: {path}", file=sys.stderr)


def main(argv):
    """python3 bench/record.py merge OUT SRC:TABLE=NAME ...   (merge, for shell drivers)"""
    if len(argv) < 3 or argv[0] != "merge":
        print("usage: python3 bench/record.py merge OUT SRC:TABLE=NAME ...", file=sys.stderr)
        return 2
    parts = []
    for spec in argv[2:]:
        src_table, eq, new = spec.rpartition("=")
        src, colon, table_name = src_table.rpartition(":")
        if not eq or not colon or not src or not table_name or not new:
            print(f"record.py merge: {spec!r} is not SRC:TABLE=NAME", file=sys.stderr)
            return 2
        parts.append((src, table_name, new))
    try:
        if merge(argv[1], parts):
            note_written(argv[1])
    except (OSError, ValueError) as e:
        print(f"record.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
