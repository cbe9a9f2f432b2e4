"""examples/spec_decode.py against its target alone: greedy output token for token (DFlash and
DFlash 2, tp 1 and 2, a random and an agreeing drafter), and sampled output distributed as the
target's own by a chi-square test on a small vocabulary, which the same loop fails with a wrong q;
both again with a drafter over a draft vocabulary (a token map, a speculators checkpoint's own)."""

import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the example's target model needs PyTorch")
import tpdraft  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import qwen3_target  # noqa: E402
import spec_decode  # noqa: E402
from spec_decode import Sampling, SpeculativeDecoder, target_decode  # noqa: E402

GREEDY = Sampling()
PROMPT = [11, 3, 7, 2, 9, 4]


def init(checkpoint, config, **options):
    """`tpdraft init` of config (a file of configs/ or a dict) by the checkpoint fixture, with its
    options (layout, draft_vocab, ...) -> (drafter_dir, target_dir, the drafter's caps)."""
    out = checkpoint(config, seed=5, **options)
    drafter_dir, target_dir = str(out / "drafter"), str(out / "target")
    with open_drafter(drafter_dir, target_dir) as d:
        return drafter_dir, target_dir, d.caps


def open_drafter(drafter_dir, target_dir, **options):
    return tpdraft.Drafter(drafter_dir, target_dir, backend="cpu", threads=1, **options)


def make_target(caps, target_dir):
    embed, head = qwen3_target.read_target_tables(target_dir)
    return qwen3_target.Qwen3Target(qwen3_target.config_for(caps), embed, head, seed=1)


def test_the_cached_target_equals_a_fresh_forward(checkpoint):
    # Prefill, a block whose last rows are then refused, and a block over them: every logit and
    # tap as a forward over the committed sequence from scratch gives them.
    drafter_dir, target_dir, caps = init(checkpoint, "tiny-dflash2.json")
    target = make_target(caps, target_dir)
    layers = caps.target_layer_ids
    cache = target.new_cache(1, 32)
    target.forward([PROMPT], [0], cache, layers)
    target.forward([[1, 2, 3, 4]], [6], cache, layers)  # positions 6..9; 8 and 9 refused below
    logits, taps = target.forward([[5, 6, 7]], [8], cache, layers)
    whole_logits, whole_taps = target.forward_all([PROMPT + [1, 2, 5, 6, 7]], layers)
    np.testing.assert_allclose(logits[0], whole_logits[0, 8:], rtol=0, atol=1e-12)
    np.testing.assert_allclose(taps[0], whole_taps[0, 8:], rtol=0, atol=1e-12)
    assert taps.shape == (1, 3, caps.taps_width)


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
def test_greedy_output_is_the_targets_and_tp_2_decodes_as_tp_1(checkpoint, config):
    drafter_dir, target_dir, caps = init(checkpoint, config)
    target = make_target(caps, target_dir)
    want = target_decode(target, caps.target_layer_ids, [PROMPT], 200, GREEDY, None)[0]
    sampled = Sampling(temperature=1.0, top_k=20)
    runs = []
    for tp in (1, 2):
        with open_drafter(drafter_dir, target_dir, tp=tp) as d:
            got, rounds = SpeculativeDecoder(target, d, drafter_dir, GREEDY).decode([PROMPT], 200, None)
            assert got[0] == want
            assert all(len(drafts) == caps.block_size - 1 for drafts, _ in rounds[0])
            seeded = SpeculativeDecoder(target, d, drafter_dir, sampled).decode([PROMPT], 48, np.random.default_rng(7))
        runs.append((rounds, seeded))
    # Drafts, their distributions and so the seeded sampled output are the same on any number of ranks.
    assert runs[0] == runs[1]


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
def test_a_session_reused_for_the_same_prompt_is_rolled_back_to_it(checkpoint, config):
    # The second decode gives the session only keep = len(PROMPT): the first continuation is
    # rolled back, and the drafter sees the context it saw the first time, so every round drafts
    # alike (a session keeping that continuation would draft from other positions).
    drafter_dir, target_dir, caps = init(checkpoint, config)
    target = make_target(caps, target_dir)
    with open_drafter(drafter_dir, target_dir) as d:
        decoder = SpeculativeDecoder(target, d, drafter_dir, GREEDY)
        session = d.open_session()
        first, rounds = decoder.decode([PROMPT], 8, None, sessions=[session])
        assert d.session_length(session) > len(PROMPT) and len(rounds[0]) > 3
        again, rounds_again = decoder.decode([PROMPT], 8, None, sessions=[session], prompt_held=len(PROMPT))
        assert again == first and rounds_again == rounds
        if caps.architecture == "DFlash2DraftModel":
            # Its sliding layers keep W + B positions: a roll-back further than that is refused
            # and leaves the session as it was.
            decoder.decode([PROMPT], 40, None, sessions=[session], prompt_held=len(PROMPT))
            held = d.session_length(session)
            with pytest.raises(tpdraft.ArgumentError, match="cannot roll back to length 6"):
                decoder.decode([PROMPT], 8, None, sessions=[session], prompt_held=len(PROMPT))
            assert d.session_length(session) == held


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
def test_an_agreeing_drafter_is_accepted_in_runs_and_refused_at_the_period(tmp_path, checkpoint, config):
    drafter_dir, target_dir, caps = init(checkpoint, config)
    agreeing_dir = str(tmp_path / "agreeing")
    qwen3_target.write_agreeing_target(target_dir, agreeing_dir, caps.mask_token_id, token=5)
    target = make_target(caps, agreeing_dir)
    qwen3_target.make_agree(target, token=5, period=13)
    b, n = caps.block_size, 256
    want = target_decode(target, caps.target_layer_ids, [PROMPT], n + b, GREEDY, None)[0]
    # The target takes 5 except at positions that are multiples of 13.
    assert all(t == 5 for i, t in enumerate(want) if (len(PROMPT) + i) % 13)
    with open_drafter(drafter_dir, agreeing_dir) as d:
        got, rounds = SpeculativeDecoder(target, d, drafter_dir, GREEDY).decode([PROMPT], n, None)
    assert got[0] == want[:n]
    # Every draft is 5, so a round from the anchor at position a accepts the run of 5s the target
    # makes at a + 1 ... a + B - 1, and the next round starts past the target's own token.
    anchor = len(PROMPT)
    for drafts, accepted in rounds[0]:
        assert drafts == [5] * (b - 1)
        ahead = want[anchor + 1 - len(PROMPT):anchor + b - len(PROMPT)]
        assert accepted == next((i for i, t in enumerate(ahead) if t != 5), b - 1)
        anchor += accepted + 1
    accepted = [m for _, m in rounds[0]]
    assert accepted.count(b - 1) >= 10 and any(0 < m < b - 1 for m in accepted)


def test_the_example_with_agree_accepts_long_runs_and_matches_the_target(capsys):
    config = os.path.join(spec_decode.REPO, "configs", "tiny-dflash2.json")
    assert spec_decode.main(["--drafter-config", config, "--tokens", "60", "--agree", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "identical to the target's own greedy decode: yes" in out
    mean = float(out.split("mean acceptance length ")[1].split()[0])
    assert mean > 4 and whole_blocks_accepted(out) >= 4


def whole_blocks_accepted(out):
    """How many target forwards accepted all 7 drafts, from the example's "acceptance lengths" line."""
    counts = dict(item.split(":") for item in out.split("acceptance lengths ")[1].split("\n")[0].split())
    return int(counts["7"])


# Small drafters for the sampling test: 16 tokens, so the target's distribution of two tokens
# can be enumerated.
SMALL = {"architectures": ["DFlashDraftModel"], "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 48, "vocab_size": 16, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "dflash_config": {"block_size": 4, "target_layer_ids": [0, 1], "mask_token_id": 15}}
SMALL_DFLASH2 = dict(SMALL, architectures=["DFlash2DraftModel"],
                     dflash_config=dict(SMALL["dflash_config"], conv_kernel_size=2, conv_group_size=16,
                                        selector_rank=4, selector_top_k=6))
RUNS, BATCH, SHORT_PROMPT = 4096, 512, [11, 3, 7]
# The drafters draw at a lower temperature than the target, so that q is far from flat and a
# verifier taking sqrt(q) for it errs visibly.
DRAFT = {"DFlashDraftModel": Sampling(0.5, top_k=8), "DFlash2DraftModel": Sampling(0.5),
         "DFlashSpeculator": Sampling(0.5, top_k=8)}  # a DFlash drafter in the speculators format


def exact_pair_distribution(target, tap_layers, sampling):
    """P(x1, x2) of the target's own sampling, the two tokens after the first one it samples
    from the prompt, by enumerating that first token and the next."""
    v, n = target.config.vocab, len(SHORT_PROMPT)
    logits, _ = target.forward_all([SHORT_PROMPT + [x0, x1] for x0 in range(v) for x1 in range(v)], tap_layers)
    p = spec_decode.target_probs(logits, sampling)
    first, second, third = p[0, n - 1], p[::v, n], p[:, n + 1].reshape(v, v, v)
    return np.einsum("a,ab,abc->bc", first, second, third)


def sampled_pair_counts(decoder, seed, runs=RUNS, batch=BATCH):
    """Counts of (x1, x2) over `runs` speculative decodes of three tokens from SHORT_PROMPT,
    `batch` at a time, and the drafts accepted in the first round of each."""
    v = decoder.caps.vocab_size
    rng = np.random.default_rng(seed)
    counts, accepted = np.zeros((v, v)), []
    for _ in range(runs // batch):
        tokens, rounds = decoder.decode([SHORT_PROMPT] * batch, 3, rng)
        for (_, x1, x2), first_round in zip(tokens, rounds):
            counts[x1, x2] += 1
            accepted.append(first_round[0][1])
    return counts, np.array(accepted)


def chi_square(counts, probs):
    """(statistic, degrees of freedom, p-value); cells expecting fewer than 5 are pooled."""
    assert counts[probs == 0].sum() == 0, "a pair the target never makes"
    expected = counts.sum() * probs
    big, small = expected >= 5, (expected < 5) & (probs > 0)
    observed, wanted = counts[big], expected[big]
    if small.any():
        observed, wanted = np.append(observed, counts[small].sum()), np.append(wanted, expected[small].sum())
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    dof = len(observed) - 1
    return statistic, dof, float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(statistic / 2)))


def normalized(rows):
    rows = np.asarray(rows, dtype=np.float64)
    return rows / rows.sum(axis=-1, keepdims=True)


def sampled_case(checkpoint, config):
    """(drafter_dir, target_dir, caps, target, the target's sampling, its exact distribution of the
    pairs (x1, x2) after SHORT_PROMPT) of a small drafter config."""
    drafter_dir, target_dir, caps = init(checkpoint, config)
    target = make_target(caps, target_dir)
    sampling = Sampling(temperature=1.0, top_k=12)
    return drafter_dir, target_dir, caps, target, sampling, exact_pair_distribution(target, caps.target_layer_ids,
                                                                                    sampling)


@pytest.mark.parametrize("config", [SMALL, SMALL_DFLASH2], ids=["dflash", "dflash2"])
def test_sampled_output_is_distributed_as_the_targets(checkpoint, config):
    drafter_dir, target_dir, caps, target, sampling, want = sampled_case(checkpoint, config)
    verifiers = {"q": None, "sqrt(q)": lambda q: normalized(np.sqrt(q)), "uniform": lambda q: normalized(q > 0)}
    results = {}
    with open_drafter(drafter_dir, target_dir, max_sessions=BATCH, max_open_sessions=BATCH, max_context=32) as d:
        for seed, (name, verify_q) in enumerate(verifiers.items()):
            decoder = SpeculativeDecoder(target, d, drafter_dir, sampling, DRAFT[caps.architecture], verify_q)
            counts, accepted = sampled_pair_counts(decoder, seed)
            results[name] = chi_square(counts, want)
            print(f"{caps.architecture} {name}: chi2 {results[name][0]:.1f}, dof {results[name][1]}, "
                  f"p {results[name][2]:.3g}, first-round acceptance {np.bincount(accepted).tolist()}")
            if verify_q is None:  # drafts both taken and refused, so both branches count
                assert 0.1 < np.mean(accepted > 0) < 0.9
    assert results["q"][2] > 1e-3
    assert results["sqrt(q)"][2] < 1e-6 and results["uniform"][2] < 1e-6


# ---- draft vocabularies: the drafter drafts over N of the target's V ids ------------------------
# "map": a token map file over a full head (tpdraft.Drafter's token_map); "speculators": a
# speculators checkpoint with a reduced head of its own (init --layout speculators --draft-vocab).

PROMPTS = [PROMPT, [5, 1, 8, 2], [13, 13, 4, 9, 1, 6, 2, 7]]
# Draft vocabularies of the small drafters (V = 16): 7 ids, fewer than the DFlash draft's top_k of
# 8 and more than DFlash 2's 6 selector candidates; the target's top 12 always reach outside them.
SMALL_MAP = [13, 0, 5, 2, 8, 11, 3]


def d2t_ids(drafter_dir):
    """The target ids of a speculators checkpoint's draft rows: i + d2t[i] (I64 [N])."""
    with open(os.path.join(drafter_dir, "model.safetensors"), "rb") as f:
        raw = f.read()
    size = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + size])["d2t"]["data_offsets"]
    d2t = np.frombuffer(raw[8 + size + begin:8 + size + end], dtype=np.int64)
    return sorted((np.arange(len(d2t)) + d2t).tolist())


def init_draft_vocab(tmp_path, checkpoint, config, kind, size=40):
    """(drafter_dir, target_dir, caps, token_map, ids): a checkpoint drafting over the target ids
    `ids` (sorted) of a token map file, `token_map` (a path, given to tpdraft.Drafter; None for a
    speculators checkpoint, whose own head holds them). caps are those of the draft vocabulary's
    drafter. A dict config (V = 16) takes SMALL_MAP, or as many ids for a speculators one."""
    small = isinstance(config, dict)
    if kind == "speculators":
        drafter_dir, target_dir, caps = init(checkpoint, config, layout="speculators",
                                             draft_vocab=len(SMALL_MAP) if small else size)
        ids, token_map = d2t_ids(drafter_dir), None
    else:
        drafter_dir, target_dir, caps = init(checkpoint, config)
        ids = SMALL_MAP if small else np.random.default_rng(1).choice(caps.vocab_size, size, replace=False).tolist()
        token_map = str(tmp_path / "map.json")
        with open(token_map, "w") as f:
            json.dump(ids, f)
        with open_drafter(drafter_dir, target_dir, token_map=token_map) as d:
            caps = d.caps
        ids = sorted(ids)
    assert caps.draft_vocab_size == len(ids) < caps.vocab_size
    return drafter_dir, target_dir, caps, token_map, ids


def assert_drafts_in(rounds, ids):
    drafted = {t for sequence in rounds for drafts, _ in sequence for t in drafts}
    assert drafted and drafted <= set(ids), sorted(drafted - set(ids))


DRAFT_VOCABS = [("tiny-dflash.json", "map"), ("tiny-dflash2.json", "map"), ("tiny-dflash.json", "speculators")]


@pytest.mark.parametrize("config,kind", DRAFT_VOCABS)
def test_greedy_output_with_a_draft_vocabulary_is_the_targets(tmp_path, checkpoint, config, kind):
    # Every prompt of a batch decodes as the target alone does, from drafts that are all ids of the
    # draft vocabulary, alike at tp 1 and 2.
    drafter_dir, target_dir, caps, token_map, ids = init_draft_vocab(tmp_path, checkpoint, config, kind)
    target = make_target(caps, target_dir)
    n = 96
    want = [target_decode(target, caps.target_layer_ids, [p], n, GREEDY, None)[0] for p in PROMPTS]
    runs = []
    for tp in (1, 2):
        with open_drafter(drafter_dir, target_dir, tp=tp, token_map=token_map) as d:
            got, rounds = SpeculativeDecoder(target, d, drafter_dir, GREEDY).decode(PROMPTS, n, None)
        assert got == want
        assert_drafts_in(rounds, ids)
        runs.append(rounds)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("config,kind", [(SMALL, "map"), (SMALL_DFLASH2, "map"), (SMALL, "speculators")],
                         ids=["dflash-map", "dflash2-map", "speculators"])
def test_sampled_output_with_a_draft_vocabulary_is_distributed_as_the_targets(tmp_path, checkpoint, config, kind):
    # The drafts hold 7 of 16 ids, the target samples among its top 12, so every pair the target
    # makes with a token outside the map comes from a refusal's residual max(p - q, 0). A verifier
    # given q, distributed as the target; one given sqrt(q), or q with part of its mass spread over
    # the whole vocabulary (as if the drafter could propose any token), visibly not.
    drafter_dir, target_dir, caps, token_map, ids = init_draft_vocab(tmp_path, checkpoint, config, kind)
    target = make_target(caps, target_dir)
    sampling = Sampling(temperature=1.0, top_k=12)
    want = exact_pair_distribution(target, caps.target_layer_ids, sampling)
    outside = np.ones(caps.vocab_size, bool)
    outside[ids] = False
    assert want[outside].sum() > 0.2  # pairs whose first token the drafter never proposes

    def checked(q):  # every row the decoder verifies with: zero outside the draft vocabulary, summing to 1
        assert not q[:, outside].any()
        np.testing.assert_allclose(q.sum(axis=-1), 1, rtol=1e-5)
        return q

    verifiers = {"q": checked, "sqrt(q)": lambda q: normalized(np.sqrt(q)),
                 "q spread over V": lambda q: 0.6 * q + 0.4 / caps.vocab_size}
    results = {}
    with open_drafter(drafter_dir, target_dir, max_sessions=BATCH, max_open_sessions=BATCH, max_context=32,
                      token_map=token_map) as d:
        for seed, (name, verify_q) in enumerate(verifiers.items()):
            decoder = SpeculativeDecoder(target, d, drafter_dir, sampling, DRAFT[caps.architecture], verify_q)
            counts, accepted = sampled_pair_counts(decoder, seed)
            results[name] = chi_square(counts, want)
            print(f"{caps.architecture} over {len(ids)} ids, {name}: chi2 {results[name][0]:.1f}, dof "
                  f"{results[name][1]}, p {results[name][2]:.3g}, first-round acceptance "
                  f"{np.bincount(accepted).tolist()}")
            if name == "q":  # drafts both taken and refused, so both branches count
                assert 0.1 < np.mean(accepted > 0) < 0.9
    assert results["q"][2] > 1e-3
    assert results["sqrt(q)"][2] < 1e-6 and results["q spread over V"][2] < 1e-6


@pytest.mark.parametrize("holds_the_agreed_token", [True, False], ids=["map-with-5", "map-without-5"])
def test_the_example_with_a_token_map_drafts_only_its_ids_and_matches_the_target(tmp_path, capsys,
                                                                                holds_the_agreed_token):
    # --agree makes every draft of the full head the token 5 (AGREE_TOKEN). Over a map holding 5 the
    # drafts are still 5, accepted in long runs; over one without it, never accepted in a run: the
    # output is the target's own either way.
    ids = [1, 4, 9, 16, 25, 36, 49, 64, 81, 100] + ([spec_decode.AGREE_TOKEN] if holds_the_agreed_token else [])
    (tmp_path / "map.json").write_text(json.dumps(ids))
    config = os.path.join(spec_decode.REPO, "configs", "tiny-dflash2.json")
    assert spec_decode.main(["--drafter-config", config, "--tokens", "60", "--agree", "--tp", "2",
                             "--token-map", str(tmp_path / "map.json")]) == 0
    out = capsys.readouterr().out
    assert "identical to the target's own greedy decode: yes" in out
    assert f"drafting over {len(ids)} of 257 tokens" in out
    mean = float(out.split("mean acceptance length ")[1].split()[0])
    if holds_the_agreed_token:
        assert mean > 4 and whole_blocks_accepted(out) >= 4
    else:
        assert mean < 1.5 and whole_blocks_accepted(out) == 0
