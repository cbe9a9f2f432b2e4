#!/usr/bin/env python3
"""`tpdraft serve` as two MPI ranks against the same group in one process. The same client loop
(tpdraft.Client, one session, steps as a decoding loop makes them: keep the prompt, settle 2 new
tap rows, draft) runs against `tpdraft serve --tp 2 --threads 1` (two rank threads) and against
`mpirun -np 2 tpdraft serve --threads 1` (two processes, one group of 2), in turns for --rounds
rounds so that a machine whose load drifts affects both alike; once per phase: idle, then with
busy processes alongside (--busy; each in a session of its own, as another program's work on
the machine would be; one per core leaves the ranks no core to themselves). Prints, per phase
and server, the median and p90 of the client's step in milliseconds and the server's settle +
draft (what its rank 0 spent in the engine, collectives included), then the ratio mpirun /
in-process of the medians, and whether the machine was idle during each phase (bench/timing.py:
CPU time taken by work other than the servers and the phase's own busy processes skews it).
Usage: bench/serve_mpi.py [--bin build/tpdraft] [--steps N] [--rounds N] [--busy 0,1,2]
                          [--config configs/X.json] [--mpirun mpirun] [--mpirun-args '...']
(the Python module is the one built next to the binary: BIN's directory/python)."""

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
import timing  # noqa: E402
from served import Server, checkpoint  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTEXT, NEW_ROWS = 64, 2


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "tpdraft"), help="the tpdraft program; the Python "
                    "module is taken from the python folder beside it")
    ap.add_argument("--steps", type=int, default=1000, help="timed steps per server per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds; each starts both servers afresh")
    ap.add_argument("--warmup", type=int, default=50, help="untimed steps after each server starts")
    ap.add_argument("--busy", default="0,1,2", help="busy processes alongside, one phase per number")
    ap.add_argument("--config", default="configs/tiny-dflash2.json", help="geometry (relative to the repository)")
    ap.add_argument("--mpirun", default="mpirun", help="the MPI launcher (Open MPI's)")
    ap.add_argument("--mpirun-args", default="", help="more launcher options, one string (e.g. '--bind-to none' "
                    "or '--mca mpi_yield_when_idle 0')")
    return ap.parse_args()


A = parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(A.bin)), "python"))
import tpdraft  # noqa: E402


def measure(launcher, extra, ck, tmp, name, seed):
    server = Server(A.bin, ck, f"ipc://{tmp}/{name}.sock", os.path.join(tmp, name),
                    ["--max-sessions", "1", "--max-context", str(CONTEXT + 64), *extra], launcher)
    try:
        with tpdraft.Client(server.address, timeout=120) as client:
            return timing.step_times(client, A.steps, warmup=A.warmup, seed=seed, context=CONTEXT,
                                     new_rows=NEW_ROWS)
    finally:
        server.stop()


def main():
    if not os.path.exists(A.bin):
        sys.exit(f"{A.bin}: no such program (build it, or name one with --bin)")
    if shutil.which(A.mpirun) is None:
        sys.exit(f"{A.mpirun}: not found (name the launcher with --mpirun)")
    launcher = [A.mpirun, "-np", "2", "--oversubscribe"]
    if os.geteuid() == 0:
        launcher.append("--allow-run-as-root")
    launcher += shlex.split(A.mpirun_args)
    print(f"{os.path.basename(A.config)}, {A.steps} steps x {A.rounds} rounds, {os.cpu_count()} cores")
    phases = [int(b) for b in A.busy.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "ck")
        checkpoint(A.bin, os.path.join(REPO, A.config), ck)
        results = [(busy, *timing.with_load(lambda: phase(launcher, ck, tmp, busy))) for busy in phases]
    print(f"{'phase':>8} {'server':>11} {'median ms':>10} {'p90 ms':>8} {'server median ms':>17} "
          f"{'server p90 ms':>14} {'mpirun / in-process':>20}")
    worst = 0.0
    for busy, runs, _ in results:
        medians = {}
        for name, samples in runs.items():
            wall = [w * 1e3 for w, _ in samples]
            engine = [d * 1e3 for _, d in samples]
            medians[name] = statistics.median(wall)
            ratio = f"{medians['mpirun'] / medians['in-process']:19.2f}x" if name == "mpirun" else ""
            print(f"{'idle' if busy == 0 else f'{busy} busy':>8} {name:>11} {medians[name]:10.3f} "
                  f"{timing.quantile(wall, 0.9):8.3f} {statistics.median(engine):17.3f} "
                  f"{timing.quantile(engine, 0.9):14.3f} {ratio:>20}")
        worst = max(worst, medians["mpirun"] / medians["in-process"])
    print(f"mpirun / in-process, the worst phase: {worst:.2f}x ({'within' if worst <= 2 else 'beyond'} 2x)")
    for busy, _, load in results:
        print(f"machine during the {'idle' if busy == 0 else f'{busy} busy'} phase: {timing.describe(load)}")


def phase(launcher, ck, tmp, busy):
    """Both servers' samples, rounds in turn, with `busy` spinning processes alongside."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                for _ in range(busy)]
    try:
        runs = {"in-process": [], "mpirun": []}
        for r in range(A.rounds):
            runs["in-process"] += measure([], ["--tp", "2"], ck, tmp, f"threads{busy}-{r}", r)
            runs["mpirun"] += measure(launcher, [], ck, tmp, f"mpi{busy}-{r}", r)
        return runs
    finally:
        for p in spinners:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
