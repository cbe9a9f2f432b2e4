#!/usr/bin/python3
"""Checks that training reproduces the shipped pair from its seeds: reruns the first --steps
optimizer steps of each model's training (in a temporary folder, the shipped files untouched)
and compares every step's training loss with the one recorded beside the shipped loss curve
(pair/<name>-loss.json). Exits 1 when any step differs by more than --tolerance (relative).

  reproduce.py [--steps 20] [--models target,dflash,dflash2] [--tolerance 0.02] [--threads 1]

--steps 0 reruns each training to its end (about an hour of CPU time per model) and compares
the final validation loss as well. The drafters train on build/train/distill
(train/distill.py), which is rebuilt first when it is missing."""

import argparse
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
from common import PAIR, WORK, fail, main_guard, read_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("target", "dflash", "dflash2")
TARGET_LR = 3e-3  # train/target.py's default --lr, the one the shipped target was trained with


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="steps to rerun per model (0: all of them)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pair", default=PAIR)
    a = p.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    unknown = [m for m in a.models if m not in MODELS]
    if unknown:
        p.error(f"--models: unknown model '{unknown[0]}' (choose from {', '.join(MODELS)})")
    if a.steps < 0 or a.threads < 1 or a.tolerance <= 0:
        p.error("--steps must be 0 or more, --threads at least 1, --tolerance positive")
    return a


def command(name, options, work, steps, threads):
    script = "target.py" if name == "target" else "drafter.py"
    cmd = [sys.executable, os.path.join(HERE, script), "--threads", str(threads), "--seed", str(options["seed"]),
           "--steps", str(options["steps"]), "--lr", repr(options["lr"]),
           "--work", os.path.join(work, "state"), "--out", os.path.join(work, "out"),
           "--plot", os.path.join(work, "loss.png")]
    if name != "target":
        cmd += ["--arch", name, "--batch", str(options["batch"]), "--anchors", str(options["anchors"]),
                "--target", os.path.join(PAIR, "target")]
    if steps:
        cmd += ["--stop-after", str(steps)]
    return cmd


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def shipped_record(name, a):
    """The shipped model's loss record: pair/<name>-loss.json (options, per-step train and
    validation losses), or for a target exported without one, what its config.json keeps
    (tpdraft_training: the options and the final losses, no per-step losses)."""
    path = os.path.join(a.pair, name + "-loss.json")
    if os.path.exists(path):
        shipped = read_json(path, f"the loss record of {name}")
        if not isinstance(shipped.get("options"), dict) or not shipped.get("train"):
            fail(f"{path}: fields 'options' and 'train' are missing")
        return shipped
    config = os.path.join(a.pair, name, "config.json")
    info = read_json(config, f"the config of {name}").get("tpdraft_training") if os.path.exists(config) else None
    if name != "target" or not isinstance(info, dict):
        fail(f"{path}: the loss record of {name} not found")
    return {"options": {"steps": info["steps"], "seed": info["seed"], "lr": TARGET_LR}, "train": [],
            "validation": [(info["steps"], info["validation_loss"])], "from": config}


def check(name, a):
    import torch
    shipped = shipped_record(name, a)
    options = shipped["options"]
    steps = a.steps or options["steps"]
    if steps > options["steps"]:
        fail(f"--steps {steps}: {name} was trained for only {options['steps']} steps")
    if a.steps and not shipped["train"]:
        return False, [f"{name}: NOT CHECKED: {shipped['from']} keeps only the final losses, not each step's; "
                       f"--steps 0 reruns the whole training and compares those"]
    with tempfile.TemporaryDirectory(prefix=f"tpdraft-reproduce-{name}-") as work:
        cmd = command(name, options, work, a.steps, a.threads)
        print(f"reproduce.py: {name}: rerunning {steps} of {options['steps']} steps", file=sys.stderr)
        if subprocess.run(cmd).returncode != 0:
            fail(f"{name}: training failed: {' '.join(cmd)}")
        state = torch.load(os.path.join(work, "state", "state.pt"))
    mine = dict((s, v) for s, v in state["history"]["train"])
    worst = (0.0, 0)
    for s, v in shipped["train"][:steps]:
        if s not in mine:
            fail(f"{name}: the rerun has no loss for step {s}")
        worst = max(worst, (relative(mine[s], v), s))
    lines = []
    if shipped["train"]:
        lines.append(f"{name}: {steps} steps, largest difference in training loss {100 * worst[0]:.3f}% "
                     f"(step {worst[1]})")
    ok = worst[0] <= a.tolerance
    if a.steps == 0:
        v_mine, v_ship = state["history"]["validation"][-1][1], shipped["validation"][-1][1]
        d = relative(v_mine, v_ship)
        lines.append(f"{name}: final validation loss {v_mine:.4f} against {v_ship:.4f} shipped ({100 * d:.2f}%)")
        ok = ok and d <= a.tolerance
    return ok, lines


def distilled(meta_path):
    """Whether train/distill.py's data is complete (its batches all done)."""
    if not os.path.exists(meta_path):
        return False
    meta = read_json(meta_path, "the distilled data's meta.json")
    return meta.get("batches_done", 0) * meta.get("batch", 1) >= meta.get("sequences", 1)


def run(argv=None):
    a = parse(argv)
    if any(m != "target" for m in a.models) and not distilled(os.path.join(WORK, "distill", "meta.json")):
        if subprocess.run([sys.executable, os.path.join(HERE, "distill.py"), "--threads", str(a.threads)]).returncode:
            fail("train/distill.py failed: the drafters' data could not be rebuilt")
    good = True
    for name in a.models:
        ok, lines = check(name, a)
        for line in lines:
            print(("" if ok else "MISMATCH ") + line)
        good = good and ok
    print(f"reproduce.py: {'every' if good else 'NOT every'} model reproduced within {100 * a.tolerance:g}%")
    return 0 if good else 1


if __name__ == "__main__":
    main_guard("reproduce.py", run)
