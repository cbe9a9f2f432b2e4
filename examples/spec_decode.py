"""Speculative decoding with a tpdraft drafter and a small PyTorch target (qwen3_target.py), as a
serving engine runs it: several requests at once, each step one tpdraft.Proposer call for all of
them (B-1 drafts each) and one target forward that checks every block (exact match when greedy,
rejection sampling with the drafter's q otherwise), so that each request's output is distributed
exactly as the target's own. Prints the target alone beside speculative decoding (tokens/s, target
forwards), the mean acceptance length and the drafter's share of a step. docs/engines.md is the
guide this program runs. With --token-map the drafter drafts over a draft vocabulary: its q is zero
outside the map, so a refused draft's residual max(p - q, 0) gives every other token the target's
own probability, and the loop stays lossless.

SpeculativeDecoder below is the same loop with the library's sessions driven directly (the calls
the Proposer makes for an engine)."""

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
import trained_pair  # noqa: E402
from trained_pair import find_program  # noqa: E402

# One round of a sequence is docs/model.md's speculative round: the drafter's session holds
# positions 0 .. held - 1, and one library step settles the tap rows of held .. a - 1 (from the
# target's previous forward) and drafts from the anchor at a. The drafter only settles committed
# positions (docs/library.md), so keep is always the session's length: a refusal leaves it nothing
# to roll back. keep below the length matters when a session holds positions that are no longer
# committed: one reused for a new continuation of the same prompt (decode's prompt_held), or a
# target that takes tokens back.


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


def judge(judged, drafts, sampling, rng, q_rows):
    """Verifies one block: judged holds the target's logits (greedy) or distributions at the anchor
    and each draft; q_rows() the drafter's distributions (asked only when sampling). Returns the
    accepted drafts' count and the target's next token."""
    if sampling.greedy:
        return verify_greedy(judged[:len(drafts) + 1], drafts)
    if not drafts:
        return 0, draw(judged[0], rng)
    return verify_sampled(judged[:len(drafts) + 1], drafts, q_rows(), rng)


def dense_rows(ids, probs, rest, vocab):
    """The drafter's distribution of each draft row as [B-1, V], from the dist_ids, dist_probs and
    dist_rest of a step's result or a Proposal (ids None: probs are the full rows)."""
    if ids is None:
        return probs.astype(np.float64)
    if rest.max() > 1e-6:
        raise RuntimeError(f"the draft distribution leaves mass {rest.max()} outside its listed tokens")
    rows = np.zeros((ids.shape[0], vocab))
    listed = ids >= 0
    rows[np.nonzero(listed)[0], ids[listed]] = probs[listed]
    return rows


def selector_top_k(drafter_dir):
    """A DFlash 2 drafter's candidates per row (dflash_config, then the top level of config.json)."""
    with open(os.path.join(drafter_dir, "config.json")) as f:
        config = json.load(f)
    return config.get("dflash_config", {}).get("selector_top_k", config.get("selector_top_k"))


def draft_rule(caps, drafter_dir, sampling, draft=None):
    """(the drafter's Sampling, the dist width to ask for) for a target sampling with `sampling`:
    draft defaults to the target's rule (a DFlash 2 drafter draws among its selector's candidates,
    without top_k); the width is all of the draft distribution's support, what rejection sampling
    needs (none when greedy)."""
    dflash2 = caps.architecture == "DFlash2DraftModel"
    draft = draft or Sampling(sampling.temperature, 0 if dflash2 else sampling.top_k)
    if sampling.greedy:
        return draft, 0
    if draft.greedy:
        return draft, 1
    if dflash2:
        return draft, selector_top_k(drafter_dir)
    return draft, draft.top_k or "full"


def make_proposer(drafter, drafter_dir, sampling, draft=None, seed=None):
    """A tpdraft.Proposer over drafter that drafts by draft_rule and returns what verification needs."""
    draft, dist = draft_rule(drafter.caps, drafter_dir, sampling, draft)
    return tpdraft.Proposer(drafter, temperature=draft.temperature, top_k=draft.top_k, dist=dist, seed=seed)


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


class SpeculativeDecoder:
    """Drives one drafter and one target over a batch of prompts, each in its own session."""

    def __init__(self, target, drafter, drafter_dir, sampling, draft=None, verify_q=None):
        """sampling: the target's rule; draft: the drafter's (default: draft_rule's)."""
        self.target, self.drafter, self.sampling = target, drafter, sampling
        self.caps = drafter.caps
        self.block = self.caps.block_size
        self.draft, self.dist = draft_rule(self.caps, drafter_dir, sampling, draft)
        self.verify_q = verify_q or (lambda q: q)  # what the verifier takes for q (tests perturb it)

    def decode(self, prompts, n_tokens, rng, sessions=None, prompt_held=0):
        """n_tokens after each prompt, and each sequence's rounds. `sessions`, when given, are used
        (and left open) instead of new ones; they hold the first `prompt_held` positions of their
        prompt (from an earlier decode of the same prompts, whose continuation the first step's
        keep then rolls back) and are given only the prompt's remaining rows."""
        if prompt_held and not sessions:
            raise ValueError("prompt_held needs the sessions that hold them")
        self.cache = self.target.new_cache(len(prompts), max(map(len, prompts)) + n_tokens + self.block)
        sequences = self._prefill(prompts, rng, sessions, prompt_held)
        while active := [s for s in sequences if len(s.tokens) - s.prompt_length < n_tokens]:
            self._round(active, rng)
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
        results = self.drafter.step([self._entry(s, rng) for s in active])
        blocks = [[s.tokens[-1]] + r["tokens"].tolist() for s, r in zip(active, results)]
        logits, taps = self.target.forward(blocks, [len(s.tokens) - 1 for s in active], self.cache,
                                           self.caps.target_layer_ids, rows=[s.row for s in active])
        judged = logits if self.sampling.greedy else target_probs(logits, self.sampling)
        for i, (s, r) in enumerate(zip(active, results)):
            self._commit(s, r, judged[i], taps[i], rng)

    def _commit(self, s, result, judged, taps, rng):
        """Verifies one block and commits its accepted drafts and the target's next token. judged:
        the target's logits (greedy) or distributions at the anchor and each draft; taps: its rows."""
        drafts = result["tokens"].tolist()
        accepted, following = judge(judged, drafts, self.sampling, rng,
                                    lambda: self.verify_q(dense_rows(result.get("dist_ids"), result["dist_probs"],
                                                                     result.get("dist_rest"), self.caps.vocab_size)))
        # The anchor and the accepted drafts are committed: their tap rows (from this forward) go
        # to the drafter next round. The session holds positions < anchor after this step.
        s.rows = taps[:accepted + 1].astype(np.float32)
        s.held = len(s.tokens) - 1
        s.tokens += drafts[:accepted] + [following]
        s.rounds.append((drafts, accepted))


# ---- an engine's scheduler over tpdraft.Proposer ---------------------------------------------------


@dataclass
class Job:
    """One request of the engine: n_tokens to generate after its prompt, from step `arrival` on."""
    id: int
    prompt: list
    n_tokens: int
    arrival: int = 0
    tokens: list = field(default_factory=list)  # generated so far; the last is the anchor
    row: int = None                             # its row of the target's cache while it runs
    computed: int = 0                           # positions whose target states exist; the anchor sits here
    new_rows: np.ndarray = None                 # their tap rows not yet given to the drafter
    accepted: list = field(default_factory=list)

    @property
    def done(self):
        return len(self.tokens) >= self.n_tokens


@dataclass
class EngineStats:
    steps: int = 0
    forwards: int = 0       # target forwards (prefills not counted)
    preemptions: int = 0
    propose: float = 0.0    # seconds in Proposer.propose
    verify: float = 0.0     # seconds in the target's forward and the acceptance test
    prefill: float = 0.0
    accepted: list = field(default_factory=list)


class Engine:
    """A serving engine's scheduler in miniature, over the PyTorch target and a tpdraft.Proposer.

    Every step: requests whose arrival has come are admitted while the target's cache has a free
    row (prefilled, their first token chosen); every running request gets drafts from one
    propose() call; one target forward checks all of them (the anchor and its drafts, a request
    without drafts padded); each request commits its accepted drafts and the target's next token,
    and its new tap rows go to the drafter next step. Finished requests are named in the next
    propose(). With `preempt`, a running request is preempted with that probability after a step:
    its row is freed, and when readmitted it is recomputed from its prompt and tokens, the drafter
    given every row again from position 0 (or, with `drop`, its session dropped at once). With
    `cap`, each step accepts at most a random number of the drafts that pass, drawn independently
    of them: the output stays the target's, and acceptance lengths vary."""

    def __init__(self, target, proposer, sampling, rows, capacity, rng, preempt=0.0, drop=False, cap=False,
                 verify_q=None, on_proposals=None, tap_layers=None):
        self.target, self.proposer, self.sampling = target, proposer, sampling
        self.layers = tap_layers or proposer.caps.target_layer_ids  # the target layers whose rows it hands over
        self.cache = target.new_cache(rows, capacity)
        self.free = list(range(rows))
        self.rng, self.preempt, self.drop, self.cap = rng, preempt, drop, cap
        self.verify_q = verify_q or (lambda q: q)
        self.on_proposals = on_proposals  # called with (running jobs, proposals) each step (tests check them)
        self.stats = EngineStats()

    def run(self, jobs):
        """Runs every job to the end; returns {id: its n_tokens generated tokens}."""
        waiting = sorted(jobs, key=lambda j: j.arrival)
        running, finished, step = [], [], 0
        while waiting or running:
            self._admit(waiting, running, step)
            if running:
                finished = self._step(running, finished)
                running = [j for j in running if not j.done]
                self._preempt(running, waiting)
            step += 1
        self.proposer.finish(finished)
        self.stats.steps = step
        return {j.id: j.tokens[:j.n_tokens] for j in jobs}

    def _admit(self, waiting, running, step):
        start = time.perf_counter()
        while waiting and self.free and waiting[0].arrival <= step:
            job = waiting.pop(0)
            job.row = self.free.pop()
            known = job.prompt + job.tokens[:-1]  # a preempted job's anchor is its last token
            logits, taps = self.target.forward([known], [0], self.cache, self.layers, rows=[job.row])
            if not job.tokens:
                job.tokens.append(choose(logits[0, -1], self.sampling, self.rng))
            job.computed, job.new_rows = len(known), taps[0].astype(np.float32)
            running.append(job)
        self.stats.prefill += time.perf_counter() - start

    def _step(self, running, finished):
        requests = [tpdraft.Request(j.id, j.computed, j.tokens[-1], j.new_rows) for j in running]
        start = time.perf_counter()
        proposals = self.proposer.propose(requests, finished=finished)
        self.stats.propose += time.perf_counter() - start
        if self.on_proposals:
            self.on_proposals(running, proposals)
        start = time.perf_counter()
        width = self.proposer.caps.block_size
        blocks = []
        for j in running:
            drafts = proposals[j.id].tokens.tolist()
            blocks.append([j.tokens[-1]] + drafts + [j.tokens[-1]] * (width - 1 - len(drafts)))
        logits, taps = self.target.forward(blocks, [j.computed for j in running], self.cache, self.layers,
                                           rows=[j.row for j in running])
        judged = logits if self.sampling.greedy else target_probs(logits, self.sampling)
        done = []
        for i, j in enumerate(running):
            self._commit(j, proposals[j.id], judged[i], taps[i])
            if j.done:
                done.append(j.id)
                self.free.append(j.row)
        self.stats.forwards += 1
        self.stats.verify += time.perf_counter() - start
        return done

    def _commit(self, job, proposal, judged, taps):
        drafts = proposal.tokens.tolist()
        if self.cap and drafts:  # a bound drawn before looking at the drafts
            drafts = drafts[:int(self.rng.integers(len(drafts) + 1))]
        accepted, following = judge(judged, drafts, self.sampling, self.rng,
                                    lambda: self.verify_q(dense_rows(proposal.dist_ids, proposal.dist_probs,
                                                                     proposal.dist_rest, judged.shape[-1])))
        job.tokens += drafts[:accepted] + [following]
        job.new_rows = taps[:accepted + 1].astype(np.float32)
        job.computed += accepted + 1
        job.accepted.append(accepted)
        self.stats.accepted.append(accepted)

    def _preempt(self, running, waiting):
        if not self.preempt:
            return
        for job in [j for j in running if self.rng.random() < self.preempt]:
            running.remove(job)
            self.free.append(job.row)
            job.row, job.computed, job.new_rows = None, 0, None
            waiting.insert(0, job)
            self.stats.preemptions += 1
            if self.drop:
                self.proposer.drop([job.id])


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


def random_prompts(caps, count, seed):
    ordinary = [t for t in range(caps.vocab_size) if t != caps.mask_token_id]
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.choice(ordinary, int(rng.integers(4, 13)))] for _ in range(count)]


def print_table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


class Served:
    """`tpdraft serve` of the drafter for this run (--serve), on an ipc socket in `scratch`, and a
    Client of it; stopped with SIGTERM at the end."""

    def __init__(self, args, drafter_dir, target_dir, requests, scratch):
        address_file = os.path.join(scratch, "serve.address")
        self.log_path = os.path.join(scratch, "serve.log")
        cmd = [find_program(), "serve", "--drafter", drafter_dir, "--target", target_dir, "--backend", "cpu",
               "--listen", "ipc://" + os.path.join(scratch, "serve.sock"), "--address-file", address_file,
               "--threads", str(args.threads), "--tp", str(args.tp), "--max-sessions", str(min(requests, 64)),
               "--max-open-sessions", str(max(requests, 8))]
        for flag, value in (("--quant", args.quant), ("--token-map", args.token_map), ("--kv-dtype", args.kv_dtype)):
            if value:
                cmd += [flag, value]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not (os.path.exists(address_file) and open(address_file).read().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"tpdraft serve did not start:\n{open(self.log_path).read()}")
            time.sleep(0.02)
        self.client = tpdraft.Client(open(address_file).read().split()[0], timeout=60.0)

    def close(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def open_drafter(args, drafter_dir, target_dir, scratch):
    """(the drafter the Proposer drives, what to close after): in process, or served (--serve)."""
    if args.serve:
        served = Served(args, drafter_dir, target_dir, args.requests, scratch)
        return served.client, served
    drafter = tpdraft.Drafter(drafter_dir, target_dir, backend="cpu", threads=args.threads, tp=args.tp,
                              token_map=args.token_map, quant=args.quant, kv_dtype=args.kv_dtype,
                              max_sessions=min(args.requests, 64), max_open_sessions=args.requests)
    return drafter, drafter


def setup(args, scratch):
    """(caps, target, prompts, drafter dir, target dir, tap layers the target hands over, tokenizer)."""
    if args.drafter or args.drafter_config:
        drafter_dir, target_dir = checkpoint_dirs(args, scratch)
        with tpdraft.Drafter(drafter_dir, target_dir, backend="cpu", threads=1) as first:
            caps = first.caps
        target, target_dir = build_target(args, caps, target_dir, scratch)
        return caps, target, random_prompts(caps, args.requests, args.seed), drafter_dir, target_dir, \
            list(caps.target_layer_ids), None
    import torch
    pair = trained_pair.Pair(args.pair, args.arch)
    target = pair.target(torch.float64 if args.target_dtype == "f64" else torch.float32)
    path = args.prompt_file or trained_pair.heldout_files(args.pair)[0]
    prompts = trained_pair.prompts_from(trained_pair.read_source(path), pair.tokenizer, args.requests,
                                        args.prompt_tokens, path)
    layers = [t + args.tap_shift for t in pair.taps]
    if not all(0 <= t < target.config.layers for t in layers):
        raise trained_pair.PairError(f"--tap-shift {args.tap_shift}: the taps {layers} leave the target's "
                                     f"{target.config.layers} layers")
    with tpdraft.Drafter(pair.drafter_dir, pair.target_dir, backend="cpu", threads=1) as first:
        caps = first.caps
    return caps, target, prompts, pair.drafter_dir, pair.target_dir, layers, pair.tokenizer


def measure(args, scratch):
    """Runs the target alone and speculative decoding on the same prompts; returns the report."""
    caps, target, prompts, drafter_dir, target_dir, layers, tokenizer = setup(args, scratch)
    sampling = Sampling(args.temperature, args.top_k)
    target_decode(target, layers, prompts[:1], 2, sampling, np.random.default_rng(args.seed))  # warm-up
    start = time.perf_counter()
    want = target_decode(target, layers, prompts, args.tokens, sampling, np.random.default_rng(args.seed))
    alone = time.perf_counter() - start

    drafter, closing = open_drafter(args, drafter_dir, target_dir, scratch)
    try:
        with make_proposer(drafter, drafter_dir, sampling, seed=args.seed) as proposer:
            engine = Engine(target, proposer, sampling, args.requests,
                            max(map(len, prompts)) + args.tokens + caps.block_size, np.random.default_rng(args.seed),
                            tap_layers=layers)
            start = time.perf_counter()
            got = engine.run([Job(i, p, args.tokens) for i, p in enumerate(prompts)])
            speculative = time.perf_counter() - start
            forwards = proposer.forwards
        draft_vocab = drafter.caps.draft_vocab_size
    finally:
        closing.close()

    stats, generated = engine.stats, args.requests * args.tokens
    accepted = np.array(stats.accepted)
    block = caps.block_size
    report = {
        "architecture": caps.architecture, "block_size": block, "tp": args.tp, "requests": args.requests,
        "tokens": args.tokens, "prompt_tokens": len(prompts[0]), "temperature": args.temperature,
        "quant": args.quant, "token_map": args.token_map, "draft_vocab": draft_vocab, "vocab": caps.vocab_size, "kv_dtype": args.kv_dtype or "f32",
        "served": args.serve, "tap_layers": layers, "threads": args.threads,
        "tau": float(accepted.mean() + 1),
        "accept_rate": [float((accepted >= i).mean()) for i in range(1, block)],
        "accepted_counts": np.bincount(accepted, minlength=block).tolist(),  # blocks by drafts accepted, 0 .. B-1
        "target_tokens_per_s": generated / alone, "spec_tokens_per_s": generated / speculative,
        "speedup": alone / speculative, "target_seconds": alone, "spec_seconds": speculative,
        "target_forwards": stats.forwards, "drafter_forwards": forwards,
        "draft_share": stats.propose / (stats.propose + stats.verify),
        "draft_ms": stats.propose / max(forwards, 1) * 1e3, "verify_ms": stats.verify / max(stats.forwards, 1) * 1e3,
        "identical": all(got[i] == want[i] for i in range(len(prompts))) if sampling.greedy else None,
    }
    if tokenizer is not None:
        report["sample"] = {"prompt_tail": tokenizer.decode(prompts[0][-24:]), "output": tokenizer.decode(got[0])}
    return report


def print_report(r):
    print(f"{r['architecture']}, B = {r['block_size']}, tp {r['tp']}, drafting over {r['draft_vocab']} of "
          f"{r['vocab']} tokens"
          f"{' (served)' if r['served'] else ''}: {r['requests']} requests of {r['tokens']} tokens")
    print_table([("decoding", "tokens/s", "target forwards after the prefill", "seconds"),
                 ("target alone", f"{r['target_tokens_per_s']:.1f}", r["tokens"] - 1, f"{r['target_seconds']:.3f}"),
                 ("speculative", f"{r['spec_tokens_per_s']:.1f}", r["target_forwards"], f"{r['spec_seconds']:.3f}")])
    print(f"mean acceptance length {r['tau']:.2f} tokens per target forward ({r['tau'] - 1:.2f} drafts accepted "
          f"of {r['block_size'] - 1}); speed-up {r['speedup']:.2f}x")
    print("acceptance lengths " + " ".join(f"{m}:{c}" for m, c in enumerate(r["accepted_counts"])))
    print("accepted at block position " + " ".join(f"{i}:{a:.2f}" for i, a in enumerate(r["accept_rate"], 1)))
    print(f"draft share of the step {r['draft_share']:.1%} ({r['draft_ms']:.3f} ms a drafter forward, "
          f"{r['drafter_forwards']} forwards; the target's verify {r['verify_ms']:.3f} ms a step)")
    if r["identical"] is not None:
        print("identical to the target's own greedy decode:", "yes" if r["identical"] else "NO")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = p.add_mutually_exclusive_group()
    source.add_argument("--pair", help="a trained pair directory (target/, dflash/, dflash2/; default: pair/, the "
                        "shipped one): prompts cut from --prompt-file, tokenized with the target's tokenizer")
    source.add_argument("--drafter-config", help="a drafter config: `tpdraft init` makes a random checkpoint in a temp "
                        "dir and a random-layer target around its tables")
    source.add_argument("--drafter", help="a drafter checkpoint directory (with --target), random target layers")
    p.add_argument("--target", help="the target checkpoint directory whose embedding and head the drafter reads")
    p.add_argument("--arch", choices=("dflash2", "dflash"), default="dflash2", help="the pair's drafter")
    p.add_argument("--prompt-file", help="the text prompts are cut from (default: the longest held-out file of "
                   "the pair's corpus manifest)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="tokens in each prompt (pair)")
    p.add_argument("--target-dtype", choices=("f32", "f64"), default="f32", help="the pair's target arithmetic")
    p.add_argument("--tap-shift", type=int, default=0, help="hand the drafter the taps of layers shifted by this "
                   "(a taps off-by-one, to see what it costs)")
    p.add_argument("--tokens", type=int, default=200, help="tokens each request generates")
    p.add_argument("--requests", type=int, default=8, help="requests decoded at once")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--agree", action="store_true", help="a target and drafter made to agree (long accepted runs)")
    p.add_argument("--token-map", help="a draft vocabulary: a token map file (a JSON list of target ids, or "
                   "safetensors with an I64 tensor 'token_ids'; `tpdraft vocab` writes one); the drafter drafts "
                   "those ids only")
    p.add_argument("--quant", choices=[f"{b}{a}{h}" for h in ("", "+head") for a in ("", "a8", "a16") for b in ("q8", "q4")],
                   help="quantize the drafter while it loads (a8 / a16: int8 or float activations; docs/quantization.md)")
    p.add_argument("--kv-dtype", choices=("f32", "bf16"), help="the drafter's context cache element type")
    p.add_argument("--serve", action="store_true", help="draft through `tpdraft serve` (started for the run)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.drafter and not args.target:
        p.error("--drafter needs --target")
    if args.requests < 1 or args.tokens < 1 or args.prompt_tokens < 1:
        p.error("--requests, --tokens and --prompt-tokens must be at least 1")
    if args.agree and not (args.drafter or args.drafter_config):
        p.error("--agree rigs a random target: it needs --drafter or --drafter-config")
    if args.temperature < 0:
        p.error("--temperature must be at least 0")
    args.pair = args.pair or os.path.join(REPO, "pair")
    os.environ.setdefault("TPDRAFT_LOG_LEVEL", "warn")  # no load messages between the rounds
    try:
        with tempfile.TemporaryDirectory() as scratch:
            report = measure(args, scratch)
    except ValueError as e:  # a pair, file or option refused: one line naming it
        print(f"spec_decode.py: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0 if report["identical"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
