"""One block drafted by the trained pair (pair/) on held-out source, the way scripts/demo.sh shows
it: the target reads a prompt cut from a held-out file of the Python standard library and picks
its next token (the anchor); `tpdraft draft` settles the target's taps of the prompt and drafts
the B - 1 tokens after the anchor; the target's own greedy continuation decides how many are
accepted. Prints the prompt's last line, the drafted and the target's continuations as text, and
the block's acceptance.

  pair_demo.py [--file FILE] [--arch dflash2|dflash] [--prompt-tokens 256] [--at 0.5] [--json]"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_target  # noqa: E402
import trained_pair  # noqa: E402


def shown(text):
    """A continuation as one readable line: newlines and indents made visible."""
    return text.replace("\n", "\u23ce")


def greedy(target, tap_layers, prompt, n):
    """The target's own n greedy tokens after the prompt, and its taps of the prompt's rows."""
    cache = target.new_cache(1, len(prompt) + n)
    logits, taps = target.forward([prompt], [0], cache, tap_layers)
    out = [int(logits[0, -1].argmax())]
    while len(out) < n:
        logits, _ = target.forward([[out[-1]]], [len(prompt) + len(out) - 1], cache, tap_layers)
        out.append(int(logits[0, 0].argmax()))
    return out, taps


def run(args):
    import numpy as np
    pair = trained_pair.Pair(args.pair, args.arch)
    path = args.file or trained_pair.heldout_files(args.pair)[0]
    text = trained_pair.read_source(path)
    ids = pair.tokenizer.encode(text)
    room = len(ids) - args.prompt_tokens - 16
    if room < 0:
        raise trained_pair.PairError(f"{path}: {len(ids)} tokens, too short for a prompt of {args.prompt_tokens}")
    start = int(room * args.at)
    prompt = ids[start:start + args.prompt_tokens]
    target = pair.target()
    block = pair.drafter_config["dflash_config"]["block_size"]
    own, taps = greedy(target, pair.taps, prompt, block)
    anchor = own[0]
    with tempfile.TemporaryDirectory() as scratch:
        taps_file = os.path.join(scratch, "taps.safetensors")
        qwen3_target.write_safetensors(taps_file, {"taps": taps[0].astype(np.float32)})
        done = subprocess.run([trained_pair.find_program(), "draft", "--drafter", pair.drafter_dir, "--target", pair.target_dir,
                               "--taps", taps_file, "--anchor", str(anchor)], capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr)
        return done.returncode
    drafts = json.loads(done.stdout)["tokens"]
    accepted = next((i for i, (d, t) in enumerate(zip(drafts, own[1:])) if d != t), len(drafts))
    decode = pair.tokenizer.decode
    prompt_text = decode(prompt)
    result = {"file": path, "prompt_tokens": len(prompt), "anchor": anchor, "drafts": drafts, "target": own[1:],
              "accepted": accepted, "committed": accepted + 1,
              "prompt_last_line": prompt_text.rsplit("\n", 1)[-1] if prompt_text.strip() else prompt_text,
              "drafted_text": decode([anchor] + drafts), "target_text": decode(own)}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"held-out file   {path} (tokens {start} .. {start + len(prompt) - 1} as the prompt)")
    print(f"prompt ends     {result['prompt_last_line']!r}")
    print(f"drafted         {shown(result['drafted_text'])}")
    print(f"target's own    {shown(result['target_text'])}")
    marks = "".join("=" if i < accepted else ("x" if i == accepted else ".") for i in range(len(drafts)))
    print(f"acceptance      {accepted} of {len(drafts)} drafts accepted [{marks}]: one target forward commits "
          f"{accepted + 1} tokens (the accepted drafts and the target's own next token)")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default=trained_pair.PAIR)
    p.add_argument("--arch", choices=trained_pair.DRAFTERS, default="dflash2")
    p.add_argument("--file", help="the source the prompt is cut from (default: the longest held-out file)")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--at", type=float, default=0.5, help="where in the file the prompt starts (0 .. 1)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.prompt_tokens < 1 or not 0 <= args.at <= 1:
        p.error("--prompt-tokens must be at least 1 and --at lie in [0, 1]")
    os.environ.setdefault("TPDRAFT_LOG_LEVEL", "warn")
    try:
        return run(args)
    except ValueError as e:
        print(f"pair_demo.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
