"""tpdraft.Proposer driven as a serving engine drives it (examples/spec_decode.py's Engine): 64
requests at once, arriving at random steps, finishing, preempted and recomputed (every row given
again from position 0, or the session dropped), random acceptance lengths. Greedy output is each
request's own target decode token for token, at tp 1 and 2; every proposal is what a fresh session
given the request's committed rows drafts; sampled output is distributed as the target's (a
chi-square test, which a verifier given a wrong q fails). Then the proposer's own rules: what it
refuses (naming the request), a busy server's rows kept, a lost one leaving empty proposals."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the example's target model needs PyTorch")
import tpdraft  # noqa: E402

from test_spec_decode import (GREEDY, SHORT_PROMPT, SMALL, SMALL_DFLASH2, DRAFT, chi_square,  # noqa: E402
                              init, make_target, normalized, open_drafter, sampled_case)
import qwen3_target  # noqa: E402  (examples/, put on the path by test_spec_decode)
from spec_decode import Engine, Job, make_proposer, target_decode  # noqa: E402

RUNNING, JOBS = 64, 96  # rows of the target's cache (requests running at once), requests in all


def random_jobs(caps, rng, count=JOBS, arrivals=12):
    ordinary = [t for t in range(caps.vocab_size) if t != caps.mask_token_id]
    return [Job(i, [int(t) for t in rng.choice(ordinary, int(rng.integers(2, 12)))], int(rng.integers(6, 40)),
                int(rng.integers(arrivals))) for i in range(count)]


def agreeing_target(tmp_path, caps, target_dir):
    """A target that agrees with the drafter in runs (examples/qwen3_target.py), so that drafts
    are accepted at many lengths; returns (target, the target dir the drafter reads)."""
    agreeing = str(tmp_path / "agreeing")
    qwen3_target.write_agreeing_target(target_dir, agreeing, caps.mask_token_id, token=5)
    target = make_target(caps, agreeing)
    qwen3_target.make_agree(target, token=5, period=13)
    return target, agreeing


class FreshSessionCheck:
    """The reference of every proposal: a fresh session of a second drafter, given the request's
    committed rows from the target's forward over its whole sequence, drafting from its anchor."""

    def __init__(self, target, reference, every=6):
        self.target, self.reference, self.every, self.checked, self.calls = target, reference, every, 0, 0

    def __call__(self, running, proposals):
        self.calls += 1
        if self.calls % self.every:
            return
        layers = self.reference.caps.target_layer_ids
        for job in running:
            got = proposals[job.id]
            if not got.drafted:
                continue
            known = job.prompt + job.tokens[:-1]
            assert len(known) == job.computed
            _, taps = self.target.forward_all([known], layers)
            session = self.reference.open_session()
            want = self.reference.step([{"session": session, "anchor": job.tokens[-1],
                                         "taps": taps[0].astype(np.float32)}])[0]
            self.reference.close_session(session)
            assert got.tokens.tolist() == want["tokens"].tolist(), f"request {job.id} at length {job.computed}"
            self.checked += 1


def run_greedy_engine(target, handle, drafter_dir, jobs, rng, drop, check=None):
    """Every job through the engine over `handle` (a Drafter or Client); preempted requests are
    given every row again from 0, or with `drop` their sessions dropped."""
    with make_proposer(handle, drafter_dir, GREEDY) as proposer:
        engine = Engine(target, proposer, GREEDY, RUNNING, 64 + 40 + handle.caps.block_size, rng, preempt=0.03,
                        drop=drop, cap=True, on_proposals=check)
        got = engine.run(jobs)
        assert proposer.requests == []  # every finished request's session closed
    return got, engine.stats, proposer


def assert_the_targets(target, caps, jobs, got):
    want = target_decode(target, caps.target_layer_ids, [j.prompt for j in jobs], max(j.n_tokens for j in jobs),
                         GREEDY, None)
    for job, tokens in zip(jobs, want):
        assert got[job.id] == tokens[:job.n_tokens], f"request {job.id}"


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
@pytest.mark.parametrize("tp", [1, 2])
def test_an_engines_requests_decode_as_the_target_with_drafts_of_their_own_context(checkpoint, config, tp):
    # A random drafter's drafts depend on every row of its context, so a row settled at the wrong
    # position, twice or not at all shows in the check against a fresh session.
    drafter_dir, target_dir, caps = init(checkpoint, config)
    target = make_target(caps, target_dir)
    rng = np.random.default_rng(tp)
    jobs = random_jobs(caps, rng)
    options = dict(max_sessions=16, max_open_sessions=JOBS, max_context=128)
    with open_drafter(drafter_dir, target_dir, tp=tp, **options) as d, \
            open_drafter(drafter_dir, target_dir, **options) as reference:
        check = FreshSessionCheck(target, reference)
        got, stats, proposer = run_greedy_engine(target, d, drafter_dir, jobs, rng, tp == 2, check)
        # The drafter's sessions were all closed: it can open as many as it may hold again.
        sessions = [d.open_session() for _ in range(JOBS)]
        for s in sessions:
            d.close_session(s)
    assert_the_targets(target, caps, jobs, got)
    print(f"{caps.architecture} tp {tp}: {stats.steps} steps, {proposer.forwards} drafter forwards, "
          f"{stats.preemptions} preemptions, {check.checked} proposals checked")
    assert stats.preemptions >= 5 and check.checked >= 150
    assert proposer.forwards > stats.steps  # steps of more than max_sessions requests were split


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
def test_an_engines_requests_accept_drafts_of_every_length_and_decode_as_the_target(tmp_path, checkpoint, config):
    drafter_dir, target_dir, caps = init(checkpoint, config)
    target, target_dir = agreeing_target(tmp_path, caps, target_dir)
    rng = np.random.default_rng(3)
    jobs = random_jobs(caps, rng)
    with open_drafter(drafter_dir, target_dir, tp=2, max_sessions=16, max_open_sessions=JOBS, max_context=128) as d:
        got, stats, _ = run_greedy_engine(target, d, drafter_dir, jobs, rng, False)
    assert_the_targets(target, caps, jobs, got)
    accepted = np.bincount(stats.accepted, minlength=caps.block_size)
    print(f"{caps.architecture}: acceptance lengths {accepted.tolist()}, {stats.preemptions} preemptions")
    assert (accepted >= 10).all() and stats.preemptions >= 5


@pytest.mark.parametrize("config", [SMALL, SMALL_DFLASH2], ids=["dflash", "dflash2"])
def test_an_engines_sampled_output_is_distributed_as_the_targets(checkpoint, config):
    # 4096 requests of SHORT_PROMPT, 512 at once, each generating 3 tokens through the proposer
    # with preemptions and random acceptance bounds: the pairs (x1, x2) against the target's exact
    # distribution. The same engine verifying with sqrt(q) for q is refused (checked for DFlash).
    drafter_dir, target_dir, caps, target, sampling, want = sampled_case(checkpoint, config)
    results = {}
    with open_drafter(drafter_dir, target_dir, max_sessions=128, max_open_sessions=512, max_context=32) as d:
        verifiers = {"q": None, "sqrt(q)": lambda q: normalized(np.sqrt(q))}
        if config is SMALL_DFLASH2:  # the control once is enough: a wrong q is refused for DFlash
            del verifiers["sqrt(q)"]
        for seed, (name, verify_q) in enumerate(verifiers.items()):
            rng = np.random.default_rng(seed)
            counts = np.zeros((caps.vocab_size, caps.vocab_size))
            with make_proposer(d, drafter_dir, sampling, DRAFT[caps.architecture], seed=seed) as proposer:
                engine = Engine(target, proposer, sampling, 512, 16, rng, preempt=0.05, drop=seed == 0, cap=True,
                                verify_q=verify_q)
                got = engine.run([Job(i, SHORT_PROMPT, 3, i // 256) for i in range(4096)])
            for _, x1, x2 in got.values():
                counts[x1, x2] += 1
            results[name] = chi_square(counts, want)
            print(f"{caps.architecture} {name}: chi2 {results[name][0]:.1f}, dof {results[name][1]}, "
                  f"p {results[name][2]:.3g}, acceptance {np.bincount(engine.stats.accepted).tolist()}, "
                  f"{engine.stats.preemptions} preemptions")
            assert engine.stats.preemptions > 50 and np.mean(np.array(engine.stats.accepted) > 0) > 0.1
    assert results["q"][2] > 1e-3
    assert results.get("sqrt(q)", (0, 0, 0))[2] < 1e-6


# ---- the proposer's own rules -------------------------------------------------------------------


def rows(caps, n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, caps.taps_width)).astype(np.float32)


def fresh_drafts(d, taps, anchor):
    session = d.open_session()
    try:
        return d.step([{"session": session, "anchor": anchor, "taps": taps}])[0]["tokens"].tolist()
    finally:
        d.close_session(session)


@pytest.fixture
def tiny(checkpoint):
    drafter_dir, target_dir, caps = init(checkpoint, "tiny-dflash2.json")
    with open_drafter(drafter_dir, target_dir, max_sessions=2, max_open_sessions=4) as d:
        yield d


def test_what_a_request_gives_wrong_is_refused_naming_it_and_nothing_moves(tiny):
    caps, taps = tiny.caps, rows(tiny.caps, 10)
    with tpdraft.Proposer(tiny) as p:
        p.propose([tpdraft.Request("a", 6, 7, taps[:6])])
        session = p._tracks["a"].session
        cases = [
            ([tpdraft.Request("a", 9, 7, taps[7:9])], "request 'a': its new taps start at position 7, but the drafter "
                                                      "has rows of positions < 6 only"),
            ([tpdraft.Request("b", 3, 7, taps[1:3])], "request 'b' is new to the proposer .* start at 1"),
            ([tpdraft.Request("b", 2, 7, taps[:2]), tpdraft.Request("b", 2, 7)], "request 'b' appears twice"),
            ([tpdraft.Request("b", 2, 7, taps[:3])], "request 'b': 3 tap rows but length 2"),
            ([tpdraft.Request("b", 2, 7, taps[:2, :5])], r"request 'b': taps must be an array of shape \[n, "),
            ([tpdraft.Request("b", -1, 7)], "request 'b': length must be a non-negative integer"),
            ([tpdraft.Request(k, 1, 7, taps[:1]) for k in "bcde"], "4 new requests, but the drafter has room for 3"),
            # Past the proposer's own checks: the drafter's message, with the request named.
            ([tpdraft.Request("a", 6, 7), tpdraft.Request("b", 1, caps.vocab_size, taps[:1])],
             r"request 'b' \(entry 1\): draft: anchor token 257 outside"),
        ]
        for requests, message in cases:
            with pytest.raises(tpdraft.ArgumentError, match=message):
                p.propose(requests)
            assert tiny.session_length(session) == 6 and p.requests == ["a"]
        with pytest.raises(TypeError, match="takes tpdraft.Request items, got dict"):
            p.propose([{"id": "a"}])
        # Still drafting what a fresh session given the same rows drafts.
        got = p.propose([tpdraft.Request("a", 8, 7, taps[6:8])])["a"].tokens.tolist()
        assert got == fresh_drafts(tiny, taps[:8], 7)


class Flaky:
    """A drafter whose steps fail with `error` at the given call numbers (0-based), as a busy or
    lost server's client does: the step is not taken."""

    def __init__(self, drafter, failing, error):
        self.drafter, self.failing, self.error, self.calls = drafter, failing, error, 0
        self.caps = drafter.caps

    def step(self, entries):
        self.calls += 1
        if self.calls - 1 in self.failing:
            raise self.error("the server's queue is full")
        return self.drafter.step(entries)

    def __getattr__(self, name):
        return getattr(self.drafter, name)


def test_rows_of_a_step_a_busy_server_did_not_take_are_sent_with_the_next(tiny):
    # Step 1 (rows 4 .. 5) is not taken; the engine gives rows 6 .. 8 next, having overwritten
    # its buffer of rows 4 .. 5: the drafter still gets rows 4 .. 8, as they were.
    taps = rows(tiny.caps, 9)
    buffer = taps[4:6].copy()
    flaky = Flaky(tiny, {1}, tpdraft.BusyError)
    with tpdraft.Proposer(flaky) as p:
        p.propose([tpdraft.Request("a", 4, 3, taps[:4])])
        busy = p.propose([tpdraft.Request("a", 6, 3, buffer)])["a"]
        assert not busy.drafted and isinstance(p.last_error, tpdraft.BusyError) and p.available
        buffer[:] = 0
        got = p.propose([tpdraft.Request("a", 9, 3, taps[6:9])])["a"]
        assert got.drafted and got.tokens.tolist() == fresh_drafts(tiny, taps[:9], 3)
        # Rows again from position 0, as for a preempted request recomputed: the session rolls back.
        p.propose([tpdraft.Request("a", 2, 3, taps[:2])])
        assert p.propose([tpdraft.Request("a", 5, 3, taps[2:5])])["a"].tokens.tolist() == \
            fresh_drafts(tiny, taps[:5], 3)


def test_a_lost_server_leaves_every_proposal_empty(tiny):
    taps = rows(tiny.caps, 3)
    with tpdraft.Proposer(Flaky(tiny, {1}, tpdraft.UnavailableError)) as p:
        assert p.propose([tpdraft.Request("a", 2, 3, taps[:2])])["a"].drafted
        out = p.propose([tpdraft.Request("a", 3, 3, taps[2:3]), tpdraft.Request("b", 1, 3, taps[:1])])
        assert not p.available and not out["a"].drafted and not out["b"].drafted
        assert not p.propose([tpdraft.Request("c", 0, 3)])["c"].drafted


def test_a_batch_larger_than_max_sessions_is_drafted_in_several_forwards(tiny):
    taps = rows(tiny.caps, 4)
    with tpdraft.Proposer(tiny) as p:
        out = p.propose([tpdraft.Request(i, 1 + i, 9, taps[:1 + i]) for i in range(3)])
        assert p.forwards == 2
        for i in range(3):
            assert out[i].tokens.tolist() == fresh_drafts(tiny, taps[:1 + i], 9)
        p.finish([0, 1, "never seen"])
        assert p.requests == [2]
