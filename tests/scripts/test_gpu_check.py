#!/usr/bin/env python3
"""scripts/gpu-check.sh without a GPU: what can be checked of its logistics on a CPU machine.

- The global deadline: with every step stubbed by a command that never ends, the run is cut at
  the deadline, says so in its summary, returns a failure, leaves no process behind, and
  brings back at most 8 files.
- The plan, in a dry run with stubbed steps: the steps run in the order --help shows (the
  headline draft right after the program is built, the tests after), a step cut at its limit
  or failed cancels only the steps that need it, the GPU is asked again after a cut, and a run
  killed outright still leaves the summary of the steps done.
- --help shows the order, the deadline and what to carry, without doing any work.
- The probe stops a machine without a usable driver, before anything is built, with exit 3.
- The prerequisites step: a machine without usable headers is told what is missing (each
  header with its package) and what to carry, before anything is built, with exit 3.
- The tables: the memory floor, the draft's ratio to it and the token check, from recorded
  bench lines; the quantized-weight line (bf16, q8, q4 draft times and their ratios); the
  draft time by context and attention kernel; the per-kernel table from two traced runs.
- The script builds and runs the quantized matmul's GPU test and times --quant q8 and q4.
"""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(REPO, "scripts", "gpu-check.sh")
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
            env = dict(os.environ, GPU_CHECK_STUB="1", GPU_CHECK_STUB_HANG="all", GPU_CHECK_STUB_SECONDS=seconds,
                       GPU_CHECK_DEADLINE="9", OUT=out)
            t0 = time.monotonic()
            p = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
            took = time.monotonic() - t0
            self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
            # Cut at the deadline, not after the step's own limit (days); the kill takes <= 10 s,
            # more on a machine busy with other work.
            self.assertLess(took, 9 + 60, p.stderr)
            with open(os.path.join(out, "summary.txt")) as f:
                summary = f.read()
            self.assertIn("CUT after", summary)
            self.assertIn("skipped (the deadline is spent)", summary)
            self.assertEqual(summary, p.stdout, "the summary is printed as written")
            files = [os.path.join(d, n) for d, _, names in os.walk(out) for n in names]
            self.assertLessEqual(len(files), 8, files)
            listing = subprocess.run(["tar", "-tzf", os.path.join(out, "logs.tar.gz")], capture_output=True,
                                     text=True, check=True).stdout
            self.assertIn("probe.log", listing)
            self.assertEqual(processes_with(f"sleep {seconds}"), [], "the hanging step was left running")


def plan_from_help():
    """The step names in the order --help lists them."""
    p = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, timeout=60, check=True)
    return [m.group(1) for m in re.finditer(r"^  (\S+)\s+\d+ s  ", p.stdout, re.M)]


def dry_run(tmp, timeout=120, **stub):
    """A run with stubbed steps: (exit status, {step: state line}, step order, stderr)."""
    out = os.path.join(tmp, "out")
    env = dict(os.environ, GPU_CHECK_STUB="1", GPU_CHECK_STUB_LIMIT="2", OUT=out, **stub)
    p = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=timeout)
    with open(os.path.join(out, "summary.txt")) as f:
        lines = f.read().splitlines()[1:]
    states = {line[:24].strip(): line[24:].strip() for line in lines}
    return p.returncode, states, [line[:24].strip() for line in lines], p.stderr


class Plan(unittest.TestCase):
    def test_help_shows_the_order_the_deadline_and_what_to_carry_without_work(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            p = subprocess.run(["bash", SCRIPT, "--help"], env=dict(os.environ, OUT=out), capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            order = plan_from_help()
            self.assertEqual(order[:6], ["probe", "prerequisites", "configure", "build-cli", "checkpoint",
                                         "bench-graph"])
            self.assertLess(order.index("bench-graph"), order.index("build-tests"))
            self.assertLess(order.index("kernels"), order.index("gpu-tests"))
            self.assertEqual(order[-1], "torch")
            for part in ("Deadline", "GPU_CHECK_DEADLINE (default 330 s", "Carry with the tree: .gpu-deps/",
                         "scripts/gpu-deps.sh", "cancels only the steps that need it", "TPDRAFT_NCCL_TIMEOUT_S"):
                self.assertIn(part, p.stdout)
            self.assertFalse(os.path.exists(out), "--help did work")

    def test_steps_run_in_plan_order_and_a_cut_cancels_only_its_dependents(self):
        with tempfile.TemporaryDirectory() as tmp:
            seconds = str(800000 + os.getpid() % 10000)
            rc, states, order, err = dry_run(tmp, GPU_CHECK_STUB_HANG="bench-graph", GPU_CHECK_STUB_SECONDS=seconds,
                                             GPU_CHECK_STUB_FAIL="build-tests")
            self.assertNotEqual(rc, 0, "the headline was cut: the run fails")
            plan = plan_from_help()
            # The plan's order, with the GPU asked again right after the cut step.
            self.assertEqual(order, plan[:plan.index("bench-graph") + 1] + ["gpu-alive"] +
                             plan[plan.index("bench-graph") + 1:], err)
            self.assertTrue(states["bench-graph"].startswith("CUT after"), states)
            self.assertTrue(states["gpu-alive"].startswith("ok"), states)
            # No-cancel: what does not need the cut step (or the failed one) still runs.
            for name in ("kernels", "bench-op", "bench-sampled", "bench-context", "bench-q8", "bench-q4+head", "bench-tp2",
                         "bench-dflash2", "attention", "torch"):
                self.assertTrue(states[name].startswith("ok"), (name, states[name]))
            self.assertTrue(states["build-tests"].startswith("FAILED"), states)
            self.assertEqual(states["gpu-tests"], "skipped (needs build-tests: FAILED)")
            self.assertEqual(processes_with(f"sleep {seconds}"), [], "the cut step was left running")

    def test_a_gpu_that_stops_answering_after_a_cut_skips_the_gpu_steps_only(self):
        with tempfile.TemporaryDirectory() as tmp:
            _, states, _, _ = dry_run(tmp, GPU_CHECK_STUB_HANG="kernels", GPU_CHECK_STUB_FAIL="gpu-alive")
            self.assertTrue(states["kernels"].startswith("CUT"), states)
            self.assertEqual(states["bench-op"], "skipped (needs gpu: FAILED)")
            self.assertEqual(states["gpu-tests"], "skipped (needs gpu: FAILED)")
            self.assertTrue(states["build-tests"].startswith("ok"), "a build needs no GPU")
            self.assertTrue(states["bench-graph"].startswith("ok"), "before the cut")

    def test_a_failed_build_skips_everything_after_it_but_the_probe_says_why_first(self):
        with tempfile.TemporaryDirectory() as tmp:
            rc, states, _, _ = dry_run(tmp, GPU_CHECK_STUB_FAIL="build-cli")
            self.assertNotEqual(rc, 0)
            self.assertEqual(states["checkpoint"], "skipped (needs build-cli: FAILED)")
            self.assertEqual(states["bench-dflash2"], "skipped (needs build-cli: FAILED)")
            self.assertEqual(states["bench-graph"], "skipped (needs checkpoint: skipped)")
            self.assertTrue(states["build-tests"].startswith("ok"), "the tests' build needs only configure")
            rc, states, _, _ = dry_run(tmp, GPU_CHECK_STUB_FAIL="probe")
            self.assertEqual(states["configure"], "skipped (needs probe: FAILED)")

    def test_a_run_killed_outright_leaves_the_summary_of_the_steps_done(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            seconds = str(700000 + os.getpid() % 10000)
            env = dict(os.environ, GPU_CHECK_STUB="1", GPU_CHECK_STUB_HANG="bench-graph",
                       GPU_CHECK_STUB_SECONDS=seconds, OUT=out)
            p = subprocess.Popen(["bash", SCRIPT], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 60
                while not processes_with(f"sleep {seconds}") and time.monotonic() < deadline:
                    time.sleep(0.1)
                self.assertTrue(processes_with(f"sleep {seconds}"), "the hanging step never started")
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=30)
            finally:
                for pid in processes_with(f"sleep {seconds}"):  # a killed script cannot stop its step
                    os.kill(pid, signal.SIGKILL)
            with open(os.path.join(out, "summary.txt")) as f:
                summary = f.read()
            self.assertRegex(summary, r"checkpoint +ok")
            self.assertRegex(summary, r"build-cli +ok")


class Probe(unittest.TestCase):
    def test_no_driver_stops_before_the_build_with_the_reason(self):
        with tempfile.TemporaryDirectory() as tmp:
            # No libcuda.so.1 on the loader's path (an empty LD_LIBRARY_PATH does not hide a system
            # one, so the test accepts a driver that finds no device too).
            p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "lib", "gpu-probe.py"), "13.0"],
                               cwd=tmp, capture_output=True, text=True, timeout=60)
            if "verdict: ok" in p.stdout:
                self.skipTest("this machine has a usable GPU")
            self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
            self.assertIn("toolkit: CUDA 13.0", p.stdout)
            self.assertRegex(p.stdout.splitlines()[-1], r"^verdict: CANNOT RUN: (no NVIDIA driver|cuInit failed|"
                                                        r"no CUDA device|the driver supports)")


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
            for script in ("gpu-prereqs.sh", "cuda-root.sh"):
                shutil.copy(os.path.join(REPO, "scripts", "lib", script), os.path.join(tree, "scripts", "lib"))
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
            for name, line in (("bench-graph.out", on), ("bench-op.out", off), ("torch.out", torch)):
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
            for name, ms in (("bench-graph", 0.8), ("bench-q8", 0.6)):
                with open(os.path.join(logs, name + ".out"), "w") as f:
                    f.write("a log line\n" + bench_line(draft_ms=ms) + "\n")
            p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "lib", "gpu-table.py"), "--draft-ms",
                                logs, "bench-graph=bf16", "bench-q8=q8", "bench-q4"], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.strip(), "bf16 0.800 ms, q8 0.600 ms (0.75x), bench-q4 not run")

    def test_draft_ms_by_context_and_attention_kernel(self):
        with tempfile.TemporaryDirectory() as logs:
            with open(os.path.join(logs, "bench-graph.out"), "w") as f:
                f.write(json.dumps({"context": 4096, "draft_ms": 0.9}) + "\n")
            with open(os.path.join(logs, "bench-context.out"), "w") as f:
                f.write(json.dumps({"context": 32768, "draft_ms": 2.0}) + "\n" +
                        json.dumps({"context": 256, "draft_ms": 0.7}) + "\n")
            with open(os.path.join(logs, "attention.out"), "w") as f:
                for k, ms in (("simt", 1.0), ("mma", 0.8)):
                    f.write(json.dumps({"context": 4096, "draft_ms": ms, "attention_kernel": k}) + "\n")
            table = os.path.join(REPO, "scripts", "lib", "gpu-table.py")
            p = subprocess.run([sys.executable, table, "--by-context", logs, "bench-graph", "bench-context"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.stdout.strip(), "256: 0.700 ms, 4096: 0.900 ms, 32768: 2.000 ms")
            p = subprocess.run([sys.executable, table, "--by-context", logs, "attention"], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.stdout.strip().splitlines(), ["simt: 4096: 1.000 ms", "mma: 4096: 0.800 ms"])


class Attention(unittest.TestCase):
    FAKE_BENCH = ("import json, os, sys; print('a log line'); print(json.dumps({'argv': sys.argv[1:], "
                  "'env': os.environ.get('TPDRAFT_CUDA_ATTENTION', ''), 'context': 4096, 'draft_ms': 1.0}))")

    def run_switch(self, switch):
        p = subprocess.run(["bash", os.path.join(REPO, "scripts", "lib", "gpu-attention.sh"), switch, sys.executable,
                            "-c", self.FAKE_BENCH, "--ctx", "4096"], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return [json.loads(line) for line in p.stdout.splitlines()]

    def test_each_kernel_is_run_and_labelled(self):
        runs = self.run_switch("")
        self.assertEqual([(r["attention_kernel"], r["argv"]) for r in runs], [("current", ["--ctx", "4096"])])
        runs = self.run_switch("--attention")
        self.assertEqual([(r["attention_kernel"], r["argv"][-2:]) for r in runs],
                         [("simt", ["--attention", "simt"]), ("mma", ["--attention", "mma"])])
        runs = self.run_switch("TPDRAFT_CUDA_ATTENTION=")
        self.assertEqual([(r["attention_kernel"], r["env"]) for r in runs], [("simt", "simt"), ("mma", "mma")])


def totals_csv(path, rows, nsys=False):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if nsys:
            w.writerow(["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Name"])
            for name, calls, ns in rows:
                w.writerow([0, ns, calls, ns / calls, name])
        else:
            w.writerow(["kernel", "calls", "total_ns"])
            w.writerows(rows)


class KernelTable(unittest.TestCase):
    def test_time_per_draft_from_two_runs_against_the_class_floors(self):
        # 20 more drafts in the long run: per draft, the GEMM ran 7 times for 70 us, attention
        # twice for 40 us, a norm 4 times for 8 us; the settle-only kernel ran as often in both.
        gemm, attn, norm, settle = ("nvjet_tst_128x64_gemm", "void tpdraft::attention_split<128>(float*)",
                                    "rms_norm_kernel", "settle_only_kernel")
        short = [(gemm, 100, 1e6), (attn, 30, 2e5), (norm, 40, 1e4), (settle, 9, 5e5)]
        long = [(gemm, 100 + 140, 1e6 + 20 * 70e3), (attn, 30 + 40, 2e5 + 20 * 40e3), (norm, 40 + 80, 1e4 + 20 * 8e3),
                (settle, 9, 5e5)]
        for nsys in (False, True):
            with tempfile.TemporaryDirectory() as logs:
                totals_csv(os.path.join(logs, "short.csv"), short, nsys)
                totals_csv(os.path.join(logs, "long.csv"), long, nsys)
                bench = os.path.join(logs, "bench.json")
                with open(bench, "w") as f:  # 3.2 GB of weights and 0.168 GB of context at 4000 GB/s
                    f.write("a log line\n" + bench_line(draft_gbytes=3.368, draft_weight_gbytes=3.2,
                                                        machine_read_gbps=4000.0) + "\n")
                out = os.path.join(logs, "kernels.csv")
                p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "lib", "kernel-table.py"),
                                    os.path.join(logs, "short.csv"), os.path.join(logs, "long.csv"), "20", bench, out],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(out, newline="") as f:
                    rows = {r["kernel"]: r for r in csv.DictReader(f)}
                self.assertEqual(set(rows), {gemm, attn, norm}, "the settle-only kernel drops out")
                self.assertEqual((rows[gemm]["class"], float(rows[gemm]["calls_per_draft"]),
                                  float(rows[gemm]["us_per_draft"])), ("gemm", 7.0, 70.0))
                self.assertEqual((rows[attn]["class"], float(rows[attn]["calls_per_draft"]),
                                  float(rows[attn]["us_per_draft"])), ("attention", 2.0, 40.0))
                self.assertEqual(rows[norm]["class"], "other")
                self.assertAlmostEqual(float(rows[gemm]["share"]), 70 / 118, places=3)
                # Floors: 3.2 GB / 4000 GB/s = 800 us; 0.168 GB / 4000 GB/s = 42 us.
                self.assertAlmostEqual(float(rows[gemm]["class_floor_us"]), 800.0, places=2)
                self.assertAlmostEqual(float(rows[attn]["class_floor_us"]), 42.0, places=2)
                self.assertEqual(rows[norm]["class_floor_us"], "")
                lines = p.stdout.splitlines()
                self.assertIn(gemm, lines[0], "most expensive first")
                self.assertIn("class gemm", p.stdout)
                self.assertIn("0.09x its floor 800.0 us", p.stdout)

    def test_the_kernels_step_traces_two_runs_and_tabulates_their_difference(self):
        # The step's wiring without a GPU: the CUPTI trace library is built (it needs the CUDA
        # toolkit's headers and libcupti), and a stand-in bench writes the trace the library would.
        nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
        if nvcc is None or shutil.which("nsys"):
            self.skipTest("needs the CUDA toolkit (and no nsys, whose path this does not take)")
        fake_bench = (
            "import json, os, sys\n"
            "n = int(sys.argv[sys.argv.index('--repeat') + 1])\n"
            "with open(os.environ['TPDRAFT_KERNEL_TRACE'], 'w') as f:\n"
            "    f.write('kernel,calls,total_ns\\n')\n"
            "    f.write(f'\"void attention_split<128>(float*)\",{3 + 2 * n},{1000 + 40000 * n}\\n')\n"
            "    f.write('settle_gemm,5,900000\\n')\n"
            "print(json.dumps({'draft_gbytes': 3.368, 'draft_weight_gbytes': 3.2, 'machine_read_gbps': 4000.0}))\n")
        with tempfile.TemporaryDirectory() as logs:
            env = dict(os.environ, PATH=os.path.dirname(nvcc) + os.pathsep + os.environ["PATH"])
            p = subprocess.run(["bash", os.path.join(REPO, "scripts", "lib", "gpu-kernels.sh"), logs, "5", "25",
                                sys.executable, "-c", fake_bench], cwd=REPO, env=env, capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(logs, "kernels.csv"), newline="") as f:
                rows = list(csv.DictReader(f))
            self.assertEqual([(r["kernel"], float(r["calls_per_draft"]), float(r["us_per_draft"])) for r in rows],
                             [("void attention_split<128>(float*)", 2.0, 40.0)])
            with open(os.path.join(logs, "kernels.top")) as f:
                top = f.read()
            self.assertIn("CUPTI kernel trace; the difference of 20 timed drafts", top)
            self.assertIn("class attention", top)
            self.assertFalse(os.path.exists(os.path.join(logs, "libkernel-trace.so")), "the library is not kept")


class Script(unittest.TestCase):
    def test_quantized_matmul_is_built_and_timed(self):
        with open(os.path.join(REPO, "scripts", "gpu-check.sh")) as f:
            script = f.read()
        start = script.index("run_step build-tests")
        build = script[start:script.index("|| true", start)]
        self.assertIn("test_cuda_qmatmul", build)
        for quant in ("q8", "q4", "q4+head", "q8a8", "q4a8+head"):
            self.assertIn("bench-$quant", script)
            self.assertIn(quant, script[script.index("for quant in"):])
        self.assertIn('--quant "$quant"', script)
        self.assertIn("--draft-ms", script)


if __name__ == "__main__":
    unittest.main(verbosity=2)
