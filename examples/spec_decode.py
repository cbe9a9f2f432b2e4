"""Speculative decoding with a tpdraft drafter and a small PyTorch target (qwen3_target.py): each
round the drafter proposes B-1 tokens, the target checks them in one forward (exact match when
greedy, rejection sampling otherwise), so the output is distributed exactly as the target's own.
Prints each round's timings and acceptance, then tokens/s and the mean acceptance length. With
--token-map the drafter drafts over a draft vocabulary: its q is zero outside the map, so a refused
draft's residual max(p - q, 0) gives every other token the target's own probability, and the loop
stays lossless."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
try:
    import tpdraft
except ImportError:  # run from a source tree built into build/
    sys.path.insert(0, os.path.join(REPO, "build", "python"))
    import tpdraft

import qwen3_target  # noqa: E402  (beside this file)

# One round of a sequence whose last committed token, the anchor, sits at position a:
# - The drafter's session holds positions 0 .. held - 1; the tap rows of held .. a - 1 come from
#   the target's previous forward. One library step: keep = held, settle those rows at held,
#   draft d_1 .. d_{B-1} for positions a + 1 .. a + B - 1 from the anchor.
# - The target runs [anchor, d_1 .. d_{B-1}] at positions a .. a + B - 1 in one forward over its
#   KV cache (rows past the committed length are overwritten or masked, never rolled back).
# - m drafts are accepted and the target's own token follows at a + m + 1: the next anchor. The
#   tap rows of a .. a + m (the anchor and the accepted drafts) are committed; they go to the
#   drafter next round. Rows of refused drafts are dropped here and never given to it.
# So keep is always the session's length: the drafter only settles committed positions, and a
# drafted block never enters its context, so a refusal leaves it nothing to roll back. keep below
# the length matters when a session holds positions that are no longer committed: one reused for
# a new continuation of the same prompt (decode's prompt_held), or a target that takes tokens back.


@dataclass(frozen=True)
class Sampling:
    """The target's rule: greedy at temperature 0, else softmax(logits / temperature) over its top_k."""
    temperature: float = 0.0
    top_k: int = 0

    @property
    def greedy(self):
        return self.temperature == 0


def target_probs(logits, sampling):
    """The sampling distribution of each row of logits [..., V] (float64)."""
    z = np.asarray(logits, dtype=np.float64) / sampling.temperature
    if sampling.top_k:
        kth = np.sort(z, axis=-1)[..., -sampling.top_k, None]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def draw(weights, rng):
    """One index drawn with probability proportional to the non-negative weights."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, int(np.flatnonzero(weights)[-1]))


def choose(logits_row, sampling, rng):
    """The target's own next token from one row of logits."""
    if sampling.greedy:
        return int(np.argmax(logits_row))
    return draw(target_probs(logits_row, sampling), rng)


def verify_greedy(logits, drafts):
    """(accepted, next): drafts kept while they equal the target's argmax; next is its argmax after
    them. logits [B, V] are the target's at the anchor and at each draft."""
    best = logits.argmax(axis=-1)
    accepted = next((i for i, (d, b) in enumerate(zip(drafts, best)) if d != b), len(drafts))
    return accepted, int(best[accepted])


def verify_sampled(p, drafts, q, rng):
    """(accepted, next) by rejection sampling: draft i stays with probability min(1, p_i(d)/q_i(d));
    the first refused one is replaced by a draw from max(p_i - q_i, 0), and when all stay the bonus
    is drawn from p_B. p [B, V]: the target's distributions; q [B-1, V]: the drafter's rows."""
    for i, token in enumerate(drafts):
        if rng.random() * q[i, token] < p[i, token]:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        # All zero only when p_i == q_i up to rounding, where a refusal has probability ~0.
        return i, draw(residual if residual.sum() > 0 else p[i], rng)
    return len(drafts), draw(p[-1], rng)


def dense_rows(result, vocab):
    """The drafter's distribution of each draft row as [B-1, V], from what step() returned."""
    if "dist_ids" not in result:
        return result["dist_probs"].astype(np.float64)
    if result["dist_rest"].max() > 1e-6:
        raise RuntimeError(f"the draft distribution leaves mass {result['dist_rest'].max()} outside its listed tokens")
    ids, probs = result["dist_ids"], result["dist_probs"]
    rows = np.zeros((ids.shape[0], vocab))
    listed = ids >= 0
    rows[np.nonzero(listed)[0], ids[listed]] = probs[listed]
    return rows


def selector_top_k(drafter_dir):
    """A DFlash 2 drafter's candidates per row (dflash_config, then the top level of config.json)."""
    with open(os.path.join(drafter_dir, "config.json")) as f:
        config = json.load(f)
    return config.get("dflash_config", {}).get("selector_top_k", config.get("selector_top_k"))


@dataclass
class Sequence:
    """One request: its tokens (prompt, then committed; the last is the anchor) and the drafter's view."""
    tokens: list
    prompt_length: int
    row: int                  # its row in the target's cache
    session: int
    held: int                 # positions the drafter's session holds
    rows: np.ndarray = None   # tap rows of positions held .. anchor - 1, not yet given to the drafter
    rounds: list = field(default_factory=list)  # (drafts, accepted) per round


@dataclass
class RoundReport:
    """One round of every active sequence: accepted drafts each, and where the time went (seconds).
    step: the Python call (d.step); draft, settle and library: what the library reports for it
    (tpdraft_last_step_times: the draft, the roll-back and settle, and the whole call inside the
    library); verify: the target's forward and the acceptance test."""
    accepted: list
    step: float
    draft: float
    settle: float
    library: float
    verify: float


class SpeculativeDecoder:
    """Drives one drafter and one target over a batch of prompts, each in its own session."""

    def __init__(self, target, drafter, drafter_dir, sampling, draft=None, verify_q=None):
        """sampling: the target's rule; draft: the drafter's (default: the target's; a DFlash 2
        drafter draws among its selector's candidates, without top_k)."""
        self.target, self.drafter, self.sampling = target, drafter, sampling
        self.caps = drafter.caps
        self.block = self.caps.block_size
        self.dflash2 = self.caps.architecture == "DFlash2DraftModel"
        self.draft = draft or Sampling(sampling.temperature, 0 if self.dflash2 else sampling.top_k)
        self.dist = self._dist_width(drafter_dir)
        self.verify_q = verify_q or (lambda q: q)  # what the verifier takes for q (tests perturb it)

    def _dist_width(self, drafter_dir):
        """How much of each row's draft distribution to ask for: all of its support."""
        if self.sampling.greedy:
            return 0
        if self.draft.greedy:
            return 1
        if self.dflash2:
            return selector_top_k(drafter_dir)
        return self.draft.top_k or "full"

    def decode(self, prompts, n_tokens, rng, on_round=None, sessions=None, prompt_held=0):
        """n_tokens after each prompt, and each sequence's rounds. `sessions`, when given, are used
        (and left open) instead of new ones; they hold the first `prompt_held` positions of their
        prompt (from an earlier decode of the same prompts, whose continuation the first step's
        keep then rolls back) and are given only the prompt's remaining rows."""
        if prompt_held and not sessions:
            raise ValueError("prompt_held needs the sessions that hold them")
        self.cache = self.target.new_cache(len(prompts), max(map(len, prompts)) + n_tokens + self.block)
        sequences = self._prefill(prompts, rng, sessions, prompt_held)
        while True:
            active = [s for s in sequences if len(s.tokens) - s.prompt_length < n_tokens]
            if not active:
                break
            report = self._round(active, rng)
            if on_round:
                on_round(report, active)
        if sessions is None:
            for s in sequences:
                self.drafter.close_session(s.session)
        return ([s.tokens[s.prompt_length:s.prompt_length + n_tokens] for s in sequences],
                [s.rounds for s in sequences])

    def _prefill(self, prompts, rng, sessions, prompt_held):
        logits, taps = self.target.forward_all(prompts, self.caps.target_layer_ids, self.cache)
        sequences = []
        for i, prompt in enumerate(prompts):
            n = len(prompt)
            anchor = choose(logits[i, n - 1], self.sampling, rng)
            session = sessions[i] if sessions else self.drafter.open_session()
            sequences.append(Sequence(list(prompt) + [anchor], n, i, session, prompt_held,
                                      taps[i, prompt_held:n].astype(np.float32)))
        return sequences

    def _entry(self, s, rng):
        entry = {"session": s.session, "keep": s.held, "anchor": s.tokens[-1], "temperature": self.draft.temperature,
                 "top_k": self.draft.top_k, "seed": 0 if self.draft.greedy else int(rng.integers(2 ** 63)),
                 "dist": self.dist}
        if len(s.rows):
            entry["taps"] = s.rows
        return entry

    def _round(self, active, rng):
        entries = [self._entry(s, rng) for s in active]
        start = time.perf_counter()
        results = self.drafter.step(entries)
        step = time.perf_counter() - start
        times = self.drafter.last_times
        start = time.perf_counter()
        blocks = [[s.tokens[-1]] + r["tokens"].tolist() for s, r in zip(active, results)]
        logits, taps = self.target.forward(blocks, [len(s.tokens) - 1 for s in active], self.cache,
                                           self.caps.target_layer_ids, rows=[s.row for s in active])
        judged = logits if self.sampling.greedy else target_probs(logits, self.sampling)
        accepted = [self._commit(s, r, judged[i], taps[i], rng) for i, (s, r) in enumerate(zip(active, results))]
        return RoundReport(accepted, step, times["draft"], times["settle"], times["total"],
                           time.perf_counter() - start)

    def _commit(self, s, result, judged, taps, rng):
        """Verifies one block and commits its accepted drafts and the target's next token. judged:
        the target's logits (greedy) or distributions at the anchor and each draft; taps: its rows."""
        drafts = result["tokens"].tolist()
        if self.sampling.greedy:
            accepted, following = verify_greedy(judged, drafts)
        else:
            q = self.verify_q(dense_rows(result, self.caps.vocab_size))
            accepted, following = verify_sampled(judged, drafts, q, rng)
        # The anchor and the accepted drafts are committed: their tap rows (from this forward) go
        # to the drafter next round. The session holds positions < anchor after this step.
        s.rows = taps[:accepted + 1].astype(np.float32)
        s.held = len(s.tokens) - 1
        s.tokens += drafts[:accepted] + [following]
        s.rounds.append((drafts, accepted))
        return accepted


def target_decode(target, tap_layers, prompts, n_tokens, sampling, rng):
    """The target alone, one token per forward: the reference a speculative decode must match."""
    cache = target.new_cache(len(prompts), max(map(len, prompts)) + n_tokens)
    logits, _ = target.forward_all(prompts, tap_layers, cache)
    out = [[choose(logits[i, len(p) - 1], sampling, rng)] for i, p in enumerate(prompts)]
    for _ in range(n_tokens - 1):
        starts = [len(p) + len(o) - 1 for p, o in zip(prompts, out)]
        logits, _ = target.forward([[o[-1]] for o in out], starts, cache, tap_layers)
        for i, o in enumerate(out):
            o.append(choose(logits[i, 0], sampling, rng))
    return out


# ---- the command line ---------------------------------------------------------------------------

AGREE_TOKEN = 5


def find_program():
    for path in (os.environ.get("TPDRAFT_BIN"), os.path.join(REPO, "build", "tpdraft")):
        if path and os.access(path, os.X_OK):
            return path
    return "tpdraft"


def checkpoint_dirs(args, scratch):
    """(drafter_dir, target_dir): given, or made by `tpdraft init` from --drafter-config."""
    if args.drafter:
        return args.drafter, args.target
    out = os.path.join(scratch, "checkpoint")
    subprocess.run([find_program(), "init", "--config", args.drafter_config, "--out", out, "--seed", str(args.seed)],
                   check=True, capture_output=True)
    return os.path.join(out, "drafter"), os.path.join(out, "target")


def build_target(args, caps, target_dir, scratch):
    """The target, and the target directory the drafter reads (a modified copy with --agree)."""
    if args.agree:
        agreeing = os.path.join(scratch, "agreeing-target")
        qwen3_target.write_agreeing_target(target_dir, agreeing, caps.mask_token_id, AGREE_TOKEN)
        target_dir = agreeing
    embed, head = qwen3_target.read_target_tables(target_dir)
    target = qwen3_target.Qwen3Target(qwen3_target.config_for(caps), embed, head, seed=args.seed)
    if args.agree:
        qwen3_target.make_agree(target, AGREE_TOKEN)
    return target, target_dir


def print_round(report, active):
    s = active[0]
    outside = report.step - report.draft  # the library outside the draft (settle included), and Python
    print(f"round {len(s.rounds):4d}  pos {len(s.tokens) - s.prompt_length:4d}  draft {report.draft * 1e3:6.3f} ms  "
          f"outside the draft {outside * 1e3:6.3f} ms (settle {report.settle * 1e3:6.3f}, python "
          f"{(report.step - report.library) * 1e3:6.3f})  verify {report.verify * 1e3:6.3f} ms  "
          f"accepted {report.accepted[0]}/{len(s.rounds[-1][0])}")


def run(args, scratch):
    drafter_dir, target_dir = checkpoint_dirs(args, scratch)
    with tpdraft.Drafter(drafter_dir, target_dir, backend="cpu", threads=1) as first:
        caps = first.caps
    target, target_dir = build_target(args, caps, target_dir, scratch)
    drafter = tpdraft.Drafter(drafter_dir, target_dir, backend="cpu", threads=args.threads, tp=args.tp,
                              token_map=args.token_map)
    draft_vocab = drafter.caps.draft_vocab_size
    sampling = Sampling(args.temperature, args.top_k)
    decoder = SpeculativeDecoder(target, drafter, drafter_dir, sampling)
    ordinary = [t for t in range(caps.vocab_size) if t != caps.mask_token_id]
    prompt = [int(t) for t in np.random.default_rng(args.seed).choice(ordinary, 8)]
    reports = []
    start = time.perf_counter()
    tokens, rounds = decoder.decode([prompt], args.tokens, np.random.default_rng(args.seed),
                                    on_round=lambda r, a: (reports.append(r), print_round(r, a)))
    elapsed = time.perf_counter() - start
    accepted = [a for _, a in rounds[0]]
    print(f"{caps.architecture}, B = {caps.block_size}, tp {args.tp}, drafting over {draft_vocab} of "
          f"{caps.vocab_size} tokens: {args.tokens} tokens in {len(accepted)} rounds, "
          f"{args.tokens / elapsed:.1f} tokens/s")
    print(f"mean acceptance length {np.mean(accepted) + 1:.2f} tokens per target forward "
          f"({np.mean(accepted):.2f} drafts accepted of {caps.block_size - 1})")
    print("tokens:", " ".join(map(str, tokens[0])))
    drafter.close()
    if not sampling.greedy:
        return 0
    same = target_decode(target, caps.target_layer_ids, [prompt], args.tokens, sampling, None)[0] == tokens[0]
    print("identical to the target's own greedy decode:", "yes" if same else "NO")
    return 0 if same else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--drafter-config", help="a drafter config: `tpdraft init` makes a checkpoint in a temp dir")
    source.add_argument("--drafter", help="a drafter checkpoint directory (with --target)")
    p.add_argument("--target", help="the target checkpoint directory whose embedding and head the drafter reads")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--agree", action="store_true", help="a target and drafter made to agree (long accepted runs)")
    p.add_argument("--token-map", help="a draft vocabulary: a token map file (a JSON list of target ids, or "
                   "safetensors with an I64 tensor 'token_ids'; `tpdraft vocab` writes one); the drafter drafts "
                   "those ids only")
    args = p.parse_args(argv)
    if args.drafter and not args.target:
        p.error("--drafter needs --target")
    os.environ.setdefault("TPDRAFT_LOG_LEVEL", "warn")  # no load messages between the rounds
    with tempfile.TemporaryDirectory() as scratch:
        return run(args, scratch)


if __name__ == "__main__":
    sys.exit(main())
