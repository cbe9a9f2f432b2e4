#!/usr/bin/env python3
"""What a step through the Python module costs beyond the C library's own tpdraft_step: the
wall time of Drafter.step minus the time the module measured inside tpdraft_step, per step, in
one run (median and p10-p90), for each way taps arrive: numpy f32, torch f32 and bf16 tensors
(DLPack), and torch f32 with the results as torch tensors (out='torch'), and whether the machine
was idle (bench/timing.py). Usage:
python_overhead.py [--config configs/X.json] [--steps N] [--build DIR] (the module from DIR/python,
default build/; the checkpoint made by DIR/tpdraft init in a temp dir)."""

import argparse
import json
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
import timing  # noqa: E402
from served import checkpoint  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTEXT, NEW_ROWS = 64, 2

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--config", action="append")
ap.add_argument("--steps", type=int, default=2000)
ap.add_argument("--context", type=int, default=CONTEXT)
ap.add_argument("--new-rows", type=int, default=NEW_ROWS)
ap.add_argument("--build", default=os.path.join(REPO, "build"))
ARGS = ap.parse_args()
sys.path.insert(0, os.path.join(ARGS.build, "python"))
import tpdraft  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

# name -> (make the taps from f32 numpy rows, out=)
KINDS = {"numpy f32": (lambda a: a, "numpy")}
if torch is not None:
    KINDS.update({"torch f32": (torch.from_numpy, "numpy"),
                  "torch bf16": (lambda a: torch.from_numpy(a).to(torch.bfloat16), "numpy"),
                  "torch f32, out=torch": (torch.from_numpy, "torch")})


def measure(config, steps, context, new_rows):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint(os.path.join(ARGS.build, "tpdraft"), os.path.join(REPO, config), tmp + "/ck")
        with tpdraft.Drafter(tmp + "/ck/drafter", tmp + "/ck/target", backend="cpu", threads=1,
                             max_context=context + 64) as d:
            for kind, (make, out) in KINDS.items():
                # Per step of a decoding loop: wall seconds of Drafter.step minus those inside tpdraft_step.
                extra = [wall - d.last_step_seconds for wall in timing.decode_steps(
                    d, steps, context=context, new_rows=new_rows, make=make, out=out)]
                rows.append({"config": config, "taps": kind, "steps": steps, "context": context,
                             "new_rows": new_rows, "step_us": d.last_step_seconds * 1e6,
                             **timing.figure("python_us", extra, 1e6)})
    return rows


def main():
    a = ARGS
    rows, load = timing.with_load(lambda: [
        r for c in (a.config or ["configs/tiny-dflash2.json", "configs/bench-dflash2-2048.json"])
        for r in measure(c, a.steps if "bench" not in c else max(20, a.steps // 100), a.context, a.new_rows)])
    for r in rows:
        r["machine_load"] = timing.machine_load(load)
    print(f"{'config':32} {'taps':22} {'step (C) us':>12} {'Python adds us (median)':>24} {'p10..p90':>16}")
    for r in rows:
        print(f"{r['config']:32} {r['taps']:22} {r['step_us']:12.1f} {r['python_us_median']:24.2f} "
              f"{r['python_us_p10']:7.2f}..{r['python_us_p90']:.2f}")
    print("machine:", timing.describe(load))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
