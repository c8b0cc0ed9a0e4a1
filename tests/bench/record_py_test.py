#!/usr/bin/env python3
"""bench/record.py: what a Python bench's record holds, where it goes, and the sorl build it
reads from a binary's --version."""

import io
import json
import os
import stat
import sys
import tempfile
import unittest
from contextlib import redirect_stderr
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import record  # noqa: E402


def fake_binary(folder, line, rc=0):
    path = os.path.join(folder, "sorl")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho '{line}'\nexit {rc}\n")
    os.chmod(path, stat.S_IRWXU)
    return path


class RecordTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        patcher = mock.patch.dict(os.environ, {}, clear=False)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.environ.pop("SORL_BENCH_COMMAND", None)
        os.environ.pop("SORL_BENCH_RECORD", None)
        os.environ.pop("SORL_BENCH_START", None)

    def test_the_version_line_of_the_measured_binary(self):
        b = fake_binary(self.tmp.name, "sorl 0.1.0 (commit 0123456789ab, dirty)")
        self.assertEqual(record.sorl_build(b), {"version": "0.1.0", "commit": "0123456789ab",
                                                "dirty": True, "source": f"{b} --version"})
        b = fake_binary(self.tmp.name, "sorl 0.2.0 (commit unknown)")
        self.assertEqual(record.sorl_build(b)["commit"], "unknown")
        self.assertFalse(record.sorl_build(b)["dirty"])

    def test_a_binary_that_prints_something_else_is_named(self):
        b = fake_binary(self.tmp.name, "hello")
        with self.assertRaisesRegex(RuntimeError, f"{b} --version printed 'hello' \\(exit 0\\)"):
            record.sorl_build(b)

    def test_the_kernels_line_of_a_sorl_log(self):
        log = ("[22:39:58.822] [info] CPU kernels: BLAS /usr/lib/x/openblas-pthread/libblas.so.3 "
               "(OpenBLAS core Haswell), ATen avx2, oneDNN AVX2\n[info] step 1\n")
        rt = record.sorl_runtime(None, log)
        self.assertEqual(rt["blas"], "/usr/lib/x/openblas-pthread/libblas.so.3")
        self.assertEqual(rt["cpu_kernels"], "BLAS /usr/lib/x/openblas-pthread/libblas.so.3 "
                                            "(OpenBLAS core Haswell), ATen avx2, oneDNN AVX2")
        self.assertIsNone(rt["libtorch"])
        self.assertIsNone(record.sorl_runtime(None, "CPU kernels: BLAS none loaded, ATen x")["blas"])

    def test_a_record_round_trips_with_its_command_and_machine(self):
        b = fake_binary(self.tmp.name, "sorl 0.1.0 (commit 0123456789ab)")
        rec = record.Record("example", argv=["bench/x.py", "--steps", "2 words"], threads=2,
                            sorl=record.sorl_build(b))
        rec.set_parameter("steps", 2)
        t = rec.add_table("speed", "s per step", [record.column("who", "run"),
                                                  record.column("s", "s/step", "s", digits=1),
                                                  record.column("peer", "TRL", "s", 1, baseline=True)])
        t["rows"].append(["sorl", 9.44, float("nan")])
        path = os.path.join(self.tmp.name, "sub", "r.json")
        self.assertTrue(rec.write(path))
        data = record.load(path)
        cwd_rel = os.path.relpath(os.path.abspath("bench/x.py"))
        self.assertEqual(data["command"], f"python3 {cwd_rel} --steps '2 words'")
        self.assertEqual(data["argv"], ["bench/x.py", "--steps", "2 words"])
        self.assertEqual(data["sorl"]["commit"], "0123456789ab")
        self.assertEqual(data["machine"]["threads_used"], 2)
        self.assertEqual(data["machine"]["cores_available"], len(os.sched_getaffinity(0)))
        self.assertEqual(data["parameters"], {"steps": 2})
        self.assertEqual(data["tables"][0]["rows"], [["sorl", 9.44, None]])
        self.assertEqual(data["tables"][0]["columns"][2],
                         {"key": "peer", "label": "TRL", "unit": "s", "digits": 1, "baseline": True})
        self.assertRegex(data["date_utc"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertFalse(rec.write("none"))

    def test_a_tool_without_a_build_is_recorded_with_the_checkout_saying_so(self):
        build = record.sorl_build_of_tool("build/bench/interop/sorl_tokenize")
        self.assertEqual(build["source"], "git checkout at record time "
                                          "(build/bench/interop/sorl_tokenize reports no build of its own)")
        self.assertRegex(build["commit"], r"^([0-9a-f]{40}|unknown)$")

    def test_library_scalars_are_written_as_plain_numbers(self):
        class Scalar:  # what numpy's float32 and torch's 0-d values offer
            def item(self):
                return 0.25
        rec = record.Record("x", argv=["x"], sorl={"commit": "unknown"})
        rec.set_parameter("tol", Scalar())
        rec.add_table("t", "", [record.column("v", "v")], [[Scalar()]])
        path = os.path.join(self.tmp.name, "scalars.json")
        rec.write(path)
        data = record.load(path)
        self.assertEqual((data["parameters"]["tol"], data["tables"][0]["rows"]), (0.25, [[0.25]]))

    def test_gpus_are_the_driver_s_models(self):
        folder = os.path.join(self.tmp.name, "gpus")
        for bus, model in (("0000:01:00.0", "NVIDIA H200"), ("0000:02:00.0", "NVIDIA H100 80GB HBM3")):
            os.makedirs(os.path.join(folder, bus))
            with open(os.path.join(folder, bus, "information"), "w") as f:
                f.write(f"Model: \t\t {model}\nIRQ:   \t\t 34\n")
        self.assertEqual(record.gpu_models(folder), "NVIDIA H100 80GB HBM3, NVIDIA H200")
        self.assertEqual(record.gpu_models(os.path.join(self.tmp.name, "none")), "none")

    def test_a_run_s_threads_come_from_its_resolved_config(self):
        run = os.path.join(self.tmp.name, "run")
        os.makedirs(run)
        with open(os.path.join(run, "config.resolved.toml"), "w") as f:
            f.write('# The configuration this run used\n\n[run]\nname = "x"\nthreads = 3\n\n'
                    '[rollout]\nthreads = 9\n')
        self.assertEqual(record.run_threads(run), 3)
        with open(os.path.join(run, "config.resolved.toml"), "w") as f:
            f.write('[run]\nname = "x"\n\n[rollout]\nthreads = 9\n')
        self.assertIsNone(record.run_threads(run))
        self.assertIsNone(record.run_threads(os.path.join(self.tmp.name, "missing")))

    def test_a_driver_command_wins(self):
        os.environ["SORL_BENCH_COMMAND"] = "bench/default_job/control.sh --steps 3"
        rec = record.Record("x", argv=["python3", "-"], sorl={"commit": "unknown"})
        self.assertEqual(rec.data["command"], "bench/default_job/control.sh --steps 3")

    def test_a_driver_start_gives_the_date_and_load(self):
        os.environ["SORL_BENCH_START"] = "2026-12-07T10:11:12Z 0.42"
        rec = record.Record("x", argv=["x"], sorl={"commit": "unknown"})
        self.assertEqual(rec.data["date_utc"], "2026-12-07T10:11:12Z")
        self.assertEqual(rec.data["machine"]["load_1min_at_start"], 0.42)
        os.environ["SORL_BENCH_START"] = "yesterday"
        rec = record.Record("x", argv=["x"], sorl={"commit": "unknown"})
        self.assertNotEqual(rec.data["date_utc"], "2026-12-07T10:11:12Z")

    def test_where_the_record_goes(self):
        os.environ["SORL_BENCH_RECORD"] = "/tmp/env.json"
        self.assertEqual(record.record_path("x", "/tmp/flag.json"), "/tmp/flag.json")
        self.assertEqual(record.record_path("x"), "/tmp/env.json")
        del os.environ["SORL_BENCH_RECORD"]
        self.assertRegex(record.record_path("x"), r"^runs/bench/x-\d{8}T\d{6}Z\.json$")

    def test_bad_rows_and_keys_are_refused(self):
        rec = record.Record("x", argv=["x"], sorl={"commit": "unknown"})
        t = rec.add_table("t", "", [record.column("a", "a"), record.column("b", "b")])
        t["rows"].append([1])
        with self.assertRaisesRegex(ValueError, "table 't' row 0: 1 cells for 2 columns"):
            rec.write(os.path.join(self.tmp.name, "bad.json"))
        with self.assertRaisesRegex(ValueError, "a second table named 't'"):
            rec.add_table("t", "", [])
        with self.assertRaisesRegex(ValueError, "column key 'a b'"):
            record.column("a b", "x")

    def test_other_files_are_not_records(self):
        path = os.path.join(self.tmp.name, "other.json")
        with open(path, "w") as f:
            json.dump({"steps": []}, f)
        with self.assertRaisesRegex(ValueError, f"{path}: not a sorl bench record"):
            record.load(path)

    def test_merge_renames_each_part_and_keeps_every_run(self):
        paths = []
        for i, name in enumerate(("u", "s")):
            rec = record.Record("route", argv=["route_bench", str(i)], threads=2,
                                sorl={"commit": "0123456789ab", "dirty": False})
            t = rec.add_table("placement", "per policy", [record.column("policy", "policy")])
            t["rows"].append([f"row {name}"])
            paths.append(os.path.join(self.tmp.name, f"{name}.json"))
            rec.write(paths[-1])
        out = os.path.join(self.tmp.name, "merged.json")
        self.assertTrue(record.merge(out, [(paths[0], "placement", "uniform"),
                                           (paths[1], "placement", "skewed")]))
        data = record.load(out)
        self.assertEqual([(t["name"], t["rows"]) for t in data["tables"]],
                         [("uniform", [["row u"]]), ("skewed", [["row s"]])])
        self.assertEqual([p["argv"] for p in data["parts"]], [["route_bench", "0"], ["route_bench", "1"]])
        with self.assertRaisesRegex(ValueError, "has no table 'nosuch'"):
            record.merge(out, [(paths[0], "nosuch", "x")])
        other = record.Record("route", argv=["x"], sorl={"commit": "fedcba987654", "dirty": False})
        other.add_table("placement", "", [])
        other.write(paths[1])
        with self.assertRaisesRegex(ValueError, "measured with sorl fedcba987654"):
            record.merge(out, [(paths[0], "placement", "a"), (paths[1], "placement", "b")])

    def test_note_written_goes_to_stderr(self):
        err = io.StringIO()
        with redirect_stderr(err):
            record.note_written("runs/bench/x.json")
            record.note_written("none")
        self.assertEqual(err.getvalue(), "record: runs/bench/x.json\n")


if __name__ == "__main__":
    unittest.main()
