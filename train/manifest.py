#!/usr/bin/python3
"""Writes pair/MANIFEST: the sha256 and size of every shipped file of the trained pair, and the
command that reproduces each from the seeds; `--check` verifies the files against it instead.

  manifest.py [--pair pair] [--check]"""

import argparse
import hashlib
import os
import sys

sys.dont_write_bytecode = True
from common import PAIR, fail, main_guard  # noqa: E402

# Each shipped file, and the command (from the repository's root) that makes it.
MADE_BY = {
    "corpus-manifest.json": "train/corpus.py manifest --seed 0",
    "target/tokenizer.model": "train/corpus.py tokenizer --vocab-size 16384 --seed 0",
    "target/config.json": "train/target.py --steps 420 --seed 0 --threads 1",
    "target/model.safetensors": "train/target.py --steps 420 --seed 0 --threads 1",
    "target-loss.png": "train/target.py --steps 420 --seed 0 --threads 1",
    "dflash/config.json": "train/distill.py --seed 0 --threads 2 && train/drafter.py --arch dflash --steps 1000 --seed 0 --threads 1",
    "dflash/model.safetensors": "train/distill.py --seed 0 --threads 2 && train/drafter.py --arch dflash --steps 1000 --seed 0 --threads 1",
    "dflash-loss.png": "train/drafter.py --arch dflash --steps 1000 --seed 0 --threads 1",
    "dflash-loss.json": "train/drafter.py --arch dflash --steps 1000 --seed 0 --threads 1",
    "dflash2/config.json": "train/distill.py --seed 0 --threads 2 && train/drafter.py --arch dflash2 --steps 1000 --seed 0 --threads 1",
    "dflash2/model.safetensors": "train/distill.py --seed 0 --threads 2 && train/drafter.py --arch dflash2 --steps 1000 --seed 0 --threads 1",
    "dflash2-loss.png": "train/drafter.py --arch dflash2 --steps 1000 --seed 0 --threads 1",
    "dflash2-loss.json": "train/drafter.py --arch dflash2 --steps 1000 --seed 0 --threads 1",
}
LIMIT = 40 * 1000 * 1000  # bytes the shipped pair may take


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_manifest(path):
    """{file: (sha256, bytes)} of a MANIFEST (lines 'sha256  bytes  file  # command')."""
    if not os.path.isfile(path):
        fail(f"{path}: not found")
    out = {}
    for number, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or len(parts[0]) != 64 or not parts[1].isdigit():
            fail(f"{path}:{number}: expected 'sha256 bytes file', got {line!r}")
        out[parts[2]] = (parts[0], int(parts[1]))
    return out


def check(pair):
    """Every file the MANIFEST lists matches it; returns the list of differences."""
    problems = []
    for name, (digest, size) in read_manifest(os.path.join(pair, "MANIFEST")).items():
        path = os.path.join(pair, name)
        if not os.path.isfile(path):
            problems.append(f"{path}: missing")
        elif os.path.getsize(path) != size or sha256(path) != digest:
            problems.append(f"{path}: differs from the MANIFEST")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default=PAIR)
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    if a.check:
        problems = check(a.pair)
        for line in problems:
            print(line, file=sys.stderr)
        print(f"{a.pair}/MANIFEST: {'ok' if not problems else f'{len(problems)} files differ'}")
        return 1 if problems else 0
    lines = ["# The trained pair: sha256, bytes, file (relative to pair/), and the command that reproduces it",
             "# from the seeds (run from the repository's root; train/make_pair.sh runs them all in order)."]
    total = 0
    for name, command in MADE_BY.items():
        path = os.path.join(a.pair, name)
        if not os.path.isfile(path):
            fail(f"{path}: missing (made by {command})")
        size = os.path.getsize(path)
        total += size
        lines.append(f"{sha256(path)}  {size:>9}  {name}  # {command}")
    if total > LIMIT:
        fail(f"{a.pair}: the shipped files take {total} bytes, over the {LIMIT} the pair may take")
    with open(os.path.join(a.pair, "MANIFEST"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{a.pair}/MANIFEST: {len(MADE_BY)} files, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    main_guard("manifest.py", main)
