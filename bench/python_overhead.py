#!/usr/bin/env python3
"""What a step through the Python module costs beyond the C library's own tpdraft_step: the
wall time of Drafter.step minus the time the module measured inside tpdraft_step, per step, in
one run (median and p10-p90). Usage: python_overhead.py [--config configs/X.json] [--steps N]
(the module from build/python, the checkpoint made by build/tpdraft init in a temp dir)."""

import argparse
import json
import statistics
import tempfile

import numpy as np
from serve_overhead import make_checkpoint, timed_steps
import tpdraft  # from build/python, which serve_overhead puts on the path


def measure(config, steps, context, new_rows):
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(config, tmp + "/ck")
        with tpdraft.Drafter(tmp + "/ck/drafter", tmp + "/ck/target", backend="cpu", threads=1,
                             max_context=context + 64) as d:
            extra = [wall - d.last_step_seconds for wall in timed_steps(d, steps, 0, context, new_rows)]
            p10, p90 = np.quantile(extra, [0.1, 0.9], method="nearest")
            return {"config": config, "steps": steps, "context": context, "new_rows": new_rows,
                    "step_us": d.last_step_seconds * 1e6, "python_us_median": statistics.median(extra) * 1e6,
                    "python_us_p10": p10 * 1e6, "python_us_p90": p90 * 1e6}


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
