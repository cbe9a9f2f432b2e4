#!/usr/bin/env python3
"""scripts/gpu-check.sh without a GPU: what can be checked of its logistics on a CPU machine.

- The global deadline: with every step stubbed by a command that never ends, the run is cut at
  the deadline, says so in its summary, returns a failure, leaves no process behind, and
  brings back at most 8 files.
- The prerequisites step: a machine without usable headers is told what is missing (each
  header with its package) and what to carry, before anything is built, with exit 3.
- The table: the memory floor, the draft's ratio to it and the token check, from recorded
  bench lines; the quantized-weight line (bf16, q8, q4 draft times and their ratios).
- The script builds and runs the quantized matmul's GPU test and times --quant q8 and q4.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True


def processes_with(marker):
    """Ids of the running processes whose command line holds marker."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read().replace(b"\0", b" "):
                    found.append(int(pid))
        except OSError:
            pass
    return found


class Deadline(unittest.TestCase):
    def test_a_hanging_step_is_cut_at_the_deadline_and_reported(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            seconds = str(900000 + os.getpid() % 10000)  # the stub's sleep, unique to this test
            # The script skips a step that would start with 5 s or less left, counting whole
            # seconds: 9 s leaves the first step room on a loaded machine (6 did not, at times).
            env = dict(os.environ, GPU_CHECK_STUB="hang", GPU_CHECK_STUB_SECONDS=seconds,
                       GPU_CHECK_DEADLINE="9", OUT=out)
            t0 = time.monotonic()
            p = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu-check.sh")], env=env,
                               capture_output=True, text=True, timeout=60)
            took = time.monotonic() - t0
            self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
            # Cut at the deadline, not after the step's own limit (days); the kill takes <= 10 s,
            # more on a machine busy with other work.
            self.assertLess(took, 9 + 60, p.stderr)
            with open(os.path.join(out, "summary.txt")) as f:
                summary = f.read()
            self.assertIn("CUT after", summary)
            self.assertIn("skipped (build was cut)", summary)
            self.assertEqual(summary, p.stdout, "the summary is printed as written")
            files = [os.path.join(d, n) for d, _, names in os.walk(out) for n in names]
            self.assertLessEqual(len(files), 8, files)
            listing = subprocess.run(["tar", "-tzf", os.path.join(out, "logs.tar.gz")], capture_output=True,
                                     text=True, check=True).stdout
            self.assertIn("build.log", listing)
            self.assertEqual(processes_with(f"sleep {seconds}"), [], "the hanging step was left running")


class Prerequisites(unittest.TestCase):
    def test_missing_headers_are_named_with_their_packages_before_any_build(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A compiler that finds no header at all, in a copy of the tree without .gpu-deps/.
            fake = os.path.join(tmp, "c++")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\nexit 1\n")
            os.chmod(fake, 0o755)
            tree = os.path.join(tmp, "tree")
            os.makedirs(os.path.join(tree, "scripts", "lib"))
            shutil.copy(os.path.join(REPO, "scripts", "lib", "gpu-prereqs.sh"), os.path.join(tree, "scripts", "lib"))
            env_file = os.path.join(tmp, "prereqs.env")
            p = subprocess.run(["bash", "scripts/lib/gpu-prereqs.sh", env_file], cwd=tree, capture_output=True,
                               text=True, timeout=60, env=dict(os.environ, CXX=fake))
            self.assertEqual(p.returncode, 3, p.stderr)
            for header, package in [("fmt/format.h", "libfmt-dev"), ("spdlog/spdlog.h", "libspdlog-dev"),
                                    ("nlohmann/json.hpp", "nlohmann-json3-dev"), ("CLI/CLI.hpp", "libcli11-dev"),
                                    ("gtest/gtest.h", "libgtest-dev")]:
                self.assertIn(f"{header} [{package}]", p.stderr)
            self.assertIn("carry .gpu-deps/", p.stderr)
            self.assertIn("scripts/gpu-deps.sh", p.stderr)
            self.assertFalse(os.path.exists(env_file), "no flags written when a build cannot start")
            self.assertFalse(os.path.exists(os.path.join(tree, "build-gpu")))


def bench_line(**over):
    d = {"draft_ms": 0.060, "draft_ms_p10": 0.058, "draft_ms_p90": 0.064, "replayed_drafts": 30, "graph_nodes": 151,
         "layers_ms": 0.040, "head_ms": 0.015, "select_ms": 0.005, "draft_gbytes": 0.100, "machine_read_gbps": 4000.0,
         "achieved_gbps": 1666.7, "achieved_gflops": 900.0, "settle_rows_per_s": 1e6, "settle_gflops": 300.0,
         "tokens": [5, 6, 7]}
    d.update(over)
    return json.dumps(d)


class Table(unittest.TestCase):
    def table(self, on, off=None, torch=None):
        with tempfile.TemporaryDirectory() as logs:
            for name, line in (("bench-on.json", on), ("bench-off.json", off), ("torch.json", torch)):
                if line is not None:
                    with open(os.path.join(logs, name), "w") as f:
                        f.write("a log line\n" + line + "\n")
            p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "lib", "gpu-table.py"), logs],
                               capture_output=True, text=True, timeout=60)
            rows = {line[:24].strip(): line[24:].strip() for line in p.stdout.splitlines()}
            return p.returncode, rows

    def test_floor_ratio_and_torch(self):
        torch = json.dumps({"draft_ms_median": 0.150, "draft_ms_min": 0.140, "torch": "2.5"})
        rc, rows = self.table(bench_line(), bench_line(draft_ms=0.2), torch)
        self.assertEqual(rc, 0)
        # 0.1 GB at 4000 GB/s is 0.025 ms; 0.060 ms is 2.40 times that.
        self.assertTrue(rows["memory floor"].startswith("0.025 ms"), rows)
        self.assertTrue(rows["draft / floor"].startswith("2.40x"), rows)
        self.assertIn("151 graph nodes", rows["draft, graph replay"])
        self.assertTrue(rows["torch / tpdraft"].startswith("2.50x"), rows)
        self.assertEqual(rows["graph = op by op"], "yes")

    def test_different_tokens_fail(self):
        rc, rows = self.table(bench_line(), bench_line(tokens=[5, 6, 8]))
        self.assertEqual(rc, 1)
        self.assertTrue(rows["graph = op by op"].startswith("NO"), rows)

    def test_no_graph_run_fails(self):
        rc, _ = self.table(None, bench_line())
        self.assertEqual(rc, 1)

    def test_draft_ms_of_the_quantized_runs(self):
        with tempfile.TemporaryDirectory() as logs:
            for name, ms in (("bench-on", 0.8), ("bench-q8", 0.6)):
                with open(os.path.join(logs, name + ".json"), "w") as f:
                    f.write("a log line\n" + bench_line(draft_ms=ms) + "\n")
            p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "lib", "gpu-table.py"), "--draft-ms",
                                logs, "bench-on=bf16", "bench-q8=q8", "bench-q4"], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.strip(), "bf16 0.800 ms, q8 0.600 ms (0.75x), bench-q4 not run")


class Script(unittest.TestCase):
    def test_quantized_matmul_is_built_and_timed(self):
        with open(os.path.join(REPO, "scripts", "gpu-check.sh")) as f:
            script = f.read()
        build = script[script.index("run_step build 240"):script.index("|| exit 1", script.index("run_step build 240"))]
        self.assertIn("test_cuda_qmatmul", build)
        for quant in ("q8", "q4", "q4+head"):
            self.assertIn("bench-$quant", script)
            self.assertIn(quant, script[script.index("for quant in"):])
        self.assertIn("--quant $quant", script)
        self.assertIn("--draft-ms", script)


if __name__ == "__main__":
    unittest.main(verbosity=2)
