#!/usr/bin/env python3
"""Helpers of launch/scale.sh: run one benchmark and record the machine's load around it
(bench/timing.py: other processes' and stolen CPU time, the load average), append its bench JSON with
the run's parameters, machine and load to records.jsonl, tell whether a tp can shard a config,
and write the vocabulary-study configs."""

import argparse
import json
import os
import socket
import subprocess
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import geometry  # noqa: E402
import records  # noqa: E402
import tables as tb  # noqa: E402
from timing import with_load  # noqa: E402  (bench/timing.py: records.py puts bench/ on the path)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cmd_measure(a):
    """Runs the command (its output goes where ours goes) and writes the load around it to --load."""
    command = a.command[1:] if a.command and a.command[0] == "--" else a.command
    if not command:
        print("record.py measure: no command given", file=sys.stderr)
        return 2
    rc, load = with_load(lambda: subprocess.call(command))
    with open(a.load, "w") as f:
        json.dump(load, f)
    return rc


def parse_value(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def cmd_append(a):
    raw = sys.stdin.read().strip()
    line = raw.splitlines()[-1] if raw else ""
    try:
        bench = json.loads(line)
    except json.JSONDecodeError:
        print(f"record.py: the run printed no JSON result (last line: {line[:200]!r})", file=sys.stderr)
        return 1
    extra = {key: parse_value(value) for key, _, value in (kv.partition("=") for kv in a.set)}
    load = tb.read_json(a.load) if a.load and os.path.isfile(a.load) else None
    rec = records.annotate(bench, a.config, cores(), cpu_model(), socket.gethostname(), extra, load)
    with open(a.out, "a") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")
    return 0


def cmd_valid_tp(a):
    problem = geometry.Info(a.bin).problem(a.config, a.tp)
    if problem:
        print(problem)
        return 1
    return 0


def cmd_vocab_configs(a):
    for _, path in geometry.write_vocab_configs(a.base, a.vocab, a.dir):
        print(path)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    mp = sub.add_parser("measure", help="run COMMAND and write the machine's load around it to --load")
    mp.add_argument("--load", required=True, help="JSON file for the load figures")
    mp.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    ap = sub.add_parser("append", help="append the bench JSON on stdin to --out with the run's parameters")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", required=True, help="the config file the run used")
    ap.add_argument("--load", help="the load file `measure` wrote for this run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra fields (JSON values or text)")
    vp = sub.add_parser("valid-tp", help="exit 0 when TP can shard CONFIG, else print why and exit 1")
    vp.add_argument("config")
    vp.add_argument("tp", type=int)
    vp.add_argument("--bin", help="the tpdraft binary (default: build/tpdraft of this repository)")
    cp = sub.add_parser("vocab-configs", help="write BASE with each vocab_size of --vocab into --dir; prints the paths")
    cp.add_argument("--base", required=True)
    cp.add_argument("--vocab", type=tb.ints, required=True)
    cp.add_argument("--dir", required=True)
    a = p.parse_args(argv)
    handlers = {"measure": cmd_measure, "append": cmd_append, "valid-tp": cmd_valid_tp, "vocab-configs": cmd_vocab_configs}
    return handlers[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
