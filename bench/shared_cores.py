#!/usr/bin/env python3
"""The CPU thread pool on cores it shares. A drafter runs beside a target engine, so its cores are
often busy with other work: this times `tpdraft bench` with the default thread count (--threads 0:
one thread per core) against one thread, on an idle machine and under a background load of busy
processes (one per core by default), taking turns for several rounds. Prints, per phase, the median
draft time of each (the median of the per-round medians, with their range) and default / one
thread: the pool should not lose more than 1.5x to one thread under load, and whether the machine
was idle during each phase besides the phase's own busy processes (bench/timing.py).
Usage: bench/shared_cores.py [--config configs/X.json] [--busy N] [--rounds N] [--repeat N]
                             [--ctx N] [--bin build/tpdraft]"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
import timing  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench(binary, config, threads, ctx, repeat):
    """Median draft milliseconds of one `tpdraft bench` run."""
    out = subprocess.run([binary, "bench", "--config", config, "--ctx", str(ctx), "--repeat", str(repeat),
                          "--threads", str(threads), "--backend", "cpu", "--json"],
                         check=True, capture_output=True, text=True, env=dict(os.environ, TPDRAFT_LOG_LEVEL="warn"))
    return json.loads(out.stdout)["draft_ms"]


def phase(a, busy):
    """Per-round medians for threads 1 and 0 with `busy` spinning processes alongside."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        one, default = [], []
        for _ in range(a.rounds):
            one.append(bench(a.bin, a.config, 1, a.ctx, a.repeat))
            default.append(bench(a.bin, a.config, 0, a.ctx, a.repeat))
        return one, default
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(REPO, "configs", "tiny-dflash2.json"))
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes in the loaded phase")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=200, help="timed drafts per bench run")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "tpdraft"))
    a = ap.parse_args()
    print(f"{os.path.basename(a.config)}, ctx {a.ctx}, {os.cpu_count()} cores")
    print(f"{'phase':>16} {'1 thread ms':>18} {'default ms':>18} {'default / 1':>12}")
    worst = 0.0
    for busy in (0, a.busy):
        (one, default), load = timing.with_load(lambda: phase(a, busy))
        ratio = statistics.median(default) / statistics.median(one)
        if busy:
            worst = max(worst, ratio)
        name = "idle" if busy == 0 else f"{busy} busy processes"
        fmt = lambda v: f"{statistics.median(v):.3f} ({min(v):.3f}..{max(v):.3f})"
        print(f"{name:>16} {fmt(one):>18} {fmt(default):>18} {ratio:11.2f}x   machine {timing.describe(load)}")
    print(f"under load the default is {worst:.2f}x one thread ({'within' if worst <= 1.5 else 'beyond'} 1.5x)")


if __name__ == "__main__":
    main()
