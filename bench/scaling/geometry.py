"""Drafter geometry, the bytes each rank holds, the work of a draft and its collectives, as
`tpdraft info --json` computes them (src/model/cost.cpp, src/model/shard_plan.cpp): these
scripts ask the program instead of counting again. Info runs it once per question and keeps
the answers; the functions below read one answer."""

import json
import os
import subprocess
from collections import namedtuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BIN = os.path.join(REPO, "build", "tpdraft")

Work = namedtuple("Work", "flops weight_bytes context_bytes")


class NotShardable(Exception):
    """tp cannot shard the geometry; the message is the shard plan's reason."""


class Info:
    """Answers of `tpdraft info --config FILE --json`, cached per (config, tp, sessions, context, dtype,
    quant, draft_vocab): quant is a --quant preset ("q8", "q4+head", ...) or "" for the weights as they
    are; draft_vocab N > 0 counts the head as a draft vocabulary of N ids (--token-map-size N)."""

    def __init__(self, binary=None):
        self.binary = binary or os.environ.get("TPDRAFT_BIN") or DEFAULT_BIN
        self._answers = {}

    def query(self, config, tp, sessions=1, context=1024, dtype="bf16", quant="", draft_vocab=0):
        """The info object of `config` at tp ranks; raises NotShardable when tp cannot shard it."""
        key = (os.path.abspath(config), tp, sessions, context, info_dtype(dtype), quant, draft_vocab)
        if key not in self._answers:
            self._answers[key] = self._ask(*key)
        answer = self._answers[key]
        if isinstance(answer, NotShardable):
            raise answer
        return answer

    def problem(self, config, tp):
        """Why tp cannot shard the config, or None when it can."""
        try:
            self.query(config, tp)
            return None
        except NotShardable as e:
            return str(e)

    def _ask(self, config, tp, sessions, context, dtype, quant, draft_vocab):
        if not os.access(self.binary, os.X_OK):
            raise SystemExit(f"{self.binary} is not built: cmake --build build --target tpdraft_cli (or pass --bin)")
        args = [self.binary, "info", "--config", config, "--tp", str(tp), "--sessions", str(sessions),
                "--ctx", str(context), "--dtype", dtype, "--json"] + (["--quant", quant] if quant else [])
        args += ["--token-map-size", str(draft_vocab)] if draft_vocab else []
        res = subprocess.run(args, capture_output=True, text=True)
        if res.returncode == 0:
            return json.loads(res.stdout.strip().splitlines()[-1])
        reason = error_text(res.stderr)
        if f"tp = {tp}" in reason:
            return NotShardable(reason)
        raise SystemExit(f"{' '.join(args)} failed: {reason}")


def error_text(stderr):
    """The message of the program's last error line, without its log prefix."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "no message"
    return lines[-1].split("[error] ", 1)[-1]


def info_dtype(name):
    """The --dtype spelling of a record's or a parameter's dtype (BF16, bf16, 2 bytes...)."""
    text = str(name).lower()
    return {"bf16": "bf16", "f16": "f16", "f32": "f32", "2": "bf16", "4": "f32"}.get(text, "bf16")


def config_name(path):
    return os.path.splitext(os.path.basename(path))[0]


def resolve_config(path):
    """A config path as given, relative to the repository, or by its name in configs/ or
    bench/scaling/ (records written on another machine keep that machine's paths)."""
    name = os.path.basename(path)
    for cand in (path, os.path.join(REPO, path), os.path.join(REPO, "configs", name),
                 os.path.join(REPO, "bench", "scaling", name)):
        if os.path.isfile(cand):
            return cand
    raise SystemExit(f"config '{path}' not found (as given, in the repository, or in configs/)")


def write_vocab_configs(base, vocabs, out_dir):
    """BASE with only vocab_size changed, one file per size in out_dir: [(vocab, path)]."""
    with open(base) as f:
        cfg = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    out = []
    for v in vocabs:
        c = json.loads(json.dumps(cfg))
        c["vocab_size"] = v
        # The MASK id must stay a valid token of the smaller vocabularies.
        for holder in (c, c.get("dflash_config", {})):
            if "mask_token_id" in holder and holder["mask_token_id"] >= v:
                holder["mask_token_id"] = v - 1
        path = os.path.join(out_dir, f"{config_name(base)}-v{v}.json")
        with open(path, "w") as f:
            json.dump(c, f, indent=1)
        out.append((v, path))
    return out


# ---- reading one answer ------------------------------------------------------------------------


def rank(answer):
    """Rank 0 of an answer: it holds the widest vocabulary slice, so it bounds the step."""
    return answer["ranks"][0]


def block(answer):
    return answer["geometry"]["block"]


def vocab(answer):
    """V, the target's vocabulary (an answer without the field: none known, 0)."""
    return answer["geometry"].get("vocab", 0)


def draft_rows(answer):
    """Draft rows of one draft: sessions x (B - 1)."""
    return answer["sessions"] * (block(answer) - 1)


def candidates(answer):
    """Candidates per draft row in the head's exchange: k_top for DFlash 2, 1 for DFlash."""
    return answer["geometry"]["selector_top_k"] if answer["dflash2"] else 1


def collectives(answer, mode="greedy"):
    """[(op, calls, bytes per call)] of one draft on rank 0; mode: greedy, sampled or
    greedy_gather_logits. One rank's calls are identities: they cost nothing in the comm model."""
    return sorted((op, c["calls"], c["bytes"] / c["calls"])
                  for op, c in rank(answer)["collectives"][mode].items() if c["calls"])


def work(answer):
    d = rank(answer)["draft"]
    return Work(d["flops"], d["weight_bytes"], d["context_bytes"])


# Bytes of one cached K or V element: the f32 cache the program holds by default, and --kv-dtype bf16.
KV_ELEMENT_BYTES = {"f32": 4, "bf16": 2}

Attention = namedtuple("Attention", "kv_heads q_heads kv_bytes flops")


def attention(answer, kv_element_bytes=KV_ELEMENT_BYTES["f32"]):
    """Rank 0's share of the attention of one draft at the answer's context: the kv and q heads its
    plan holds, the K/V bytes it reads and the attention FLOPs (scores and weighted sum) it does.
    Each rank holds Nk / tp kv heads, or one (replicated: tp / Nk ranks share it) when tp > Nk,
    so its K/V bytes are 1/tp of the whole up to tp = Nk and then stay at 1/Nk; its q heads are
    always Nq / tp, and so its attention FLOPs are 1/tp of the whole. Per layer a row sees the context (at most the
    window in a sliding layer) and the block: K/V bytes = sessions x keys x 2 x kv heads x
    head_dim x element bytes; FLOPs = 2 x 2 x sessions x B x q heads x head_dim x (keys + B)."""
    g, plan = answer["geometry"], rank(answer)["plan"]
    kv_heads, q_heads = plan["kv_heads"][1] - plan["kv_heads"][0], plan["q_heads"][1] - plan["q_heads"][0]
    sessions, ctx, b, d = answer["sessions"], answer["context"], g["block"], g["head_dim"]
    kv_bytes = flops = 0
    for sliding in g["sliding"][:g["layers"]]:
        keys = min(ctx, g["window"]) if sliding else ctx
        kv_bytes += sessions * keys * 2 * kv_heads * d * kv_element_bytes
        flops += 2 * 2 * sessions * b * q_heads * d * (keys + b)
    return Attention(kv_heads, q_heads, kv_bytes, flops)


def total_bytes(w):
    return w.weight_bytes + w.context_bytes


def head_bytes(answer):
    return rank(answer)["bytes"]["head"]


def candidates_block(answer):
    """Bytes one rank sends in the candidate exchange of a greedy draft (its only all-gather)."""
    return rank(answer)["collectives"]["greedy"]["all_gather"]["bytes"]


def full_logits_block(answer):
    """Bytes one rank sends in the full-logits all-gather: the gather_logits draft's all-gather
    bytes beyond the greedy draft's."""
    return rank(answer)["collectives"]["greedy_gather_logits"]["all_gather"]["bytes"] - candidates_block(answer)
