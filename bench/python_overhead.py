#!/usr/bin/env python3
"""What a step through the Python module costs beyond the C library's own tpdraft_step: the
wall time of Drafter.step minus the time the module measured inside tpdraft_step, per step, in
one run (median and p10-p90). Usage: python_overhead.py [--config configs/X.json] [--steps N]
(the module from build/python, the checkpoint made by build/tpdraft init in a temp dir)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "build", "python"))
import numpy as np  # noqa: E402
import tpdraft  # noqa: E402


def quantile(xs, q):
    xs = sorted(xs)
    return xs[int(round(q * (len(xs) - 1)))]


def measure(config, steps, context, new_rows):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([os.path.join(REPO, "build", "tpdraft"), "init", "--config", os.path.join(REPO, config),
                        "--out", tmp + "/ck"], check=True, capture_output=True)
        with tpdraft.Drafter(tmp + "/ck/drafter", tmp + "/ck/target", backend="cpu", threads=1,
                             max_context=context + 64) as d:
            width = d.caps.taps_width
            rng = np.random.default_rng(0)
            prefix = rng.standard_normal((context, width), dtype=np.float32)
            rows = rng.standard_normal((new_rows, width), dtype=np.float32)
            s = d.open_session()
            d.step([{"session": s, "taps": prefix, "anchor": 1}])
            extra = []
            for i in range(steps):
                # A step as a loop makes it: roll back what was rejected, settle the new rows.
                entry = {"session": s, "keep": context, "taps": rows, "anchor": 2 + i % 7}
                t0 = time.perf_counter()
                d.step([entry])
                extra.append(time.perf_counter() - t0 - d.last_step_seconds)
            return {"config": config, "steps": steps, "context": context, "new_rows": new_rows,
                    "step_us": d.last_step_seconds * 1e6, "python_us_median": statistics.median(extra) * 1e6,
                    "python_us_p10": quantile(extra, 0.1) * 1e6, "python_us_p90": quantile(extra, 0.9) * 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--new-rows", type=int, default=2)
    a = ap.parse_args()
    rows = [measure(c, a.steps if "bench" not in c else max(20, a.steps // 100), a.context, a.new_rows)
            for c in (a.config or ["configs/tiny-dflash2.json", "configs/bench-dflash2-2048.json"])]
    print(f"{'config':34} {'step (C) us':>12} {'Python adds us (median)':>24} {'p10..p90':>16}")
    for r in rows:
        print(f"{r['config']:34} {r['step_us']:12.1f} {r['python_us_median']:24.2f} "
              f"{r['python_us_p10']:7.2f}..{r['python_us_p90']:.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
