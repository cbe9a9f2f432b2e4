#!/usr/bin/env python3
"""Helpers of launch/scale.sh: run one benchmark and record the machine's load around it
(/proc/loadavg; other processes' and stolen CPU time from /proc/stat), append its bench JSON with
the run's parameters, machine and load to records.jsonl, tell whether a tp can shard a config,
and write the vocabulary-study configs."""

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import geometry  # noqa: E402
import records  # noqa: E402
import tables as tb  # noqa: E402


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


def parse_stat_line(line):
    """(busy, steal, total) clock ticks from /proc/stat's aggregate `cpu` line: busy counts user,
    nice, system, irq and softirq (guest time is inside user); total adds idle, iowait and steal."""
    v = [int(x) for x in line.split()[1:]]
    v += [0] * (8 - len(v))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def snapshot():
    """The machine's CPU counters and load average now."""
    with open("/proc/stat") as f:
        busy, steal, total = parse_stat_line(f.readline())
    with open("/proc/loadavg") as f:
        loadavg = [float(x) for x in f.read().split()[:3]]
    return {"t": time.monotonic(), "busy": busy, "steal": steal, "total": total, "loadavg": loadavg}


def load_between(before, after, run_cpu_s, ticks_per_s):
    """What else ran on the machine between two snapshots while the benchmark took run_cpu_s of CPU
    time: the CPU time of other processes (machine busy time minus ours), as average busy cores,
    and the share of the machine's time the hypervisor stole."""
    wall = max(after["t"] - before["t"], 1e-9)
    busy = (after["busy"] - before["busy"]) / ticks_per_s
    total = (after["total"] - before["total"]) / ticks_per_s
    steal = (after["steal"] - before["steal"]) / ticks_per_s
    other = max(0.0, busy - run_cpu_s)
    return {"wall_s": round(wall, 3), "run_cpu_s": round(run_cpu_s, 3), "machine_busy_cpu_s": round(busy, 3),
            "other_cpu_s": round(other, 3), "other_cores": round(other / wall, 3),
            "steal_share": round(steal / total, 4) if total > 0 else 0.0,
            "loadavg_before": before["loadavg"], "loadavg_after": after["loadavg"]}


def with_load(fn):
    """(fn(), the load around it): the CPU time of the child processes fn waited for is the run's."""
    before, used0 = snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = fn()
    after, used1 = snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
    run_cpu = (used1.ru_utime - used0.ru_utime) + (used1.ru_stime - used0.ru_stime)
    return result, load_between(before, after, run_cpu, os.sysconf("SC_CLK_TCK"))


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
