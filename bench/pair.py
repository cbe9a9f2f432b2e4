#!/usr/bin/python3
"""The trained pair's figures (docs/pair.md): examples/spec_decode.py on held-out source in each
configuration docs/pair.md reports, one run each on the same prompts, and `tpdraft bench` of the
drafter's head with the full vocabulary and with token maps made from the train split's counts.

  bench/pair.py [--pair DIR] [--tokens 128] [--requests 8] [--threads 2] [--only NAME,...]
                [--out FILE] [--list]

Each configuration is one spec_decode.py run (`--json`): the target alone and speculative decoding
on the same prompts in the same process, so their ratio is taken in one run. The machine's load
around each run is recorded (bench/timing.py): a run beside other work is marked NOT idle. The
JSON report (--out, default build/pair-report.json) holds every run's spec_decode report, the
command that made it and its machine load; the table goes to stdout."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "examples"))
import timing  # noqa: E402
from trained_pair import find_program  # noqa: E402

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MAP_SIZES = (1024, 2048, 4096, 8192)
INT4_GROUPS = (128, 64, 32)  # scale groups of the int4 drafters made with tpdraft quantize
EOS = 2  # the tokenizer's </s>: every map keeps it, so a drafted end of file stays draftable


def configurations():
    """(name, spec_decode.py arguments; {map} stands for a token map's path) in report order."""
    runs = []
    for temp, label in ((0, "greedy"), (1, "T=1")):
        for tp in (1, 2, 4):
            runs.append((f"dflash2 {label} tp{tp}", ["--temperature", str(temp), "--tp", str(tp)]))
    runs += [("dflash greedy tp1", ["--arch", "dflash"]), ("dflash T=1 tp1", ["--arch", "dflash", "--temperature", "1"])]
    runs += [(f"dflash2 greedy map{n // 1024}k", ["--token-map", f"{{map{n}}}"]) for n in MAP_SIZES]
    runs += [(f"dflash2 greedy {q}", ["--quant", q]) for q in ("q8", "q4", "q8+head", "q4+head", "q8a16", "q4a16")]
    runs += [(f"dflash2 greedy int4 g{g}", ["--pair", f"{{int4g{g}}}"]) for g in INT4_GROUPS]
    runs += [("dflash2 greedy kv-bf16", ["--kv-dtype", "bf16"]), ("dflash2 greedy served", ["--serve"])]
    return runs


def int4_pair(pair, scratch, group):
    """A pair in `scratch` whose DFlash 2 drafter has every layer matrix int4 in scale groups of
    `group` inputs (`tpdraft quantize --bits 4 --group G`; fc stays bf16, the target is linked)."""
    out = os.path.join(scratch, f"int4-g{group}")
    os.makedirs(out)
    os.symlink(os.path.abspath(os.path.join(pair, "target")), os.path.join(out, "target"))
    shutil.copy(os.path.join(pair, "corpus-manifest.json"), out)
    subprocess.run([find_program(), "quantize", "--drafter", os.path.join(pair, "dflash2"), "--bits", "4", "--group",
                    str(group), "--out", os.path.join(out, "dflash2")], check=True, stdout=subprocess.DEVNULL)
    return out


def token_maps(pair, scratch):
    """{size: path} of token maps of the train split's most frequent ids (train/corpus.py counts,
    then tpdraft vocab)."""
    counts = os.path.join(scratch, "train-tokens.txt")
    subprocess.run([PY, os.path.join(REPO, "train", "corpus.py"), "counts", "--tokenizer",
                    os.path.join(pair, "target", "tokenizer.model"), "--out", counts], check=True,
                   stdout=subprocess.DEVNULL)
    maps = {}
    for n in MAP_SIZES:
        maps[n] = os.path.join(scratch, f"map-{n}.json")
        subprocess.run([find_program(), "vocab", "--corpus", counts, "--size", str(n), "--drafter",
                        os.path.join(pair, "dflash2"), "--keep", str(EOS), "--out", maps[n]], check=True,
                       stdout=subprocess.DEVNULL)
    return maps


def run_json(cmd):
    """(the JSON a command prints, the machine's load around it)."""
    done, load = timing.with_load(lambda: subprocess.run(cmd, capture_output=True, text=True))
    if done.returncode not in (0, 1):  # spec_decode.py exits 1 when greedy output differs: reported
        sys.exit(f"pair.py: {' '.join(cmd)} failed:\n{done.stderr}")
    return json.loads(done.stdout), timing.machine_load(load)


def head_times(pair, maps, requests, threads):
    """{map size or 'full': tpdraft bench's median head and draft ms} at the pair's block, with
    `requests` sessions of 256 context rows drafted together."""
    out = {}
    for n in ("full", *MAP_SIZES):
        cmd = [find_program(), "bench", "--drafter", os.path.join(pair, "dflash2"), "--target",
               os.path.join(pair, "target"), "--ctx", "256", "--batch", str(requests), "--threads", str(threads),
               "--repeat", "30", "--json"]
        if n != "full":
            cmd += ["--token-map", maps[n]]
        report, load = run_json(cmd)
        out[str(n)] = {"head_ms": report["head_ms"], "draft_ms": report["draft_ms"], "command": cmd,
                       "machine_load": load}
    return out


def table(results, heads):
    rows = [("run", "tau", "speed-up", "target tok/s", "spec tok/s", "draft share", "identical", "idle")]
    for name, r in results.items():
        rep = r["report"]
        rows.append((name, f"{rep['tau']:.2f}", f"{rep['speedup']:.2f}x", f"{rep['target_tokens_per_s']:.0f}",
                     f"{rep['spec_tokens_per_s']:.0f}", f"{rep['draft_share']:.0%}",
                     {True: "yes", False: "NO", None: "-"}[rep["identical"]],
                     "yes" if r["machine_load"]["idle"] else "NOT"))
    if heads:
        rows.append(("head", "ms", "x full", "draft ms", "", "", "", ""))
        full = heads["full"]["head_ms"]
        for n, h in heads.items():
            rows.append((f"head {n}", f"{h['head_ms']:.3f}", f"{h['head_ms'] / full:.2f}", f"{h['draft_ms']:.3f}",
                         "", "", "", "yes" if h["machine_load"]["idle"] else "NOT"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default=os.path.join(REPO, "pair"))
    p.add_argument("--tokens", type=int, default=128, help="tokens each request generates")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="the drafter's CPU threads")
    p.add_argument("--only", help="comma list of run names (or 'head'); default: all (--list shows them)")
    p.add_argument("--out", default=os.path.join(REPO, "build", "pair-report.json"))
    p.add_argument("--list", action="store_true", help="print the run names and their arguments, run nothing")
    a = p.parse_args(argv)
    runs = configurations()
    if a.list:
        for name, args in runs:
            print(f"{name}: {' '.join(args)}")
        return 0
    wanted = set(a.only.split(",")) if a.only else None
    unknown = (wanted or set()) - {n for n, _ in runs} - {"head"}
    if unknown:
        p.error(f"--only: unknown run '{sorted(unknown)[0]}' (see --list)")
    results, heads = {}, {}
    with tempfile.TemporaryDirectory(prefix="tpdraft-pair-") as scratch:
        needs_maps = wanted is None or "head" in wanted or any("map" in n for n in wanted)
        maps = token_maps(a.pair, scratch) if needs_maps else {}
        made = {f"map{n}": path for n, path in maps.items()}
        made.update({f"int4g{g}": int4_pair(a.pair, scratch, g) for g in INT4_GROUPS
                     if wanted is None or f"dflash2 greedy int4 g{g}" in wanted})

        def shown_as(cmd):  # scratch files by their names
            return [c if not c.startswith(scratch) else os.path.basename(c) for c in cmd]

        for i, (name, args) in enumerate(runs):
            if wanted is not None and name not in wanted:
                continue
            args = [x.format(**made) for x in args]
            cmd = [PY, os.path.join(REPO, "examples", "spec_decode.py"), "--pair", a.pair, "--tokens", str(a.tokens),
                   "--requests", str(a.requests), "--threads", str(a.threads), *args, "--json"]
            print(f"pair.py: [{i + 1}/{len(runs)}] {name}", file=sys.stderr)
            report, load = run_json(cmd)
            results[name] = {"report": report, "command": shown_as(cmd), "machine_load": load}
        if wanted is None or "head" in wanted:
            print("pair.py: head times (tpdraft bench)", file=sys.stderr)
            heads = head_times(a.pair, maps, a.requests, a.threads)
            for h in heads.values():
                h["command"] = shown_as(h["command"])
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"runs": results, "head": heads, "tokens": a.tokens, "requests": a.requests}, f, indent=1)
    table(results, heads)
    print(f"pair.py: report written to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
