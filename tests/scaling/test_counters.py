#!/usr/bin/env python3
"""Real CPU MPI runs of `tpdraft bench` on a small geometry: every run's collective counters, work
and bytes per rank (read through records.py) must equal `tpdraft info --json` for that point
(read through geometry.py). Exact checks only; the latency check is
bench/scaling/check_projection.py. Usage: test_counters.py TPDRAFT_BIN"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.join(REPO, "bench", "scaling"))
import geometry  # noqa: E402
import records  # noqa: E402

CONFIG = os.path.join(REPO, "bench", "scaling", "small-dflash2-512.json")
CTX = 64
BINARY = None  # set by main


def bench(tp, sessions, workdir):
    args = [BINARY, "bench", "--config", CONFIG, "--ctx", str(CTX), "--batch", str(sessions), "--threads", "1",
            "--repeat", "2", "--warmup", "1", "--json"]
    if tp > 1:
        mpi = ["mpirun", "-np", str(tp), "--oversubscribe", "-x", "TPDRAFT_LOG_LEVEL=warn"]
        args = mpi + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + args + ["--tp", str(tp)]
    res = subprocess.run(args, capture_output=True, text=True, cwd=workdir, timeout=300)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {res.returncode}:\n{res.stderr[-3000:]}")
    return records.run_from_json(json.loads(res.stdout.strip().splitlines()[-1]))


class CountersEqualTheModel(unittest.TestCase):
    def test_every_point(self):
        info = geometry.Info(BINARY)
        with tempfile.TemporaryDirectory(prefix="tpdraft-counters-") as work:
            for tp in (1, 2):
                for sessions in (1, 3):
                    with self.subTest(tp=tp, sessions=sessions):
                        self.check(bench(tp, sessions, work), info.query(CONFIG, tp, sessions, CTX, "bf16"))

    def check(self, run, answer):
        self.assertEqual(run.communicator, "mpi" if run.tp > 1 else "single")
        for op, (calls, nbytes) in run.collectives.items():
            model = geometry.rank(answer)["collectives"]["greedy"][op]
            self.assertEqual((calls, nbytes), (model["calls"], model["bytes"]), op)
        work = geometry.work(answer)
        self.assertAlmostEqual(run.draft_gflop, work.flops / 1e9, delta=1e-9 * run.draft_gflop)
        self.assertAlmostEqual(run.draft_gbytes, geometry.total_bytes(work) / 1e9, delta=1e-9 * run.draft_gbytes)
        held = geometry.rank(answer)["bytes"]
        self.assertEqual(run.weights_bytes, held["total"])
        self.assertEqual(run.context_bytes, run.sessions * CTX * held["context_per_position"])


def main():
    global BINARY
    if len(sys.argv) < 2:
        print("usage: test_counters.py TPDRAFT_BIN", file=sys.stderr)
        return 2
    BINARY = os.path.abspath(sys.argv.pop(1))
    if shutil.which("mpirun") is None:
        print("test_counters: mpirun not found: install openmpi-bin (scripts/setup.sh does)", file=sys.stderr)
        return 1
    return 0 if unittest.main(exit=False).result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
