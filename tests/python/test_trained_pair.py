"""The trained pair of pair/ (train/ makes it): its files match pair/MANIFEST; the training code's
models compute what the runtime and the example target compute from the exported files; on
held-out source the pair reaches the acceptance docs/pair.md reports and decodes greedily exactly
as the target alone, and samples the first drafted position as the target's own distribution (a chi-square test that fails when the residual
ignores q); and every program of the pair refuses bad input naming the file and the field."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the pair's target runs in PyTorch")
pytest.importorskip("sentencepiece", reason="the pair's tokenizer needs python3-sentencepiece")
import tpdraft  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "examples"))
sys.path.insert(0, os.path.join(REPO, "train"))
import spec_decode  # noqa: E402
import trained_pair  # noqa: E402
from test_spec_decode import chi_square  # noqa: E402

PAIR = os.path.join(REPO, "pair")
PY = sys.executable
REFERENCE = json.load(open(os.path.join(PAIR, "reference.json")))


def run_example(args, capsys):
    """spec_decode.main(args --json) -> its report."""
    assert spec_decode.main(args + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_shipped_files_match_the_manifest():
    import manifest
    assert manifest.check(PAIR) == []
    listed = manifest.read_manifest(os.path.join(PAIR, "MANIFEST"))
    assert set(listed) == set(manifest.MADE_BY)
    assert sum(size for _, size in listed.values()) <= manifest.LIMIT


def test_a_changed_file_is_caught_by_the_manifest(tmp_path):
    import manifest
    copy = tmp_path / "pair"
    shutil.copytree(PAIR, copy)
    with open(copy / "dflash2" / "model.safetensors", "r+b") as f:
        f.seek(-2, 2)
        f.write(b"\x01\x02")
    assert manifest.check(str(copy)) == [f"{copy}/dflash2/model.safetensors: differs from the MANIFEST"]


def test_the_tokenizer_round_trips_held_out_source_and_never_makes_the_mask():
    pair = trained_pair.Pair()
    sp = pair.tokenizer
    assert sp.get_piece_size() == 16384 == pair.target_config["vocab_size"]
    mask = pair.drafter_config["dflash_config"]["mask_token_id"]
    assert sp.id_to_piece(mask) == "<mask>"
    for path in trained_pair.heldout_files()[:8]:
        text = trained_pair.read_source(path)
        ids = sp.encode(text)
        assert sp.decode(ids) == text and mask not in ids
    odd = "\t\u00e9\U0001F600 <mask> \x00\n\n   x"
    assert sp.decode(sp.encode(odd)) == odd and mask not in sp.encode(odd)


def held_out_prompt(length=256, at=0.5):
    pair = trained_pair.Pair()
    path = trained_pair.heldout_files()[0]
    return pair, trained_pair.prompts_from(trained_pair.read_source(path), pair.tokenizer, 1, length, path)[0]


def test_the_example_target_computes_what_the_training_model_computes():
    import distill
    pair, prompt = held_out_prompt()
    trained = distill.load_target(torch, pair.target_dir)
    with torch.no_grad():
        hidden, taps = trained(torch.tensor([prompt]), pair.taps)
        want = (hidden @ trained.head_weight().T)[0].double().numpy()
    logits, example_taps = pair.target(torch.float64).forward_all([prompt], pair.taps)
    assert np.abs(logits[0] - want).max() < 2e-3 * np.abs(want).max()
    np.testing.assert_allclose(example_taps[0], torch.cat(taps, -1)[0].double().numpy(), rtol=0, atol=2e-3)
    assert (logits[0].argmax(-1) == want.argmax(-1)).mean() > 0.99


def trained_drafter(arch):
    import dflash
    from common import read_safetensors
    pair = trained_pair.Pair(arch=arch)
    config = dict(pair.drafter_config)
    config.pop("tpdraft_training", None)
    table = read_safetensors(os.path.join(pair.target_dir, "model.safetensors"), torch)["model.embed_tokens.weight"]
    model = dflash.Drafter(config, table)
    model.load_state_dict(read_safetensors(os.path.join(pair.drafter_dir, "model.safetensors"), torch))
    return pair, model


@pytest.mark.parametrize("arch", ["dflash", "dflash2"])
def test_the_runtime_drafts_what_the_training_model_learned(arch):
    # The training code's forward (train/dflash.py) and tpdraft on the exported checkpoint, at 4
    # anchors of a held-out prompt: the same draft distribution (DFlash, temperature 1, whole
    # rows) and the same greedy selector walk (DFlash 2).
    pair, model = trained_drafter(arch)
    _, prompt = held_out_prompt(320)
    target = pair.target(torch.float32)
    logits, taps = target.forward_all([prompt], pair.taps)
    with tpdraft.Drafter(pair.drafter_dir, pair.target_dir, backend="cpu", threads=1) as d:
        for a in (64, 128, 200, 300):
            anchor = int(logits[0, a - 1].argmax())
            tokens = torch.tensor([prompt[:a] + [anchor] + [0] * 8])
            with torch.no_grad():
                g, rows = model(torch.from_numpy(taps[:, :a + 9].astype(np.float32)), tokens, torch.tensor([[a]]))
            s = d.open_session()
            entry = {"session": s, "keep": 0, "taps": taps[0, :a].astype(np.float32), "anchor": anchor}
            if arch == "dflash":
                got = d.step([dict(entry, temperature=1.0, seed=1, dist="full")])[0]["dist_probs"]
                want = torch.softmax(rows[0, 0].double(), -1).numpy()
                assert np.abs(np.asarray(got, dtype=np.float64) - want).max() < 1e-4
            else:
                got = d.step([entry])[0]["tokens"].tolist()
                assert got == selector_walk(model, g[0, 0], rows[0, 0], anchor)
            d.close_session(s)


def selector_walk(model, g, logits, anchor):
    """DFlash 2's greedy walk (docs/model.md) over the training model's rows: the picks."""
    k = model.c["dflash_config"]["selector_top_k"]
    picks, prev = [], anchor
    with torch.no_grad():
        for r in range(logits.shape[0]):
            values, ids = logits[r].topk(k)
            order = sorted(range(k), key=lambda i: (-float(values[i]), int(ids[i])))
            cand = ids[order]
            score = model.candidate_selector.scores(g[r + 1], logits[r], cand, torch.tensor(prev))
            prev = int(cand[int(score.argmax())])
            picks.append(prev)
    return picks


@pytest.mark.parametrize("arch", ["dflash2", "dflash"])
def test_the_pair_accepts_what_the_docs_report_and_decodes_as_the_target(arch, capsys):
    ref = REFERENCE["greedy"][arch]
    report = run_example(ref["args"] + ["--arch", arch, "--target-dtype", "f64"], capsys)
    assert report["identical"] is True
    assert report["tau"] >= 0.9 * ref["tau"], report
    # Taps of the next layers (--tap-shift 1) still decode exactly: the loop stays lossless
    # whatever the drafter is handed. (Its tau barely moves on this pair, docs/pair.md: adjacent
    # layers' residual streams differ little, so a layer off-by-one is not caught by acceptance.)
    shifted = run_example(ref["args"] + ["--arch", arch, "--target-dtype", "f64", "--tap-shift", "1"], capsys)
    assert shifted["identical"] is True


def first_token_case():
    """(pair, drafter, session, prompt length, anchor, the target's p at the first drafted
    position, the drafter's q there) at the held-out position, of eight tried, where the
    drafter's q differs most from the target's p (where a wrong residual shows most)."""
    pair = trained_pair.Pair(arch="dflash2")
    target = pair.target(torch.float64)
    path = trained_pair.heldout_files()[0]
    prompts = trained_pair.prompts_from(trained_pair.read_source(path), pair.tokenizer, 8, 200, path)
    d = tpdraft.Drafter(pair.drafter_dir, pair.target_dir, backend="cpu", threads=1)
    width = pair.drafter_config["dflash_config"]["selector_top_k"]
    best = None
    for prompt in prompts:
        cache = target.new_cache(1, len(prompt) + 2)
        logits, taps = target.forward([prompt], [0], cache, pair.taps)
        anchor = int(logits[0, -1].argmax())
        after, _ = target.forward([[anchor]], [len(prompt)], cache, pair.taps)
        p = spec_decode.target_probs(after[0, 0], spec_decode.Sampling(1.0))
        s = d.open_session()
        r = d.step([{"session": s, "keep": 0, "taps": taps[0].astype(np.float32), "anchor": anchor,
                     "temperature": 1.0, "seed": 1, "dist": width}])[0]
        q = spec_decode.dense_rows(r["dist_ids"][:1], r["dist_probs"][:1], r["dist_rest"][:1], len(p))[0]
        power = float((((wrong_distribution(p, q) - p) ** 2) / p).sum())
        if best is None or power > best[-1]:
            if best:
                d.close_session(best[1])
            best = (prompt, s, anchor, p, q, power)
        else:
            d.close_session(s)
    prompt, s, anchor, p, q, power = best
    return d, s, len(prompt), anchor, p, q, power


def wrong_distribution(p, q):
    """What the first token follows when a refused draft is replaced from p instead of max(p - q, 0)."""
    kept = np.minimum(p, q)
    return kept + (1 - kept.sum()) * p


def residual_without_q(p, drafts, q, rng):
    """spec_decode.verify_sampled with the mistake: a refused draft is replaced by a draw from p."""
    for i, token in enumerate(drafts):
        if rng.random() * q[i, token] < p[i, token]:
            continue
        return i, spec_decode.draw(p[i], rng)
    return len(drafts), spec_decode.draw(p[-1], rng)


def test_sampled_first_tokens_follow_the_targets_distribution_and_a_residual_without_q_does_not():
    d, s, n, anchor, p, q, power = first_token_case()
    runs = 3000
    # The test has power: the mistake shifts the expected chi-square statistic by runs * power.
    assert runs * power > 80, power
    counts = {"right": np.zeros(len(p)), "wrong": np.zeros(len(p))}
    rng = np.random.default_rng(11)
    rows = np.stack([p, p])
    with d:
        for seed in range(runs):
            r = d.step([{"session": s, "keep": n, "anchor": anchor, "temperature": 1.0, "seed": seed + 2, "dist": 8}])[0]
            first = int(r["tokens"][0])
            qrow = spec_decode.dense_rows(r["dist_ids"][:1], r["dist_probs"][:1], r["dist_rest"][:1], len(p))
            for name, verify in (("right", spec_decode.verify_sampled), ("wrong", residual_without_q)):
                accepted, following = verify(rows, [first], qrow, rng)
                counts[name][first if accepted else following] += 1
    assert chi_square(counts["right"], p)[2] > 1e-3
    assert chi_square(counts["wrong"], p)[2] < 1e-6


# ---- bad input ---------------------------------------------------------------------------------


def copy_pair(tmp_path):
    copy = tmp_path / "pair"
    shutil.copytree(PAIR, copy)
    return copy


def test_a_tokenizer_that_is_not_the_targets_is_refused(tmp_path, capsys):
    copy = copy_pair(tmp_path)
    config = json.loads((copy / "target" / "config.json").read_text())
    config["vocab_size"] = 16000
    (copy / "target" / "config.json").write_text(json.dumps(config))
    assert spec_decode.main(["--pair", str(copy), "--tokens", "4", "--requests", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{copy}/target/tokenizer.model: 16384 pieces" in err and "'vocab_size' is 16000" in err


def test_a_drafter_tapping_layers_the_target_lacks_is_refused(tmp_path, capsys):
    copy = copy_pair(tmp_path)
    path = copy / "dflash2" / "config.json"
    config = json.loads(path.read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 4, 8]
    path.write_text(json.dumps(config))
    assert spec_decode.main(["--pair", str(copy), "--tokens", "4", "--requests", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: field 'dflash_config.target_layer_ids' names layer 8" in err and "layers 0 .. 7" in err
    assert spec_decode.main(["--tokens", "4", "--requests", "1", "--tap-shift", "2"]) == 2
    assert "--tap-shift 2: the taps [3, 6, 8] leave the target's 8 layers" in capsys.readouterr().err


def test_a_missing_prompt_file_or_corpus_file_is_refused(tmp_path, capsys):
    assert spec_decode.main(["--prompt-file", str(tmp_path / "nope.py"), "--tokens", "4"]) == 2
    assert f"{tmp_path}/nope.py: cannot read the prompt file" in capsys.readouterr().err
    manifest = json.load(open(os.path.join(PAIR, "corpus-manifest.json")))
    manifest["files"][0]["path"] = "no/such/module.py"
    manifest["files"][0]["split"] = "train"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    done = subprocess.run([PY, os.path.join(REPO, "train", "corpus.py"), "tokenizer", "--manifest",
                           str(tmp_path / "manifest.json"), "--out", str(tmp_path / "t.model")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("corpus.py: error: ") and "no/such/module.py: corpus file listed in the manifest is " \
        "missing (split train)" in done.stderr
    assert not (tmp_path / "t.model").exists()


def test_distilling_taps_of_layers_the_target_lacks_is_refused(tmp_path):
    done = subprocess.run([PY, os.path.join(REPO, "train", "distill.py"), "--taps", "1,4,9", "--out", str(tmp_path / "d"),
                           "--sequences", "32"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--taps: layer 9 does not exist; the target" in done.stderr and "num_hidden_layers) has layers 0 .. 7" in done.stderr
    assert not (tmp_path / "d").exists()


def test_an_interrupted_target_training_resumes_as_if_it_had_not_stopped(tmp_path):
    # Three steps straight, and two steps, a stop, then the rest: the same weights, bit for bit.
    script = os.path.join(REPO, "train", "target.py")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"

    def train(work, *extra):
        cmd = [PY, script, "--steps", "3", "--work", str(work), "--out", str(work / "out"), "--plot",
               str(work / "loss.png"), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    train(straight)
    resumed.mkdir()
    for cache in ("train-tokens.npy", "validation-tokens.npy"):
        shutil.copy(straight / cache, resumed / cache)
    train(resumed, "--stop-after", "2")
    assert not (resumed / "out").exists()
    train(resumed)
    a, b = (open(w / "out" / "model.safetensors", "rb").read() for w in (straight, resumed))
    assert a == b
    assert (straight / "loss.png").stat().st_size > 1000
