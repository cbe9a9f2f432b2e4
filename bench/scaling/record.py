#!/usr/bin/env python3
"""Small helpers of launch/scale.sh: append one `tpdraft bench --json` result with its run's
parameters and the machine to records.jsonl (keeping its `gather_logits` flag), tell whether a tp can shard a config, and write the
vocabulary-study configs (a base config with only vocab_size changed)."""

import argparse
import datetime
import json
import os
import socket
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scalelib as sl  # noqa: E402


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


def parse_value(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def cmd_append(a):
    raw = sys.stdin.read().strip()
    line = raw.splitlines()[-1] if raw else ""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        print(f"record.py: the run printed no JSON result (last line: {line[:200]!r})", file=sys.stderr)
        return 1
    rec["config_file"] = a.config
    rec["config_name"] = os.path.splitext(os.path.basename(a.config))[0]
    rec["nproc"] = cores()
    rec["cpu_model"] = cpu_model()
    rec["hostname"] = socket.gethostname()
    rec["timestamp"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for kv in a.set:
        key, _, value = kv.partition("=")
        rec[key] = parse_value(value)
    # Runs of a bench without the flag are default runs; the reports tell the two paths apart by it.
    rec["gather_logits"] = bool(rec.get("gather_logits", False))
    rec["oversubscribed"] = rec.get("backend", "cpu") == "cpu" and rec.get("tp", 1) * rec.get("threads", 1) > rec["nproc"]
    with open(a.out, "a") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")
    return 0


def cmd_valid_tp(a):
    problem = sl.tp_problem(sl.load_geometry(a.config), a.tp)
    if problem:
        print(problem)
        return 1
    return 0


def cmd_vocab_configs(a):
    with open(a.base) as f:
        base = json.load(f)
    os.makedirs(a.dir, exist_ok=True)
    name = os.path.splitext(os.path.basename(a.base))[0]
    for v in (int(x) for x in a.vocab.split(",") if x.strip()):
        cfg = json.loads(json.dumps(base))
        cfg["vocab_size"] = v
        # The MASK id must stay a valid token of the smaller vocabularies.
        for holder in (cfg, cfg.get("dflash_config", {})):
            if "mask_token_id" in holder and holder["mask_token_id"] >= v:
                holder["mask_token_id"] = v - 1
        path = os.path.join(a.dir, f"{name}-v{v}.json")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        print(path)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ap = sub.add_parser("append", help="append the bench JSON on stdin to --out with the run's parameters")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", required=True, help="the config file the run used")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra fields (JSON values or text)")
    vp = sub.add_parser("valid-tp", help="exit 0 when TP can shard CONFIG, else print why and exit 1")
    vp.add_argument("config")
    vp.add_argument("tp", type=int)
    cp = sub.add_parser("vocab-configs", help="write BASE with each vocab_size of --vocab into --dir; prints the paths")
    cp.add_argument("--base", required=True)
    cp.add_argument("--vocab", required=True)
    cp.add_argument("--dir", required=True)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    return {"append": cmd_append, "valid-tp": cmd_valid_tp, "vocab-configs": cmd_vocab_configs}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
