#!/usr/bin/python3
"""Top-1 agreement of the trained DFlash 1 drafter's int8-activation (W8A8) drafts with a float64
reference on the same int8 weights, on held-out source: the pair's target makes the taps (f64),
`tpdraft quantize --bits 8` makes the int8 drafter, train/dflash.py's forward over its
dequantized weights in float64 is the reference, and every drafted row's token (DFlash 1 rows are
independent: each is its row's argmax) is compared with the reference's argmax. Two more runs
against the same reference show what the count can tell: the bf16 drafter (weight rounding
only) and an int4 one (groups of 128).

  bench/pair_w8a8_top1.py [--build build] [--files 8] [--stride 7]"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))
sys.path.insert(0, os.path.join(REPO, "train"))
PROMPT = 480  # tokens per prompt; anchors from 40 to PROMPT - 10


def safetensors(path):
    """{name: (numpy array as stored, dtype name)}."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    kinds = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "I64": np.int64}
    out = {}
    for name, info in header.items():
        dt = kinds[info["dtype"]]
        begin, end = info["data_offsets"]
        a = np.frombuffer(raw, dtype=dt, count=(end - begin) // np.dtype(dt).itemsize, offset=8 + n + begin)
        out[name] = (a.reshape(info["shape"]), info["dtype"])
    return out


def f64(a, dtype):
    return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64) if dtype == "BF16" else a.astype(np.float64)


def dequantized(path):
    """The int8 pack-quantized checkpoint's tensors in float64, each int8 matrix as q * scale."""
    t = safetensors(path)
    out = {}
    for name, (a, dtype) in t.items():
        if name.endswith(".weight_packed"):
            m = name[:-len(".weight_packed")]
            rows, cols = (int(v) for v in t[m + ".weight_shape"][0])
            words = a.view(np.uint32)
            q = np.stack([(words >> (8 * j)) & 0xFF for j in range(4)], -1).reshape(rows, -1)[:, :cols]
            scale = f64(*t[m + ".weight_scale"]).reshape(rows, -1)
            out[m + ".weight"] = torch.from_numpy((q.astype(np.int64) - 128) * np.repeat(scale, cols // scale.shape[1], 1))
        elif not name.endswith((".weight_scale", ".weight_shape")):
            out[name] = torch.from_numpy(f64(a, dtype))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--files", type=int, default=8, help="held-out files, one prompt each")
    p.add_argument("--stride", type=int, default=7, help="positions between anchors")
    a = p.parse_args()
    sys.path.insert(0, os.path.join(a.build, "python"))
    import dflash
    import tpdraft
    import trained_pair
    from common import read_safetensors
    pair = trained_pair.Pair(arch="dflash")
    with tempfile.TemporaryDirectory(prefix="tpdraft-w8a8-") as tmp:
        made = {}
        for bits in (8, 4):
            made[bits] = os.path.join(tmp, f"int{bits}")
            subprocess.run([os.path.join(a.build, "tpdraft"), "quantize", "--drafter", pair.drafter_dir,
                            "--out", made[bits], "--bits", str(bits)], check=True, stdout=subprocess.DEVNULL)
        config = dict(pair.drafter_config)
        config.pop("tpdraft_training", None)
        table = read_safetensors(os.path.join(pair.target_dir, "model.safetensors"), torch)["model.embed_tokens.weight"]
        model = dflash.Drafter(config, table).double()
        model.load_state_dict(dequantized(os.path.join(made[8], "model.safetensors")))
        target = pair.target(torch.float64)
        cases = []
        for path in trained_pair.heldout_files()[:a.files]:
            prompt = trained_pair.prompts_from(trained_pair.read_source(path), pair.tokenizer, 1, PROMPT, path)[0]
            logits, taps = target.forward_all([prompt], pair.taps)
            for at in range(40, PROMPT - 10, a.stride):
                anchor = int(logits[0, at - 1].argmax())
                with torch.no_grad():
                    _, rows = model(torch.from_numpy(taps[:, :at + 9].astype(np.float64)),
                                    torch.tensor([prompt[:at] + [anchor] + [0] * 8]), torch.tensor([[at]]))
                cases.append((taps[0, :at].astype(np.float32), anchor, rows[0, 0].argmax(-1).tolist()))
        report = {}
        for label, drafter in (("int8 weights, int8 activations", made[8]), ("bf16 drafter", pair.drafter_dir),
                               ("int4 weights, int8 activations", made[4])):
            same = total = 0
            with tpdraft.Drafter(drafter, pair.target_dir, backend="cpu", threads=1) as d:
                for rows_taps, anchor, want in cases:
                    s = d.open_session()
                    got = d.step([{"session": s, "keep": 0, "taps": rows_taps, "anchor": anchor}])[0]["tokens"].tolist()
                    d.close_session(s)
                    same += sum(int(x == y) for x, y in zip(got, want))
                    total += len(want)
            report[label] = {"same": same, "rows": total, "agreement": same / total}
            print(f"{label}: {same} of {total} rows agree with the float64 int8 reference ({100 * same / total:.1f}%)")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
