#!/usr/bin/env python3
"""Part of scripts/gpu-check.sh: the table of the timed drafts.

Reads LOGS/bench-graph.out and LOGS/bench-op.out (`tpdraft bench --json`, graphs on and off)
and, when there, LOGS/torch.out (bench/torch_draft.py --json); prints one line per figure:
the draft times, their phases, the memory floor (the bytes a draft must read at the measured
copy bandwidth) and the draft's ratio to it, the graph's node count, the settle rate against
cuBLAS, PyTorch's time, and whether both modes drafted the same tokens. Exit 1 when they did
not or when the graph run is missing.

With --draft-ms LOGS NAME[=LABEL]...: one line with the draft time of each LOGS/NAME.out run
and its ratio to the first (the bf16 / --quant q8 / --quant q4 timing step); "not run" for a
missing one.

With --by-context LOGS NAME...: the draft time at each context of every JSON line of the
LOGS/NAME.out files, one line per attention kernel where the lines name one
("attention_kernel"), else one line.
"""
import json
import os
import sys


def all_json(logs, name):
    path = os.path.join(logs, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f.read().splitlines() if line.startswith("{")]


def last_json(logs, name):
    runs = all_json(logs, name)
    return runs[-1] if runs else None


def spread(r):
    return f'{r["draft_ms"]:.3f} ms (p10..p90 {r["draft_ms_p10"]:.3f}..{r["draft_ms_p90"]:.3f})'


def rows(on, off, torch):
    floor_ms = on["draft_gbytes"] / on["machine_read_gbps"] * 1e3
    out = [
        ("draft, graph replay", f'{spread(on)}; {on["replayed_drafts"]} replayed, {on["graph_nodes"]} graph nodes'),
        ("draft, op by op", spread(off) if off else "not run"),
        ("phases (graph)", f'layers {on["layers_ms"]:.3f} ms, head {on["head_ms"]:.3f} ms, '
                           f'selection {on["select_ms"]:.3f} ms'),
        ("memory floor", f'{floor_ms:.3f} ms ({on["draft_gbytes"]:.3f} GB at the measured '
                         f'{on["machine_read_gbps"]:.0f} GB/s copy)'),
        ("draft / floor", f'{on["draft_ms"] / floor_ms:.2f}x (goal <= 1.3x)'),
        ("achieved", f'{on["achieved_gbps"]:.0f} GB/s = {100 * on["achieved_gbps"] / on["machine_read_gbps"]:.0f}% '
                     f'of copy bandwidth; {on["achieved_gflops"]:.0f} GFLOP/s'),
    ]
    settle = f'{on["settle_rows_per_s"]:.0f} rows/s, {on["settle_gflops"]:.0f} GFLOP/s'
    if "settle_fraction_of_cublas" in on:
        settle += (f' = {100 * on["settle_fraction_of_cublas"]:.0f}% of cuBLAS {on["cublas_gemm_gflops_peak"]:.0f} '
                   f'GFLOP/s ({on["cublas_gemm_gflops_settle_shape"]:.0f} at the fc shape)')
    out.append(("settle", settle))
    if torch:
        out.append(("torch bf16 eager", f'{torch["draft_ms_median"]:.3f} ms (min {torch["draft_ms_min"]:.3f}, '
                                        f'torch {torch["torch"]})'))
        out.append(("torch / tpdraft", f'{torch["draft_ms_median"] / on["draft_ms"]:.2f}x (goal >= 1.5x)'))
    out.append(("tokens", " ".join(str(t) for t in on["tokens"])))
    if off:
        same = on["tokens"] == off["tokens"]
        out.append(("graph = op by op", "yes" if same else "NO: the two modes drafted different tokens"))
    return out


def draft_ms(logs, names):
    """NAME or NAME=LABEL per run: 'LABEL x.xxx ms (r.rrx)', the ratio to the first run."""
    runs = [(label or name, last_json(logs, name + ".out"))
            for name, _, label in (item.partition("=") for item in names)]
    base = runs[0][1]["draft_ms"] if runs[0][1] else None
    parts = []
    for i, (label, r) in enumerate(runs):
        if r is None:
            parts.append(f"{label} not run")
        elif base and i > 0:
            parts.append(f'{label} {r["draft_ms"]:.3f} ms ({r["draft_ms"] / base:.2f}x)')
        else:
            parts.append(f'{label} {r["draft_ms"]:.3f} ms')
    return ", ".join(parts)


def by_context(logs, names):
    """'[LABEL: ]CTX ms, ...' lines: the draft time at each context, per attention kernel."""
    kernels = {}
    for name in names:
        for r in all_json(logs, name + ".out"):
            kernels.setdefault(r.get("attention_kernel", ""), {})[r["context"]] = r["draft_ms"]
    lines = []
    for label, times in kernels.items():
        parts = ", ".join(f"{ctx}: {ms:.3f} ms" for ctx, ms in sorted(times.items()))
        lines.append(f"{label}: {parts}" if label else parts)
    return "\n".join(lines) if lines else "not run"


def main(argv):
    if len(argv) >= 4 and argv[1] == "--draft-ms":
        print(draft_ms(argv[2], argv[3:]))
        return 0
    if len(argv) >= 4 and argv[1] == "--by-context":
        print(by_context(argv[2], argv[3:]))
        return 0
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nUsage: gpu-table.py LOGS | gpu-table.py --draft-ms LOGS NAME[=LABEL]... | "
              "gpu-table.py --by-context LOGS NAME...")
        return 0 if len(argv) == 2 else 2
    logs = argv[1]
    on, off, torch = (last_json(logs, n) for n in ("bench-graph.out", "bench-op.out", "torch.out"))
    if on is None:
        print("no graph run (bench-graph.out) to tabulate")
        return 1
    for name, value in rows(on, off, torch):
        print(f"{name:<24} {value}")
    return 1 if off and on["tokens"] != off["tokens"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
