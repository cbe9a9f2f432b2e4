"""The trained pair shipped in pair/ (train/ makes it): a Qwen3-shaped target trained on the Python
standard library, its sentencepiece tokenizer, and DFlash / DFlash 2 drafters trained on its
taps. What spec_decode.py and pair_demo.py share: opening the pair with its cross-checks (each
refusal names the file and the field), the held-out files of the corpus manifest, and prompts
cut from a file."""

import json
import os
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PAIR = os.path.join(REPO, "pair")
DRAFTERS = ("dflash2", "dflash")


def find_program():
    """The tpdraft program: $TPDRAFT_BIN, else build/tpdraft, else the one on the PATH."""
    built = (os.environ.get("TPDRAFT_BIN"), os.path.join(REPO, "build", "tpdraft"))
    return next((path for path in built if path and os.access(path, os.X_OK)), "tpdraft")


class PairError(ValueError):
    """A pair that cannot be used as it is: the message names the file and the field."""


def _json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise PairError(f"{path}: not found") from None
    except json.JSONDecodeError as e:
        raise PairError(f"{path}: not valid JSON ({e})") from None


def tap_layers(drafter_config):
    d = drafter_config.get("dflash_config") or {}
    return d.get("target_layer_ids", drafter_config.get("target_layer_ids"))


class Pair:
    """pair_dir/target (config.json, model.safetensors, tokenizer.model) and pair_dir/<arch>."""

    def __init__(self, pair_dir=PAIR, arch="dflash2"):
        if arch not in DRAFTERS:
            raise PairError(f"drafter '{arch}': expected one of {', '.join(DRAFTERS)}")
        self.dir, self.arch = pair_dir, arch
        self.target_dir = os.path.join(pair_dir, "target")
        self.drafter_dir = os.path.join(pair_dir, arch)
        target_json = os.path.join(self.target_dir, "config.json")
        drafter_json = os.path.join(self.drafter_dir, "config.json")
        self.target_config, self.drafter_config = _json(target_json), _json(drafter_json)
        layers = self.target_config.get("num_hidden_layers")
        if not isinstance(layers, int) or layers < 1:
            raise PairError(f"{target_json}: field 'num_hidden_layers' is {layers!r}, expected a positive integer")
        taps = tap_layers(self.drafter_config)
        if not isinstance(taps, list) or not taps:
            raise PairError(f"{drafter_json}: field 'dflash_config.target_layer_ids' is {taps!r}, expected a list of layers")
        beyond = [t for t in taps if not isinstance(t, int) or not 0 <= t < layers]
        if beyond:
            raise PairError(f"{drafter_json}: field 'dflash_config.target_layer_ids' names layer {beyond[0]!r}, but "
                            f"the target ({target_json}, num_hidden_layers) has layers 0 .. {layers - 1}")
        self.taps = taps
        self.tokenizer = self._tokenizer()

    def _tokenizer(self):
        import sentencepiece
        path = os.path.join(self.target_dir, "tokenizer.model")
        if not os.path.isfile(path):
            raise PairError(f"{path}: the target's tokenizer is missing")
        try:
            sp = sentencepiece.SentencePieceProcessor(model_file=path)
        except (RuntimeError, OSError) as e:
            raise PairError(f"{path}: not a sentencepiece model ({e})") from None
        vocab = self.target_config.get("vocab_size")
        if sp.get_piece_size() != vocab:
            raise PairError(f"{path}: {sp.get_piece_size()} pieces, but {os.path.join(self.target_dir, 'config.json')} "
                            f"field 'vocab_size' is {vocab!r}: the tokenizer is not the target's")
        return sp

    def target(self, dtype=None):
        import torch
        import qwen3_target
        return qwen3_target.Qwen3Target.from_pretrained(self.target_dir, dtype or torch.float32)


def heldout_files(pair_dir=PAIR, stdlib=None):
    """The held-out split's files on this machine that match the manifest's sha256, longest first."""
    import hashlib
    manifest_path = os.path.join(pair_dir, "corpus-manifest.json")
    manifest = _json(manifest_path)
    root = stdlib or sysconfig.get_paths()["stdlib"]
    found = []
    for entry in manifest.get("files", []):
        if entry.get("split") != "heldout":
            continue
        path = os.path.join(root, entry["path"])
        if os.path.isfile(path):
            with open(path, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() == entry["sha256"]:
                    found.append((entry["bytes"], path))
    if not found:
        raise PairError(f"{manifest_path}: none of the held-out files is on this machine as listed "
                        f"(under {root})")
    return [path for _, path in sorted(found, key=lambda x: (-x[0], x[1]))]


def read_source(path):
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError as e:
        raise PairError(f"{path}: cannot read the prompt file ({e.strerror})") from None


def prompts_from(text, tokenizer, count, length, path="the prompt file"):
    """count prompts of `length` tokens cut from text at evenly spaced offsets; each begins at a
    line start, so the target sees whole lines."""
    ids = tokenizer.encode(text)
    if len(ids) < length + 1:
        raise PairError(f"{path}: {len(ids)} tokens, too short for prompts of {length} tokens")
    newline = {i for i in range(tokenizer.get_piece_size()) if tokenizer.id_to_piece(i).startswith("\n")}
    starts = [0] + [i + 1 for i, t in enumerate(ids) if t in newline]
    room = len(ids) - length
    out = []
    for k in range(count):
        want = room * k // max(count - 1, 1) if count > 1 else room // 2
        start = max((s for s in starts if s <= want), default=0)
        out.append(ids[start:start + length])
    return out
