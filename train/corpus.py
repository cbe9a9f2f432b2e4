#!/usr/bin/python3
"""The corpus and the tokenizer of the trained pair.

  corpus.py manifest   [--out pair/corpus-manifest.json] [--seed 0]
  corpus.py tokenizer  [--manifest ...] [--out pair/target/tokenizer.model] [--vocab-size 16384]
  corpus.py counts     [--manifest ...] [--tokenizer ...] --out tokens.txt   (train split, for `tpdraft vocab`)

The corpus is the Python standard library's source as Debian's python3 installs it: every `.py`
file under sysconfig's stdlib path, outside site-packages / dist-packages and the GUI packages
Debian ships apart (tkinter, idlelib, turtledemo). The sorted list is shuffled with the seed and
split by file into held-out (5%), validation (5%) and train; the manifest keeps each file's size
and sha256, and every later stage refuses a file that is missing or differs, naming it."""

import argparse
import hashlib
import os
import random
import sys
import sysconfig

sys.dont_write_bytecode = True
from common import PAIR, fail, field, main_guard, read_json, write_json  # noqa: E402

EXCLUDED = {"site-packages", "dist-packages", "__pycache__", "tkinter", "idlelib", "turtledemo"}
SPLITS = (("heldout", 0.05), ("validation", 0.05))  # the rest is train
MANIFEST = os.path.join(PAIR, "corpus-manifest.json")
STDLIB = sysconfig.get_paths()["stdlib"]
TOKENIZER = os.path.join(PAIR, "target", "tokenizer.model")

# Pieces the tokenizer holds beside what it learns. "<mask>" is the drafters' MASK row: a control
# symbol, so no text ever encodes to it. A newline followed by an indent of 0-7 levels is one
# piece (Python's lines start that way), so the drafter's blocks see indentation as one token.
MASK_PIECE = "<mask>"
NEWLINE_PIECES = ["\n" + "\u2581" * (4 * level) for level in range(8)]  # U+2581: the escaped space


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def scan(root):
    """Relative paths of the corpus files under root, sorted."""
    if not os.path.isdir(root):
        fail(f"{root}: the standard library folder (sysconfig's 'stdlib' path) does not exist")
    found = []
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED)
        found += [os.path.relpath(os.path.join(top, f), root) for f in files if f.endswith(".py")]
    if not found:
        fail(f"{root}: no .py files found (is Debian's python3 installed?)")
    return sorted(found)


def make_manifest(root, seed):
    files = scan(root)
    order = list(files)
    random.Random(seed).shuffle(order)
    split_of, at = {}, 0
    for name, share in SPLITS:
        count = max(1, round(share * len(order)))
        split_of.update((f, name) for f in order[at:at + count])
        at += count
    return {"corpus": "the .py files under sysconfig.get_paths()['stdlib']", "python": sys.version.split()[0],
            "seed": seed, "excluded": sorted(EXCLUDED),
            "files": [{"path": f, "bytes": os.path.getsize(os.path.join(root, f)),
                       "sha256": sha256(os.path.join(root, f)), "split": split_of.get(f, "train")}
                      for f in files]}


def load_manifest(path=MANIFEST):
    manifest = read_json(path, "corpus manifest")
    files = field(manifest, "files", list, path)
    for i, entry in enumerate(files):
        where = f"{path}: files[{i}]"
        field(entry, "path", str, where)
        field(entry, "sha256", str, where)
        if field(entry, "split", str, where) not in ("train", "validation", "heldout"):
            fail(f"{where}: field 'split' is {entry['split']!r}, expected train, validation or heldout")
    return manifest


def split_files(manifest, split, verify=True, root=None):
    """(absolute path, entry) of the split's files; with verify, each must exist with its sha256."""
    root = root or STDLIB
    out = []
    for entry in manifest["files"]:
        if entry["split"] != split:
            continue
        path = os.path.join(root, entry["path"])
        if verify:
            if not os.path.isfile(path):
                fail(f"{path}: corpus file listed in the manifest is missing (split {split})")
            if sha256(path) != entry["sha256"]:
                fail(f"{path}: differs from the manifest's sha256 (another python3 build?); "
                     "the trained files came from the listed contents")
        out.append((path, entry))
    return out


def read_text(path):
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


def train_tokenizer(manifest, out, vocab_size, seed):
    import sentencepiece as spm
    spm.set_random_generator_seed(seed)
    texts = [read_text(p) for p, _ in split_files(manifest, "train")]
    # Sentences are runs of up to 40 lines: newline pieces are user symbols, matched before
    # learning, so nothing is lost by cutting there, and short sentences keep the trainer fast.
    sentences = []
    for text in texts:
        lines = text.split("\n")
        sentences += ["\n".join(lines[i:i + 40]) for i in range(0, len(lines), 40)]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    prefix = out[:-len(".model")] if out.endswith(".model") else out
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=prefix, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=False, split_digits=True,
        allow_whitespace_only_pieces=True, max_sentence_length=1 << 16, input_sentence_size=0,
        shuffle_input_sentence=False, num_threads=1, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        control_symbols=[MASK_PIECE], user_defined_symbols=NEWLINE_PIECES, minloglevel=2)
    if prefix + ".model" != out:
        os.replace(prefix + ".model", out)
    vocab = prefix + ".vocab"
    if os.path.exists(vocab):
        os.remove(vocab)
    return check_tokenizer(out, texts[:50])


def open_tokenizer(path=TOKENIZER):
    import sentencepiece as spm
    if not os.path.isfile(path):
        fail(f"{path}: tokenizer model not found")
    try:
        return spm.SentencePieceProcessor(model_file=path)
    except (RuntimeError, OSError) as e:
        fail(f"{path}: not a sentencepiece model ({e})")


def check_tokenizer(path, texts):
    """Every text must round-trip; returns (the processor, chars per token over texts)."""
    sp = open_tokenizer(path)
    chars = tokens = 0
    for text in texts:
        ids = sp.encode(text)
        if sp.decode(ids) != text:
            fail(f"{path}: a text does not round-trip through the tokenizer")
        chars, tokens = chars + len(text), tokens + len(ids)
    return sp, chars / max(tokens, 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("manifest", help="scan the standard library and write the split manifest")
    m.add_argument("--out", default=MANIFEST)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--stdlib", default=STDLIB)
    t = sub.add_parser("tokenizer", help="train the BPE tokenizer on the train split")
    t.add_argument("--manifest", default=MANIFEST)
    t.add_argument("--out", default=TOKENIZER)
    t.add_argument("--vocab-size", type=int, default=16384)
    t.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("counts", help="tokenize the train split into one file of ids (tpdraft vocab --corpus)")
    c.add_argument("--manifest", default=MANIFEST)
    c.add_argument("--tokenizer", default=TOKENIZER)
    c.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.command == "manifest":
        manifest = make_manifest(a.stdlib, a.seed)
        write_json(a.out, manifest)
        by = {}
        for e in manifest["files"]:
            n, b = by.get(e["split"], (0, 0))
            by[e["split"]] = (n + 1, b + e["bytes"])
        print(f"{a.out}: " + ", ".join(f"{k} {n} files / {b / 1e6:.2f} MB" for k, (n, b) in sorted(by.items())))
    elif a.command == "tokenizer":
        if a.vocab_size < 16384 - 1 or a.vocab_size > 65536:
            fail(f"--vocab-size {a.vocab_size}: expected 16384 to 65536")
        sp, rate = train_tokenizer(load_manifest(a.manifest), a.out, a.vocab_size, a.seed)
        print(f"{a.out}: {sp.get_piece_size()} pieces, {rate:.2f} characters per token, mask id "
              f"{sp.piece_to_id(MASK_PIECE)}")
    else:
        sp = open_tokenizer(a.tokenizer)
        with open(a.out, "w") as f:
            for path, _ in split_files(load_manifest(a.manifest), "train"):
                f.write(" ".join(map(str, sp.encode(read_text(path)))) + "\n")
        print(f"{a.out}: the train split's token ids")
    return 0


if __name__ == "__main__":
    main_guard("corpus.py", main)
