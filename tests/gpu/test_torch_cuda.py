"""Torch CUDA tensors as the taps of a cuda drafter, read on the device: f32 / f16 / bf16 written on
a side stream draft what the f32 numpy path drafts on the same values; out='torch' answers on the
taps' GPU; a CUDA tensor given to a cpu drafter is refused. Skipped without a GPU (and a CUDA
build of torch and of tpdraft). Usage: PYTHONPATH=build/python TPDRAFT_BIN=build/tpdraft pytest."""

import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tpdraft = pytest.importorskip("tpdraft")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "ck"
    subprocess.run([os.environ["TPDRAFT_BIN"], "init", "--config", os.path.join(REPO, "configs", "tiny-dflash2.json"),
                    "--out", str(out)], check=True, capture_output=True)
    return out


def open_drafter(ck, backend):
    try:
        return tpdraft.Drafter(str(ck / "drafter"), str(ck / "target"), backend=backend, threads=1)
    except tpdraft.Error as e:
        pytest.skip(f"no {backend} drafter here: {e}")


def drafts(d, chunks, out="numpy", stream=None):
    sessions = [d.open_session(), d.open_session()]
    results = []
    for step in range(2):
        entries = [{"session": s, "anchor": 3 + i, "taps": chunks[2 * step + i], "temperature": 0.8, "seed": 7,
                    "dist": 4} for i, s in enumerate(sessions)]
        if stream is not None:
            for e in entries:
                e["stream"] = stream
        results += d.step(entries, out=out)
    for s in sessions:
        d.close_session(s)
    return results


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_tensors_on_a_side_stream(ck, dtype):
    d = open_drafter(ck, "cuda")
    rng = np.random.default_rng(1)
    host = [torch.from_numpy(rng.standard_normal((n, d.caps.taps_width)).astype(np.float32)).to(getattr(torch, dtype))
            for n in [5, 3, 2, 4]]
    reference = drafts(d, [t.float().numpy() for t in host])
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        # Written on the side stream, still in flight when the step begins: the drafter waits for it.
        torch.cuda._sleep(50_000_000)
        device = [t.to("cuda", non_blocking=True) * 1 for t in host]
        got = drafts(d, device, out="torch")
    for r, ref in zip(got, reference):
        for key in ref:
            assert r[key].device == device[0].device
            np.testing.assert_array_equal(r[key].cpu().numpy(), ref[key], err_msg=key)
    # An explicit stream, given as torch's object and as its pointer.
    with torch.cuda.stream(side):
        device = [t.to("cuda") for t in host]
    for stream in (side, side.cuda_stream):
        for r, ref in zip(drafts(d, device, stream=stream), reference):
            np.testing.assert_array_equal(r["tokens"], ref["tokens"])
    d.close()


def test_a_cuda_tensor_given_to_a_cpu_drafter_is_refused(ck):
    d = open_drafter(ck, "cpu")
    s = d.open_session()
    with pytest.raises(ValueError, match="entry 'taps' lies on cuda:0, but this drafter runs on the cpu backend"):
        d.step([{"session": s, "anchor": 1, "taps": torch.zeros(2, d.caps.taps_width, device="cuda")}])
    assert d.session_length(s) == 0
    d.close()
