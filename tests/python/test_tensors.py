"""Taps given as tensors of any framework (DLPack, the CUDA array interface) draft exactly what the
f32 numpy path drafts on the same values: torch f32 / f16 / bf16 and numpy through __dlpack__,
strided tensors included; device tensors given to a CPU drafter or a client are refused by name;
out='torch' gives the same results as torch tensors."""

import numpy as np
import pytest
import tpdraft

torch = pytest.importorskip("torch")


def open_drafter(ck):
    return tpdraft.Drafter(str(ck / "drafter"), str(ck / "target"), backend="cpu", threads=1)


def random_taps(d, rows, seed):
    return np.random.default_rng(seed).standard_normal((rows, d.caps.taps_width)).astype(np.float32)


def drafts(d, chunks, out="numpy"):
    """Two steps of two sessions fed `chunks` (four tap matrices), sampled with q and a
    distribution, so that every value of the taps shows in what comes back."""
    sessions = [d.open_session(), d.open_session()]
    results = []
    for step in range(2):
        entries = [{"session": s, "anchor": 3 + i, "taps": chunks[2 * step + i], "temperature": 0.8, "seed": 7,
                    "dist": 4} for i, s in enumerate(sessions)]
        results += d.step(entries, out=out)
    for s in sessions:
        d.close_session(s)
    return results


def same(results, reference):
    for r, ref in zip(results, reference):
        for key in ref:
            np.testing.assert_array_equal(np.asarray(r[key]), ref[key], err_msg=key)


@pytest.fixture
def drafter(checkpoint):
    with open_drafter(checkpoint()) as d:
        yield d


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_tensors_draft_as_the_f32_numpy_path(drafter, dtype):
    chunks = [random_taps(drafter, n, seed) for seed, n in enumerate([5, 3, 2, 4])]
    tensors = [torch.from_numpy(c).to(getattr(torch, dtype)) for c in chunks]
    # The f32 path on the same values: bf16 and f16 convert to f32 exactly.
    reference = drafts(drafter, [t.float().numpy() for t in tensors])
    same(drafts(drafter, tensors), reference)
    if dtype != "float32":
        # The rounding matters: the f32 values before it draft differently.
        assert any((np.asarray(a["dist_probs"]) != b["dist_probs"]).any()
                   for a, b in zip(drafts(drafter, chunks), reference))


def test_numpy_through_dlpack_and_strided_tensors(drafter):
    chunks = [random_taps(drafter, n, 10 + n) for n in [4, 1, 3, 2]]
    reference = drafts(drafter, chunks)

    class DLPackOnly:  # a framework's tensor known only by the protocol
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    same(drafts(drafter, [DLPackOnly(c) for c in chunks]), reference)
    # Transposed views (column-major) and every other row of a larger tensor.
    same(drafts(drafter, [torch.from_numpy(np.ascontiguousarray(c.T)).T for c in chunks]), reference)
    wide = [torch.from_numpy(np.repeat(c, 2, axis=0))[::2] for c in chunks]
    assert not wide[0].is_contiguous()
    same(drafts(drafter, wide), reference)
    bf16 = [torch.from_numpy(np.ascontiguousarray(c.T)).to(torch.bfloat16).T for c in chunks]
    same(drafts(drafter, bf16), drafts(drafter, [t.float().contiguous().numpy() for t in bf16]))


def test_out_torch(drafter):
    chunks = [random_taps(drafter, 2, seed) for seed in range(4)]
    reference = drafts(drafter, chunks)
    results = drafts(drafter, [torch.from_numpy(c) for c in chunks], out="torch")
    for r in results:
        assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in r.values())
    assert results[0]["tokens"].dtype == torch.int64 and results[0]["q"].dtype == torch.float32
    same(results, reference)
    s = drafter.open_session()
    with pytest.raises(ValueError, match="out is 'jax', expected 'numpy' or 'torch'"):
        drafter.step([{"session": s, "anchor": 1}], out="jax")
    assert drafter.session_length(s) == 0


class FakeCudaDLPack:
    """Claims to live on a GPU; a CPU drafter must refuse it before asking for its capsule."""

    def __dlpack_device__(self):
        return (2, 1)

    def __dlpack__(self, stream=None):
        raise AssertionError("the capsule of a tensor the drafter cannot read was asked for")


class FakeCudaArray:
    __cuda_array_interface__ = {"shape": (2, 192), "typestr": "<f4", "data": (0xdead0000, False), "version": 3}


@pytest.mark.parametrize("tensor, where", [(FakeCudaDLPack(), "cuda:1"),
                                           (FakeCudaArray(), r"a CUDA device \(__cuda_array_interface__\)")])
def test_device_tensors_are_refused_by_a_cpu_drafter(drafter, tensor, where):
    s = drafter.open_session()
    with pytest.raises(ValueError, match=f"entry 'taps' lies on {where}, but this drafter runs on the cpu backend"):
        drafter.step([{"session": s, "anchor": 1, "taps": tensor}])
    assert drafter.session_length(s) == 0


def test_wrong_tensors_name_the_problem(drafter):
    s = drafter.open_session()
    w = drafter.caps.taps_width
    cases = [(torch.zeros(2, w, dtype=torch.int32), TypeError, "f32, f16 or bf16 values, got DLPack dtype code 0"),
             (torch.zeros(2, w, dtype=torch.float64), TypeError, "got DLPack dtype code 2 of 64 bits"),
             (torch.zeros(2, w + 1), ValueError, rf"must be \[n_new, {w}\], got shape \(2, {w + 1}\)"),
             (torch.zeros(w), ValueError, rf"got shape \({w}\)"),
             (torch.full((1, w), float("nan")), tpdraft.ArgumentError, "NaN")]
    for tensor, error, message in cases:
        with pytest.raises(error, match=message):
            drafter.step([{"session": s, "anchor": 1, "taps": tensor}])
    with pytest.raises(TypeError, match="entry 'stream' must be a CUDA stream"):
        drafter.step([{"session": s, "anchor": 1, "taps": torch.zeros(1, w), "stream": "now"}])
    assert drafter.session_length(s) == 0


def test_reprs(drafter):
    c = drafter.caps
    assert repr(c).startswith(f"Caps(architecture='{c.architecture}', backend='cpu', block_size={c.block_size}, ")
    assert f"target_layer_ids={c.target_layer_ids}" in repr(c)
    assert repr(drafter) == (f"<tpdraft.Drafter {c.architecture} on cpu, tp 1, block {c.block_size}, "
                             f"taps_width {c.taps_width}>")
    assert type(drafter).__module__ == "tpdraft" and tpdraft.ArgumentError.__module__ == "tpdraft"
    drafter.close()
    assert repr(drafter) == "<tpdraft.Drafter (closed)>"
