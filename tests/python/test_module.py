"""The Python module `tpdraft` against the program it wraps: the same tokens as `tpdraft draft` on
the same files, caps from the config, taps of every accepted dtype giving the same draft, errors
as exceptions that name the problem and change nothing, and the handle's life. Draft vocabularies:
a token map in every form, and a speculators checkpoint's own, draft as the program does and as the
full head's logits cut to the map's ids do (docs/sampling.md's rules, redone here)."""

import json
import os
import subprocess
import threading
import time

import numpy as np
import pytest
import tpdraft


def open_drafter(ck, **options):
    return tpdraft.Drafter(str(ck / "drafter"), str(ck / "target"), backend="cpu", threads=1, **options)


DTYPES = {"F32": np.float32, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}


def tensors_of(path, names=None):
    """The tensors of a safetensors file (those of `names`, else every one whose dtype numpy reads)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or (names and name not in names) or info["dtype"] not in DTYPES:
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    header, offset = {}, 0
    for name, array in tensors.items():
        header[name] = {"dtype": names[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(a.tobytes() for a in tensors.values()))


def taps_of(ck):
    # The rows `tpdraft init` wrote, read back from the safetensors file (f32, [N, T*H]).
    return tensors_of(ck / "taps.safetensors", ["taps"])["taps"]


def draft_with_program(ck, anchor, extra=()):
    out = subprocess.run([os.environ["TPDRAFT_BIN"], "draft", "--drafter", str(ck / "drafter"), "--target",
                          str(ck / "target"), "--taps", str(ck / "taps.safetensors"), "--anchor", str(anchor),
                          "--threads", "1"] + list(extra), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
@pytest.mark.parametrize("tp", [1, 2])
def test_one_step_equals_the_program(checkpoint, config, tp):
    ck = checkpoint(config, taps=24)
    with open_drafter(ck, tp=tp) as d:
        s = d.open_session()
        got = d.step([{"session": s, "taps": taps_of(ck), "anchor": 7}])[0]
        assert d.session_length(s) == 24
    want = draft_with_program(ck, 7)
    assert got["tokens"].tolist() == want["tokens"]
    np.testing.assert_allclose(got["q"], want["probs"], rtol=1e-6)


def test_caps_follow_the_config(checkpoint):
    ck = checkpoint("tiny-dflash2.json")
    cfg = json.loads((ck / "drafter" / "config.json").read_text())
    with open_drafter(ck, max_sessions=3, max_context=77) as d:
        c = d.caps
        assert c.architecture == "DFlash2DraftModel" and c.backend == "cpu" and c.tp == 1
        assert c.hidden_size == cfg["hidden_size"] and c.vocab_size == cfg["vocab_size"]
        assert c.target_layer_ids == cfg["dflash_config"]["target_layer_ids"]
        assert c.taps_width == len(c.target_layer_ids) * c.hidden_size
        assert c.block_size == cfg["dflash_config"]["block_size"]
        assert (c.max_sessions, c.max_context) == (3, 77)
    assert tpdraft.__version__.count(".") == 2


def test_taps_of_every_dtype_draft_alike(checkpoint):
    ck = checkpoint("tiny-dflash.json", taps=10)
    with open_drafter(ck) as d:
        rows = taps_of(ck)
        half = rows.astype(np.float16)
        bf16 = (rows.view(np.uint32) >> 16).astype(np.uint16)  # truncated: exact bf16 values
        widened_bf16 = (bf16.astype(np.uint32) << 16).view(np.float32)
        cases = [(half, {}, half.astype(np.float32)), (bf16, {"taps_dtype": "bf16"}, widened_bf16),
                 (np.asfortranarray(rows), {}, rows)]
        for given, extra, as_f32 in cases:
            a, b = d.open_session(), d.open_session()
            got = d.step([dict(session=a, taps=given, anchor=2, **extra), dict(session=b, taps=as_f32, anchor=2)])
            assert got[0]["tokens"].tolist() == got[1]["tokens"].tolist()
            d.close_session(a)
            d.close_session(b)


def test_errors_name_the_problem_and_change_nothing(checkpoint):
    ck = checkpoint("tiny-dflash2.json", taps=8)
    with open_drafter(ck) as d:
        rows = taps_of(ck)
        s = d.open_session()
        d.step([{"session": s, "taps": rows, "anchor": 1}])
        bad = rows[:2].copy()
        bad[1, 3] = np.nan
        cases = [({"session": s + 5, "anchor": 1}, "not open"),
                 ({"session": s, "keep": 9, "anchor": 1}, "keep 9"),
                 ({"session": s, "taps": bad, "anchor": 1}, "NaN"),
                 ({"session": s, "anchor": 10 ** 6}, "anchor token"),
                 ({"session": s, "anchor": 1, "top_k": 3, "temperature": 0.5}, "selector candidates"),
                 ({"session": s, "anchor": 1, "temperature": 1e-310}, "at least 1e-06"),
                 ({"session": s, "taps": np.full((1, rows.shape[1]), 3e38, np.float32), "anchor": 1},
                  r"beyond the ±2\^30")]
        for entry, needle in cases:
            with pytest.raises(tpdraft.ArgumentError, match=needle):
                d.step([entry])
            assert d.session_length(s) == 8
        with pytest.raises(ValueError):  # an argument error is a ValueError too
            d.step([{"session": s, "anchor": 1}, {"session": s, "anchor": 2}])
        with pytest.raises(ValueError, match="taps"):
            d.step([{"session": s, "taps": rows[:, :5], "anchor": 1}])
    with pytest.raises(tpdraft.InputError, match="no-such-dir"):
        tpdraft.Drafter(str(ck / "no-such-dir"), str(ck / "target"))
    # Sizes past the program's bounds are refused by value (2**58 positions once wrapped the
    # context's byte count and crashed the first step).
    for option, value, needle in [("max_context", 2 ** 58, "options.max_context is 288230376151711744"),
                                  ("max_context", 2 ** 63 - 1, "expected 1..2147483648"),
                                  ("max_sessions", 5000, "options.max_sessions is 5000"),
                                  ("max_open_sessions", 2 ** 21, "options.max_open_sessions is 2097152"),
                                  ("tp", 300, "options.tp is 300")]:
        with pytest.raises(tpdraft.InputError, match=needle):
            tpdraft.Drafter(str(ck / "drafter"), str(ck / "target"), backend="cpu", **{option: value})


def test_entries_of_the_wrong_kind_raise_naming_the_key_and_change_nothing(checkpoint):
    # Taps that are not floats (a string once segfaulted the interpreter; uint16 bits, integers
    # and complex values were cast silently), a taps_dtype label other than 'bf16', a misspelt key
    # (a 'temprature' drafted greedily), values of the wrong type: each raises, no session moves.
    ck = checkpoint("tiny-dflash.json", taps=8)
    with open_drafter(ck) as d:
        rows = taps_of(ck)
        s = d.open_session()
        want = d.step([{"session": s, "taps": rows, "anchor": 1}])[0]["tokens"].tolist()
        width = d.caps.taps_width
        cases = [({"taps": "abc"}, TypeError, "must hold floats"),
                 ({"taps": b"abc"}, TypeError, "must hold floats"),
                 ({"taps": {"a": 1}}, TypeError, "must hold floats"),
                 ({"taps": np.array([["x"] * width])}, TypeError, "must hold floats"),
                 ({"taps": np.array([[object()] * width])}, TypeError, "must hold floats"),
                 ({"taps": np.ones((1, width), np.complex64)}, TypeError, "complex64"),
                 ({"taps": np.ones((1, width), np.int64)}, TypeError, "int64"),
                 ({"taps": np.ones((1, width), np.uint16)}, TypeError, "taps_dtype='bf16'"),
                 ({"taps": np.ones((1, width), np.float16), "taps_dtype": "f16"}, ValueError, "taps_dtype is 'f16'"),
                 ({"taps": np.ones((1, width), np.uint16), "taps_dtype": "BF16"}, ValueError, "taps_dtype is 'BF16'"),
                 ({"taps_dtype": "bf16"}, ValueError, "taps_dtype given without taps"),
                 ({"temprature": 0.9}, KeyError, "unknown entry key 'temprature' .did you mean 'temperature'"),
                 ({"top-k": 3}, KeyError, "did you mean 'top_k'"),
                 ({1: 2}, TypeError, "keys are strings"),
                 ({"temperature": "0.9"}, TypeError, "entry 'temperature' must be a number, got '0.9'"),
                 ({"temperature": True}, TypeError, "entry 'temperature' must be a number"),
                 ({"top_k": 2.5}, TypeError, "entry 'top_k' must be an integer"),
                 ({"seed": -1}, TypeError, "entry 'seed' must be a non-negative integer"),
                 ({"keep": "all"}, TypeError, "entry 'keep' must be an integer"),
                 ({"dist": "all"}, ValueError, "entry 'dist' is 'all'"),
                 ({"dist": 1.5}, TypeError, "entry 'dist' must be an integer")]
        for change, error, needle in cases:
            entry = {"session": s, "anchor": 1, **change}
            with pytest.raises(error, match=needle):
                d.step([entry])
            assert d.session_length(s) == 8
        with pytest.raises(TypeError, match="entry 1 must be a dict"):
            d.step([{"session": s, "anchor": 1}, [s, 1]])
        with pytest.raises(TypeError, match="entry 'anchor' must be an integer"):
            d.step([{"session": s, "anchor": "1"}])
        assert d.session_length(s) == 8
        assert d.step([{"session": s, "keep": 0, "taps": rows, "anchor": 1}])[0]["tokens"].tolist() == want


def test_a_preempted_request_restarts_with_keep_0_on_a_sliding_drafter(checkpoint):
    # An engine that recomputes a preempted request sends keep 0 and every row again: after the
    # sliding ring has dropped its first rows, that is a fresh session's draft, not a refusal.
    ck = checkpoint("tiny-dflash2.json", taps=24)  # window 6 + block 8: the ring keeps 14 positions
    rows = taps_of(ck)
    with open_drafter(ck, tp=2) as d:
        s, fresh = d.open_session(), d.open_session()
        d.step([{"session": s, "taps": rows[:20], "anchor": 1}])
        got = d.step([{"session": s, "keep": 0, "taps": rows[20:], "anchor": 4, "temperature": 0.8, "seed": 2}])[0]
        want = d.step([{"session": fresh, "taps": rows[20:], "anchor": 4, "temperature": 0.8, "seed": 2}])[0]
        assert d.session_length(s) == 4
        assert got["tokens"].tolist() == want["tokens"].tolist()
        np.testing.assert_allclose(got["q"], want["q"], rtol=1e-6)
        # keep 3 with one row: the draft at 4 would read positions 0..2 of the sliding layer, dropped.
        d.step([{"session": s, "taps": rows[:20], "anchor": 1}])
        with pytest.raises(tpdraft.ArgumentError, match="cannot roll back to length 3 and settle 1 rows"):
            d.step([{"session": s, "keep": 3, "taps": rows[:1], "anchor": 1}])
        assert d.session_length(s) == 24


def test_a_closed_drafter_refuses_calls(checkpoint):
    ck = checkpoint("tiny-dflash.json")
    d = open_drafter(ck)
    d.close()
    d.close()  # twice is harmless
    with pytest.raises(ValueError, match="closed"):
        d.open_session()


def test_closing_while_another_thread_steps_waits_for_the_call(checkpoint):
    # close() on one thread while another is inside step() (a use-after-free that crashed the
    # interpreter every time): the step in flight finishes with its drafts, every later call
    # raises "closed", nothing crashes. Several rounds, at tp 1 and 2.
    ck = checkpoint("tiny-dflash2.json", taps=64)
    rows = taps_of(ck)
    for round_ in range(6):
        d = open_drafter(ck, tp=1 + round_ % 2, max_context=4096)
        s = d.open_session()
        outcome = {"steps": 0}

        def keep_stepping():
            try:
                while True:
                    got = d.step([{"session": s, "keep": 0, "taps": rows, "anchor": 3}])[0]
                    assert len(got["tokens"]) == d.caps.block_size - 1
                    outcome["steps"] += 1
            except ValueError as e:
                outcome["error"] = str(e)

        worker = threading.Thread(target=keep_stepping)
        worker.start()
        while outcome["steps"] < 3:
            time.sleep(0.001)
        d.close()
        worker.join(timeout=60)
        assert not worker.is_alive()
        assert outcome.get("error") == "the drafter is closed", outcome
        with pytest.raises(ValueError, match="closed"):
            d.session_length(s)


@pytest.mark.parametrize("quant", ["q8", "q4", "q4+head", "q4a16"])
def test_quant_while_loading_equals_the_program(checkpoint, quant):
    # A float checkpoint quantized while it loads drafts as `tpdraft draft --quant` does; the
    # sampled probabilities show it is not the float model.
    ck = checkpoint("tiny-dflash2.json", taps=16)
    with open_drafter(ck, quant=quant) as d:
        s = d.open_session()
        got = d.step([{"session": s, "taps": taps_of(ck), "anchor": 5}])[0]
    want = draft_with_program(ck, 5, ["--quant", quant])
    assert got["tokens"].tolist() == want["tokens"]
    np.testing.assert_allclose(got["q"], want["probs"], rtol=1e-6)
    sampled = ["--temperature", "0.9", "--seed", "4"]
    assert draft_with_program(ck, 5, sampled + ["--quant", quant])["probs"] != draft_with_program(ck, 5, sampled)["probs"]
    with pytest.raises(Exception, match="options.quant is 'q3'"):
        open_drafter(ck, quant="q3")


@pytest.mark.parametrize("tp", [1, 2])
def test_a_bf16_context_cache_drafts_as_the_program(checkpoint, tp):
    # kv_dtype reaches the drafter through the C ABI as --kv-dtype does through the command line:
    # the same probabilities, which a sampled draft shows differ from the f32 cache's.
    ck = checkpoint("tiny-dflash.json", taps=24)
    sampled = {"temperature": 0.9, "seed": 4}
    with open_drafter(ck, tp=tp, kv_dtype="bf16") as d:
        s = d.open_session()
        got = d.step([{"session": s, "taps": taps_of(ck), "anchor": 7, **sampled}])[0]
    flags = ["--temperature", "0.9", "--seed", "4", "--tp", str(tp)]
    want = draft_with_program(ck, 7, flags + ["--kv-dtype", "bf16"])
    assert got["tokens"].tolist() == want["tokens"]
    np.testing.assert_allclose(got["q"], want["probs"], rtol=1e-6)
    assert want["probs"] != draft_with_program(ck, 7, flags)["probs"]
    with pytest.raises(Exception, match="options.kv_dtype is 'f16'"):
        open_drafter(ck, kv_dtype="f16")


# ---- draft vocabularies: a token map over a full head, and a speculators checkpoint's own ----------

# Sampling settings (step entry keys) besides greedy; top_k and top_p do not apply to DFlash 2.
SAMPLED = {"DFlashDraftModel": [{"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 11},
                                {"temperature": 1.3, "seed": 5},
                                {"temperature": 0.7, "top_k": 100, "seed": 2}],  # top_k beyond the map
           "DFlash2DraftModel": [{"temperature": 0.8, "seed": 11}, {"temperature": 1.5, "seed": 5}]}
# Map sizes: DFlash 2's selector walks its top 4 candidates, so its map holds more than 4.
MAP_SIZE = {"tiny-dflash.json": 60, "tiny-dflash2.json": 24}


def config_of(ck):
    cfg = json.loads((ck / "drafter" / "config.json").read_text())
    return cfg.get("transformer_layer_config", cfg)


def some_target_ids(vocab, n, seed=0):
    """n distinct ids of [0, vocab), in no particular order."""
    return np.random.default_rng(seed).choice(vocab, n, replace=False)


def program_args(setting):
    names = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}
    return [str(a) for key, value in setting.items() for a in (names[key], value)]


def check_draft_in_map(got, ids, vocab):
    """Drafts inside the map; a full distribution of V entries, zero outside the map, summing to 1,
    that gives each draft its q."""
    assert set(got["tokens"].tolist()) <= set(ids.tolist())
    probs = got["dist_probs"]
    assert probs.shape == (len(got["tokens"]), vocab)
    outside = np.ones(vocab, bool)
    outside[ids] = False
    assert not probs[:, outside].any()
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(probs[np.arange(len(got["tokens"])), got["tokens"]], got["q"], rtol=1e-6)


def steps_as_the_program(d, ck, settings, want, ids, vocab):
    """One session: the taps settled by the first step, then a step per setting from the same
    context, each with the full distribution; tokens and q as the program's `want`."""
    s = d.open_session()
    for i, (setting, program) in enumerate(zip(settings, want)):
        entry = dict(session=s, keep=-1 if i == 0 else 24, anchor=7, dist="full", **setting)
        if i == 0:
            entry["taps"] = taps_of(ck)
        got = d.step([entry])[0]
        assert got["tokens"].tolist() == program["tokens"], setting
        np.testing.assert_allclose(got["q"], program["probs"], rtol=1e-6)
        check_draft_in_map(got, ids, vocab)
    d.close_session(s)


@pytest.mark.parametrize("config", ["tiny-dflash.json", "tiny-dflash2.json"])
@pytest.mark.parametrize("tp", [1, 2])
def test_a_token_map_drafts_as_the_program(tmp_path, checkpoint, config, tp):
    # Every form of one map (a JSON list in no order with repeats, a safetensors file, a path
    # object, a list, integer arrays) drafts what `tpdraft draft --token-map` drafts, greedy and
    # sampled, only ids of the map, which the full head does not keep to.
    ck = checkpoint(config, taps=24)
    vocab = config_of(ck)["vocab_size"]
    ids = some_target_ids(vocab, MAP_SIZE[config])
    listed = ids.tolist() + ids[:5].tolist()
    json_map, st_map = tmp_path / "map.json", tmp_path / "map.safetensors"
    json_map.write_text(json.dumps(listed))
    write_safetensors(st_map, {"token_ids": np.array(listed[::-1], np.int64)})
    settings = [{}] + SAMPLED[json.loads((ck / "drafter" / "config.json").read_text())["architectures"][0]]
    want = [draft_with_program(ck, 7, program_args(s) + ["--token-map", str(json_map)]) for s in settings]
    from_safetensors = draft_with_program(ck, 7, program_args(settings[1]) + ["--token-map", str(st_map)])
    assert (from_safetensors["tokens"], from_safetensors["probs"]) == (want[1]["tokens"], want[1]["probs"])
    assert not set(draft_with_program(ck, 7)["tokens"]) <= set(ids.tolist())  # the map changes the draft
    for token_map in (str(json_map), json_map, st_map, listed, np.array(listed, np.int32), np.array(listed, np.uint16)):
        with open_drafter(ck, tp=tp, token_map=token_map) as d:
            assert (d.caps.draft_vocab_size, d.caps.vocab_size, d.caps.tp) == (len(ids), vocab, tp)
            steps_as_the_program(d, ck, settings, want, ids, vocab)
    with open_drafter(ck, tp=tp) as d:
        assert d.caps.draft_vocab_size == vocab


def splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def gumbel(seed, row, ids):
    """g(seed, r, v) of docs/sampling.md for draft row r (1 ... B-1) at the target ids `ids`."""
    with np.errstate(over="ignore"):
        h = splitmix64(splitmix64(splitmix64(np.uint64(seed)) ^ np.uint64(row)) ^ ids.astype(np.uint64))
    return -np.log(-np.log(((h >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0 ** 53))


def reference_draft(logits, ids, vocab, setting):
    """A DFlash draft by docs/sampling.md's rules from each row's logits over the target ids `ids`
    (ascending) alone: (tokens, q, full distributions [B-1, V])."""
    assert (np.diff(ids) > 0).all()
    tokens, q, dist = [], [], np.zeros((len(logits), vocab))
    for r, row in enumerate(logits.astype(np.float64)):
        temperature = setting.get("temperature", 0.0)
        if not temperature:  # argmax, ties to the lower id: the first of ascending ids
            tokens.append(int(ids[np.argmax(row)]))
            q.append(1.0)
            dist[r, tokens[-1]] = 1
            continue
        z = row / temperature
        kept = np.lexsort((ids, -z))  # by logit, then id
        if setting.get("top_k"):
            kept = kept[:setting["top_k"]]
        if setting.get("top_p", 1.0) < 1:
            mass = np.exp(z[kept] - z[kept].max())
            kept = kept[:int(np.searchsorted(np.cumsum(mass / mass.sum()), setting["top_p"])) + 1]
        p = np.exp(z[kept] - z[kept].max())
        p /= p.sum()
        pick = np.lexsort((ids[kept], -(z[kept] + gumbel(setting["seed"], r + 1, ids[kept]))))[0]
        tokens.append(int(ids[kept[pick]]))
        q.append(p[pick])
        dist[r, ids[kept]] = p
    return tokens, np.array(q), dist


def dumped_logits(tmp_path, ck, tp, extra=()):
    dump = tmp_path / f"dump-{len(list(tmp_path.iterdir()))}.safetensors"
    draft_with_program(ck, 7, ["--tp", str(tp), "--dump", str(dump)] + list(extra))
    return tensors_of(dump, ["logits", "logit_ids"])


def assert_drafts_as_reference(got, logits, ids, vocab, setting):
    tokens, q, dist = reference_draft(logits, ids, vocab, setting)
    assert got["tokens"].tolist() == tokens, setting
    np.testing.assert_allclose(got["q"], q, rtol=2e-5)
    np.testing.assert_allclose(got["dist_probs"], dist, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_token_map_draft_is_the_full_heads_with_every_other_logit_at_minus_inf(tmp_path, checkpoint, tp):
    # The full head's logits (the program's dump, no map) cut to the map's ids, drawn from by the
    # rules of docs/sampling.md, give the tokens, q and full distributions drafted over the map;
    # the dump over the map holds exactly those columns, in ascending target id.
    ck = checkpoint("tiny-dflash.json", taps=24)
    ids = some_target_ids(300, 60, seed=4)
    (tmp_path / "map.json").write_text(json.dumps(ids.tolist()))
    full = dumped_logits(tmp_path, ck, tp)["logits"]
    over_map = dumped_logits(tmp_path, ck, tp, ["--token-map", str(tmp_path / "map.json")])
    ids = np.sort(ids)
    np.testing.assert_array_equal(over_map["logit_ids"], ids)
    np.testing.assert_allclose(over_map["logits"], full[:, ids], rtol=1e-6, atol=1e-6)
    settings = [{}] + SAMPLED["DFlashDraftModel"] + [{"temperature": 1.0, "seed": s} for s in range(8)]
    with open_drafter(ck, tp=tp, token_map=ids) as d:
        s = d.open_session()
        for i, setting in enumerate(settings):
            entry = dict(session=s, keep=-1 if i == 0 else 24, anchor=7, dist="full", **setting)
            if i == 0:
                entry["taps"] = taps_of(ck)
            assert_drafts_as_reference(d.step([entry])[0], full[:, ids], ids, 300, setting)


@pytest.mark.parametrize("target_embedding", [False, True], ids=["own-embedding", "target-embedding"])
@pytest.mark.parametrize("tp", [1, 2])
def test_a_speculators_checkpoint_drafts_as_the_program(tmp_path, checkpoint, target_embedding, tp):
    # `init --layout speculators --draft-vocab 100`: a reduced head of its own whose row i scores
    # target id i + d2t[i]. Drafted as the program drafts, over those ids (its dump's columns, drawn
    # from by the rules of docs/sampling.md); a token map on top of it is refused.
    ck = checkpoint("tiny-dflash.json", taps=24, layout="speculators", draft_vocab=100,
                    target_embedding=target_embedding)
    d2t = tensors_of(ck / "drafter" / "model.safetensors", ["d2t"])["d2t"]
    ids = np.sort(np.arange(len(d2t)) + d2t)
    assert len(set(ids.tolist())) == 100 and ids[-1] < 300
    dump = dumped_logits(tmp_path, ck, tp)
    np.testing.assert_array_equal(dump["logit_ids"], ids)
    settings = [{}] + SAMPLED["DFlashDraftModel"]
    want = [draft_with_program(ck, 7, program_args(s)) for s in settings]
    with open_drafter(ck, tp=tp) as d:
        assert (d.caps.architecture, d.caps.draft_vocab_size, d.caps.vocab_size) == ("DFlashSpeculator", 100, 300)
        assert d.caps.target_layer_ids == [1, 3]
        steps_as_the_program(d, ck, settings, want, ids, 300)
        s = d.open_session()
        for i, setting in enumerate(settings):
            entry = dict(session=s, keep=-1 if i == 0 else 24, anchor=7, dist="full", **setting)
            if i == 0:
                entry["taps"] = taps_of(ck)
            assert_drafts_as_reference(d.step([entry])[0], dump["logits"], ids, 300, setting)
    with pytest.raises(tpdraft.InputError, match=r"a draft vocabulary of its own \(100 tokens\)"):
        open_drafter(ck, token_map=ids[:10])


def process_resources():
    """(threads, open file descriptors) of this process."""
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def test_bad_token_maps_raise_and_leave_nothing_open(tmp_path, checkpoint):
    ck = checkpoint("tiny-dflash2.json", taps=24)  # V = 257, a selector walking 4 candidates
    ids = some_target_ids(257, 24)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(ids.tolist()))
    want = draft_with_program(ck, 7, ["--token-map", str(good)])
    files = {"float-entry.json": "[3, 4, 5.5, 6, 7]", "object.json": '{"ids": [1, 2, 3, 4, 5]}', "empty.json": "[]",
             "not-json.json": "[1, 2,", "too-far.json": "[3, 4, 257, 6, 7]"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    write_safetensors(tmp_path / "no-ids.safetensors", {"ids": np.arange(5, dtype=np.int64)})
    cases = [([1.5, 2.0, 3.0, 4.0, 5.0], TypeError, "integer target ids, got an array of dtype float64"),
             ([[1, 2], [3, 4]], TypeError, "1-D sequence.* 2 dimension"),
             (np.array([True, False, True]), TypeError, "dtype bool"),
             (["1", "2"], TypeError, "integer target ids"),
             (7, TypeError, "0 dimension"),
             ([1, True, 3, 4, 5], TypeError, "token_map holds a bool"),
             (np.array([3, 2 ** 63], dtype=np.uint64), ValueError, "target id 9223372036854775808"),
             ([], ValueError, "token_map is empty"),
             (np.zeros(0, np.int64), ValueError, "token_map is empty"),
             ([3, 4, 257, 6, 7], tpdraft.InputError, r"target id 257, outside the vocabulary \[0, 257\)"),
             ([3, 4, 5, 6, -2], tpdraft.InputError, r"target id -2, outside"),
             ([3, 4, 5], tpdraft.InputError, r"selector_top_k \(4\) exceeds the draft vocabulary \(3\)"),
             ([9, 9, 9, 9, 8], tpdraft.InputError, r"selector_top_k \(4\) exceeds the draft vocabulary \(2\)"),
             (tmp_path / "missing.json", tpdraft.InputError, "missing.json: cannot open"),
             (str(tmp_path / "float-entry.json"), tpdraft.InputError, r"float-entry.json: entry 2 is 5.5"),
             (tmp_path / "object.json", tpdraft.InputError, "object.json: a token map is a JSON list"),
             (tmp_path / "empty.json", tpdraft.InputError, "empty.json: the token map lists no token"),
             (tmp_path / "not-json.json", tpdraft.InputError, "not-json.json: not valid JSON"),
             (tmp_path / "too-far.json", tpdraft.InputError, r"too-far.json: entry 2 is the target id 257"),
             (tmp_path / "no-ids.safetensors", tpdraft.InputError, "no-ids.safetensors: no tensor 'token_ids'")]
    with open_drafter(ck, tp=2, token_map=good) as d:  # whatever a first open starts once
        d.open_session()
    before = process_resources()
    for token_map, error, needle in cases:
        for tp in (1, 2):
            with pytest.raises(error, match=needle):
                open_drafter(ck, tp=tp, token_map=token_map)
    assert process_resources() == before
    assert not (tmp_path / "missing.json").exists()
    with open_drafter(ck, tp=2, token_map=good) as d:
        s = d.open_session()
        got = d.step([{"session": s, "taps": taps_of(ck), "anchor": 7}])[0]
    assert got["tokens"].tolist() == want["tokens"]
