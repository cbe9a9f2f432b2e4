#!/usr/bin/python3
"""The drafters' training data, made by the trained target itself (self-distillation): prompts cut
from the train split, each continued by the target (greedy for three batches in four, sampled at
temperature 1 for the fourth), with what a drafter learns from at every position: the tokens, the
target's taps (the residual stream after each tapped layer, bf16) and its next-token
distribution (its 32 most likely tokens and their probabilities).

  distill.py [--sequences 2048] [--batch 32] [--generate 192] [--taps 1,4,6] [--threads 1] [--seed 0]

The target reads what train/target.py wrote (pair/target); the data goes to --out (not
committed). Resumable batch by batch: running the same command again continues."""

import argparse
import os
import sys

sys.dont_write_bytecode = True
from common import PAIR, WORK, CpuClock, Progress, fail, main_guard, read_json, set_threads, write_json  # noqa: E402

SEQ = 512            # the longest sequence (prompt + continuation), the target's training length
TOP = 32             # probabilities kept per position
PROMPT = (32, 320)   # prompt lengths, drawn per batch
DEFAULT_TAPS = "1,4,6"


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--generate", type=int, default=192, help="tokens the target adds to each prompt")
    p.add_argument("--taps", default=DEFAULT_TAPS, help="target layers whose outputs are kept (0-based)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default=os.path.join(PAIR, "target"))
    p.add_argument("--tokens", default=os.path.join(WORK, "target", "train-tokens.npy"),
                   help="the train split as token ids (train/target.py caches it)")
    p.add_argument("--out", default=os.path.join(WORK, "distill"))
    a = p.parse_args(argv)
    if a.sequences < 1 or a.batch < 1 or a.sequences % a.batch:
        p.error("--sequences must be a positive multiple of --batch")
    if not 1 <= a.generate <= SEQ - PROMPT[1]:
        p.error(f"--generate must lie in 1 .. {SEQ - PROMPT[1]}")
    try:
        a.taps = [int(t) for t in a.taps.split(",")]
    except ValueError:
        p.error(f"--taps {a.taps!r}: expected comma-separated layer ids")
    return a


def load_target(torch, target_dir):
    """The trained target as the training module (train/qwen3.py), from its exported files."""
    import qwen3
    from common import read_safetensors
    config = read_json(os.path.join(target_dir, "config.json"), "target config")
    missing = [k for k in qwen3.CONFIG_KEYS if k not in config]
    if missing:
        fail(f"{os.path.join(target_dir, 'config.json')}: missing field '{missing[0]}'")
    model = qwen3.Qwen3(config)
    tensors = read_safetensors(os.path.join(target_dir, "model.safetensors"), torch)
    want = model.state_dict()
    for name in want:
        if name not in tensors:
            fail(f"{os.path.join(target_dir, 'model.safetensors')}: missing tensor '{name}'")
        if list(tensors[name].shape) != list(want[name].shape):
            fail(f"{os.path.join(target_dir, 'model.safetensors')}: tensor '{name}' has shape "
                 f"{list(tensors[name].shape)}, expected {list(want[name].shape)}")
    model.load_state_dict({k: tensors[k] for k in want})
    model.eval()
    return model


def open_arrays(np, out, n, taps_width, create):
    """The data set's arrays, memory-mapped: created at full size, or opened to continue."""
    shapes = {"tokens": ((n, SEQ), np.int16), "taps": ((n, SEQ, taps_width), np.int16),  # bf16 bits
              "top_ids": ((n, SEQ, TOP), np.int16), "top_p": ((n, SEQ, TOP), np.float16),
              "lengths": ((n, 2), np.int32)}  # prompt length, whole length
    mode = "w+" if create else "r+"
    return {k: np.lib.format.open_memmap(os.path.join(out, k + ".npy"), mode=mode, dtype=dt, shape=shape)
            if create else np.load(os.path.join(out, k + ".npy"), mmap_mode=mode)
            for k, (shape, dt) in shapes.items()}


def bf16_bits(torch, x):
    return x.to(torch.bfloat16).view(torch.int16).numpy()


def run(argv=None):
    a = parse(argv)
    torch = set_threads(a.threads)
    import numpy as np
    model = load_target(torch, a.target)
    layers, vocab, hidden = model.c["num_hidden_layers"], model.c["vocab_size"], model.c["hidden_size"]
    bad = [t for t in a.taps if not 0 <= t < layers]
    if bad:
        fail(f"--taps: layer {bad[0]} does not exist; the target ({a.target}/config.json, "
             f"num_hidden_layers) has layers 0 .. {layers - 1}")
    stream = train_tokens(np, a)
    os.makedirs(a.out, exist_ok=True)
    meta_path = os.path.join(a.out, "meta.json")
    meta = {"sequences": a.sequences, "batch": a.batch, "generate": a.generate, "taps": a.taps, "seed": a.seed,
            "seq": SEQ, "top": TOP, "hidden": hidden, "vocab": vocab, "batches_done": 0, "cpu_seconds": 0.0}
    if os.path.exists(meta_path):
        old = read_json(meta_path, "distill state")
        same = all(old.get(k) == meta[k] for k in ("sequences", "batch", "generate", "taps", "seed"))
        if not same:
            fail(f"{meta_path}: data made with other options; remove {a.out} to start over")
        meta = old
    arrays = open_arrays(np, a.out, a.sequences, len(a.taps) * hidden, create=meta["batches_done"] == 0)
    batches = a.sequences // a.batch
    clock, progress = CpuClock(meta["cpu_seconds"]), Progress("distill", batches, meta["batches_done"])
    with torch.no_grad():
        for index in range(meta["batches_done"], batches):
            gen = torch.Generator().manual_seed(a.seed * 1_000_003 + index)
            prompt = int(torch.randint(PROMPT[0], PROMPT[1] + 1, (1,), generator=gen))
            starts = torch.randint(0, len(stream) - prompt, (a.batch,), generator=gen).tolist()
            tokens = torch.stack([torch.from_numpy(stream[s:s + prompt].astype(np.int64)) for s in starts])
            sampled = index % 4 == 3
            fill_batch(torch, np, model, tokens, a, sampled, gen, arrays, index * a.batch)
            arrays["lengths"][index * a.batch:(index + 1) * a.batch] = (prompt, prompt + a.generate)
            for arr in arrays.values():
                arr.flush()
            meta["batches_done"], meta["cpu_seconds"] = index + 1, clock.total()
            write_json(meta_path, meta)
            progress.update(index + 1, clock.total(), prompt=prompt, sampled=int(sampled))
    print(f"distill.py: {a.out}: {a.sequences} sequences, {clock.total() / 60:.1f} CPU minutes", file=sys.stderr)
    return 0


def train_tokens(np, a):
    """The train split as token ids: the cache train/target.py writes, or, where a fresh checkout
    has none, the split tokenized again from the corpus manifest with the target's own tokenizer."""
    if os.path.isfile(a.tokens):
        return np.load(a.tokens)
    import corpus
    from target import token_stream
    tokenizer = os.path.join(a.target, "tokenizer.model")
    if not os.path.isfile(tokenizer):
        fail(f"{a.tokens}: the train split's token ids are missing, and {tokenizer} is not there to make them")
    print(f"distill.py: tokenizing the train split into {a.tokens}", file=sys.stderr)
    return token_stream(np, corpus.load_manifest(corpus.MANIFEST), tokenizer, "train", a.tokens)


def fill_batch(torch, np, model, prompt_tokens, a, sampled, gen, arrays, row):
    """Prefills the prompts, continues them by --generate tokens and writes every position's
    token, taps and top-32 distribution into rows row .. row + batch - 1 of the arrays."""
    b, prompt = prompt_tokens.shape
    total = prompt + a.generate
    cache = model.new_cache(b, total)
    head = model.head_weight()
    tokens = torch.zeros(b, total, dtype=torch.int64)
    tokens[:, :prompt] = prompt_tokens

    def record(hidden, taps, at):
        n = hidden.shape[1]
        probs = torch.softmax(hidden @ head.T, dim=-1)
        top_p, top_ids = probs.topk(TOP, dim=-1)
        arrays["top_ids"][row:row + b, at:at + n] = top_ids.to(torch.int16).numpy()
        arrays["top_p"][row:row + b, at:at + n] = top_p.to(torch.float16).numpy()
        arrays["taps"][row:row + b, at:at + n] = bf16_bits(torch, torch.cat(taps, dim=-1))
        return probs[:, -1]

    last = record(*model(prompt_tokens, a.taps, 0, cache), 0)
    for at in range(prompt, total):
        nxt = torch.multinomial(last, 1, generator=gen)[:, 0] if sampled else last.argmax(-1)
        tokens[:, at] = nxt
        last = record(*model(nxt[:, None], a.taps, at, cache), at)
    arrays["tokens"][row:row + b, :total] = tokens.to(torch.int16).numpy()


if __name__ == "__main__":
    main_guard("distill.py", run)
