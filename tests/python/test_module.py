"""The Python module `tpdraft` against the program it wraps: the same tokens as `tpdraft draft` on
the same files, caps from the config, taps of every accepted dtype giving the same draft, errors
as exceptions that name the problem and change nothing, and the handle's life."""

import json
import os
import subprocess

import numpy as np
import pytest
import tpdraft


def open_drafter(ck, **options):
    return tpdraft.Drafter(str(ck / "drafter"), str(ck / "target"), backend="cpu", threads=1, **options)


def taps_of(ck):
    # The rows `tpdraft init` wrote, read back from the safetensors file (f32, [N, T*H]).
    raw = (ck / "taps.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])["taps"]
    begin, end = header["data_offsets"]
    rows = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=np.float32)
    return rows.reshape(header["shape"])


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
                 ({"session": s, "anchor": 1, "top_k": 3, "temperature": 0.5}, "selector candidates")]
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


def test_a_closed_drafter_refuses_calls(checkpoint):
    ck = checkpoint("tiny-dflash.json")
    d = open_drafter(ck)
    d.close()
    d.close()  # twice is harmless
    with pytest.raises(ValueError, match="closed"):
        d.open_session()


@pytest.mark.parametrize("quant", ["q8", "q4", "q4+head"])
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
