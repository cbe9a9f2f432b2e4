#!/usr/bin/env python3
"""Part of scripts/gpu-check.sh: where a draft's GPU time goes, kernel by kernel.

    kernel-table.py SHORT.csv LONG.csv DRAFTS BENCH.json OUT.csv

SHORT and LONG are per-kernel totals of the same benchmark run twice, LONG timing DRAFTS more
drafts than SHORT (everything else, settle and warm-up included, is the same in both, so the
difference is DRAFTS drafts). Each is either the check's CUPTI trace (kernel,calls,total_ns) or
nsys's cuda_gpu_kern_sum report as CSV (Name, Instances, Total Time (ns)). BENCH.json is a line
of `tpdraft bench --json` from the same geometry: the bytes a draft reads and the measured copy
bandwidth give each class of kernel its floor.

Writes OUT.csv: kernel, class, calls per draft, microseconds per draft, share of the GPU time,
and the class's bytes per draft and floor in microseconds (the floor of a class is its bytes at
the copy bandwidth: GEMMs read the weights, attention the context cache; the rest moves
activations only, so launches bound it, and collectives have no floor here). Prints the five most
expensive kernels against their class's floor, then one line per class.
"""
import csv
import json
import sys

# The first pattern a lower-cased kernel name contains decides its class.
CLASSES = [
    ("nccl", ("nccl",)),
    ("attention", ("attention", "attn", "flash")),
    ("select", ("topk", "top_k", "argmax", "select", "sample", "bitonic")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "matmul", "splitk", "split_k", "cublas")),
]


def kernel_class(name):
    low = name.lower()
    for cls, patterns in CLASSES:
        if any(p in low for p in patterns):
            return cls
    return "other"


def read_totals(path):
    """{kernel: (calls, total_ns)} from the CUPTI trace or an nsys kernel summary."""
    out = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if "kernel" in r:
                name, calls, ns = r["kernel"], int(r["calls"]), float(r["total_ns"])
            else:
                name, calls, ns = r["Name"], int(r["Instances"]), float(r["Total Time (ns)"])
            c0, n0 = out.get(name, (0, 0.0))
            out[name] = (c0 + calls, n0 + ns)
    return out


def per_draft(short, long, drafts):
    """[(kernel, calls per draft, us per draft)], most expensive first; kernels that ran as
    often in both runs (settle, the ceilings' own kernels) drop out."""
    rows = []
    for name, (calls, ns) in long.items():
        c0, n0 = short.get(name, (0, 0.0))
        dc, dns = calls - c0, ns - n0
        if dc <= 0:
            continue
        rows.append((name, dc / drafts, max(dns, 0.0) / drafts / 1e3))
    rows.sort(key=lambda r: -r[2])
    return rows


def class_floors(bench):
    """{class: (bytes per draft, floor us)} from a bench --json line."""
    bw = bench["machine_read_gbps"] * 1e9
    weights = bench["draft_weight_gbytes"] * 1e9
    context = max(bench["draft_gbytes"] * 1e9 - weights, 0.0)
    return {"gemm": (weights, weights / bw * 1e6), "attention": (context, context / bw * 1e6)}


def table(rows, floors):
    total = sum(us for _, _, us in rows) or 1.0
    out = []
    for name, calls, us in rows:
        cls = kernel_class(name)
        nbytes, floor = floors.get(cls, (None, None))
        out.append({"kernel": name, "class": cls, "calls_per_draft": round(calls, 3), "us_per_draft": round(us, 3),
                    "share": round(us / total, 4), "class_bytes_per_draft": "" if nbytes is None else int(nbytes),
                    "class_floor_us": "" if floor is None else round(floor, 3)})
    return out


def summary_lines(out):
    lines = []
    for r in out[:5]:
        floor = f'class floor {r["class_floor_us"]:.1f} us' if r["class_floor_us"] != "" else "no floor (launch bound)"
        if r["class"] == "nccl":
            floor = "communication"
        lines.append(f'{r["us_per_draft"]:9.1f} us {100 * r["share"]:4.0f}%  x{r["calls_per_draft"]:<6g} '
                     f'[{r["class"]}; {floor}] {r["kernel"][:90]}')
    by_class = {}
    for r in out:
        c = by_class.setdefault(r["class"], [0.0, 0.0, r["class_floor_us"]])
        c[0] += r["us_per_draft"]
        c[1] += r["calls_per_draft"]
    for cls, (us, calls, floor) in sorted(by_class.items(), key=lambda kv: -kv[1][0]):
        vs = f", {us / floor:.2f}x its floor {floor:.1f} us" if floor not in ("", 0) else ""
        lines.append(f"class {cls:<10} {us:9.1f} us in {calls:g} launches per draft{vs}")
    return lines


def main(argv):
    if len(argv) != 6 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    short, long = read_totals(argv[1]), read_totals(argv[2])
    drafts = int(argv[3])
    with open(argv[4]) as f:
        bench = json.loads([line for line in f.read().splitlines() if line.startswith("{")][-1])
    out = table(per_draft(short, long, drafts), class_floors(bench))
    with open(argv[5], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["kernel", "class", "calls_per_draft", "us_per_draft", "share",
                                          "class_bytes_per_draft", "class_floor_us"])
        w.writeheader()
        w.writerows(out)
    for line in summary_lines(out):
        print(line)
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
