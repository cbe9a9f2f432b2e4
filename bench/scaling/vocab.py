#!/usr/bin/env python3
"""The head at large vocabularies (OUT/vocab.md, .json): the bytes of the candidate exchange against a
full-logits all-gather as `tpdraft info --json` counts them, the head time `tpdraft bench` measured
on configs that differ only in vocab_size, both exchanges measured (runs with and without
--gather-logits) and projected on NVLink, InfiniBand and this machine's CPU MPI."""

import argparse
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import commmodel as cm  # noqa: E402
import compute  # noqa: E402
import geometry  # noqa: E402
import records  # noqa: E402
import tables as tb  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the config the study varies (only vocab_size changes)")
    p.add_argument("--vocab", type=tb.ints, default="151936,202048,248320", help="comma list of vocabulary sizes")
    p.add_argument("--records", help="records.jsonl with the study's runs (study = vocab)")
    p.add_argument("--params", default=cm.default_params_path(), help="comm-model.json")
    p.add_argument("--sessions", type=int, help="sessions per draft (default: those of the records, else 1)")
    p.add_argument("--tp", type=tb.ints, default="2,4,8,16", help="tp sizes of the byte and projection tables")
    p.add_argument("--gpus-per-node", type=int, default=8, help="tp above this spans nodes (InfiniBand between them)")
    p.add_argument("--out", help="directory for vocab.md and vocab.json (default: print only)")
    p.add_argument("--bin", help="the tpdraft binary that answers `info --json` (default: build/tpdraft)")
    return p.parse_args(argv)


def bytes_rows(answers):
    """Per (V, tp): the exact bytes of both exchanges, from the info answers {(V, tp): answer}."""
    rows = []
    for (v, tp), ans in sorted(answers.items()):
        cand, full, rows_ = geometry.candidates_block(ans), geometry.full_logits_block(ans), geometry.draft_rows(ans)
        rows.append({"vocab": v, "tp": tp, "vocab_padded": ans["vocab_padded"], "draft_rows": rows_,
                     "k": geometry.candidates(ans), "head_bytes_per_rank": geometry.head_bytes(ans),
                     "candidates_block": cand, "candidates_total": cand * tp, "full_block": full,
                     "full_total": full * tp, "full_unpadded_total": rows_ * v * 4})
    return rows


def study_points(runs, vocabs, b):
    """The study's runs at b sessions, one per point (config, tp, … and gather flag)."""
    return [r for r in records.dedupe(runs) if r.vocab_size in vocabs and r.sessions == b]


def measured_rows(runs, paths, info, b):
    """The default (candidate-exchange) runs: the head's time and read rate per (V, tp)."""
    rows = []
    for r in [r for r in study_points(runs, paths, b) if not r.gather_logits]:
        ans = info.query(paths[r.vocab_size], r.tp, b, r.context, r.dtype)
        rows.append({"vocab": r.vocab_size, "tp": r.tp, "backend": r.backend, "oversubscribed": r.oversubscribed,
                     "shared": records.shared_reasons(r), "head_ms": r.head_ms, "draft_ms": r.draft_ms,
                     "comm_ms": r.comm_ms, "head_share": r.head_ms / r.draft_ms,
                     "head_gbps": geometry.head_bytes(ans) / (r.head_ms * 1e-3) / 1e9,
                     "all_gather_bytes": r.collectives["all_gather"][1]})
    return sorted(rows, key=lambda x: (x["vocab"], x["tp"]))


def side_of(run):
    return {"draft_ms": run.draft_ms, "comm_ms": run.comm_ms, "head_ms": run.head_ms,
            "all_gather_calls": run.collectives["all_gather"][0], "all_gather_bytes": run.collectives["all_gather"][1]}


def gather_rows(runs, paths, info, b):
    """Each tp >= 2 point run both ways: the default candidate exchange and the same draft with the
    full logits all-gathered (`--gather-logits`), side by side with their differences. The full
    path's all-gather bytes hold both gathers; their difference is the full-logits block."""
    pairs = {}
    for r in [r for r in study_points(runs, paths, b) if r.tp >= 2]:
        key = (r.vocab_size, r.tp, r.backend, r.context, r.threads)
        pairs.setdefault(key, {})["full" if r.gather_logits else "cand"] = r
    rows = []
    for (v, tp, backend, ctx, threads), pair in sorted(pairs.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2:]))):
        row = {"vocab": v, "tp": tp, "backend": backend, "context": ctx, "threads": threads,
               "oversubscribed": any(r.oversubscribed for r in pair.values()),
               "shared": sorted({x for r in pair.values() for x in records.shared_reasons(r)}),
               "full_block_model": geometry.full_logits_block(info.query(paths[v], tp, b, ctx)),
               **{side: side_of(pair[side]) if side in pair else None for side in ("cand", "full")}}
        if row["cand"] and row["full"]:
            row["diff"] = {k: row["full"][k] - row["cand"][k] for k in ("draft_ms", "comm_ms", "all_gather_bytes")}
        rows.append(row)
    return rows


def signed_ms(x):
    return ("+" if x >= 0 else "−") + tb.fmt_ms(abs(x))


def nbytes(x):
    return f"{x:,.0f} B"


def gather_table(grows):
    # Per figure: its column name, its key in a side, the format of a side and of the difference.
    figures = (("draft ms", "draft_ms", tb.fmt_ms, signed_ms), ("comm ms", "comm_ms", tb.fmt_ms, signed_ms),
               ("all-gather B/rank", "all_gather_bytes", nbytes, lambda x: f"{x:+,.0f} B"))

    def cells(r, key, fmt, diff_fmt):
        """Both sides of one figure and their difference ("–" for a side not run)."""
        sides = ["–" if r[side] is None else fmt(r[side][key]) for side in ("cand", "full")]
        return sides + [diff_fmt(r["diff"][key]) if "diff" in r else "–"]

    header = [h for name, *_ in figures for h in (f"{name}: candidates", f"{name}: full logits", f"Δ {name}")]
    out = [[r["vocab"], f"{r['tp']}{tb.flags(r)}", r["backend"], *(c for _, *f in figures for c in cells(r, *f)),
            nbytes(r["full_block_model"])] for r in grows]
    return tb.md_table(["V", "tp", "backend", *header, "model: M'·(Vp/tp)·4"], out)


def projected_rows(brows, fabrics, machine, per_node):
    """Both exchanges through the fabric a tp lands on, beside the head's HBM time per rank."""
    rows = []
    for br in brows:
        tp = br["tp"]
        nodes = max(1, -(-tp // per_node))
        row = {"vocab": br["vocab"], "tp": tp, "nodes": nodes, "head_hbm_ms": br["head_bytes_per_rank"] / machine.bw * 1e3}
        row.update({name: {f"{x}_ms": 1e3 * cm.collective_time("all_gather", br[f"{x}_block"], tp, intra, inter, nodes)
                           for x in ("candidates", "full")}
                    for name, (intra, inter, multi_ok) in fabrics.items() if nodes == 1 or multi_ok})
        rows.append(row)
    return rows


def bytes_table(brows):
    return tb.md_table(
        ["V", "tp", "Vp", "head weights/rank (bf16)", "candidates: sent/rank", "candidates: gathered",
         "full logits: sent/rank", "full logits: gathered (M'·V·4)", "full / candidates"],
        [[r["vocab"], r["tp"], r["vocab_padded"], tb.fmt_bytes(r["head_bytes_per_rank"]), nbytes(r["candidates_block"]),
          nbytes(r["candidates_total"]), nbytes(r["full_block"]),
          f"{nbytes(r['full_total'])} ({nbytes(r['full_unpadded_total'])})",
          # no candidates travel at tp 1
          f"{r['full_total'] / r['candidates_total']:.0f}x" if r["candidates_total"] else "–"] for r in brows])


def measured_table(mrows):
    if not mrows:
        return "(no vocabulary-study records: run `launch/scale.sh` with `--vocab`)"
    return tb.md_table(
        ["V", "tp", "backend", "head ms", "draft ms", "head share", "head weights GB/s", "all-gather bytes/rank (measured)"],
        [[r["vocab"], f"{r['tp']}{tb.flags(r)}", r["backend"], tb.fmt_ms(r["head_ms"]), tb.fmt_ms(r["draft_ms"]),
          tb.fmt_pct(r["head_share"]), f"{r['head_gbps']:.3g}", nbytes(r["all_gather_bytes"])] for r in mrows])


def projected_table(prows, names, machine):
    header = ["V", "tp", f"head HBM ms ({machine.label})"]
    header += [f"{n}: {x}" for n in names for x in ("candidates", "full logits")]
    table = []
    for r in prows:
        row = [r["vocab"], r["tp"], tb.fmt_ms(r["head_hbm_ms"])]
        for n in names:
            row += [tb.fmt_ms(r[n]["candidates_ms"]), tb.fmt_ms(r[n]["full_ms"])] if n in r else ["–", "–"]
        table.append(row)
    return tb.md_table(header, table)


GATHER_TEXT = (
    "Each tp >= 2 point run twice: the default draft (candidate exchange) and the same draft with "
    "`--gather-logits`, which also all-gathers every rank's padded [M', Vp/tp] f32 logits slice so that "
    "each rank holds the whole [M', V]. Medians per draft (rank 0); all-gather bytes are what one rank "
    "sends per draft, and the full path's hold both gathers, so their difference should equal the "
    "model's M'·(Vp/tp)·4. The full path also writes the head's logits to memory (instead of the fused "
    "top-k), copies the hidden rows out and assembles the gathered logits: Δ draft ms holds that work "
    "besides Δ comm ms.")


def report(a, brows, mrows, grows, prows, fabrics, machine, inter):
    r0 = brows[0]
    md = ["# The head at large vocabularies", "",
          f"Base config `{os.path.basename(a.base)}` (k = {r0['k']} candidates per row), M' = {r0['draft_rows']} draft "
          "rows per draft. Bytes as `tpdraft info --json` counts them (src/model/cost.cpp). The default exchange "
          "all-gathers each rank's k best (value, id) pairs per row, 16 bytes each: M'·k·16 bytes sent per rank, "
          "M'·tp·k·16 received. A full-logits all-gather sends each rank's padded slice in f32: M'·(Vp/tp)·4 per rank, "
          "M'·Vp·4 received (Vp = V rounded up to a multiple of tp; M'·V·4 without the padding).", "",
          "## Bytes per draft (exact)", "", bytes_table(brows), "",
          "## Measured head time (`tpdraft bench`, head_ms: local head GEMM + top-k + candidate exchange + selector "
          "projection)", "", measured_table(mrows), "", "## Measured: candidates vs full-logits gather", "", GATHER_TEXT, ""]
    md.append(gather_table(grows) if grows else
              "(no pair of runs with and without `--gather-logits`: `launch/scale.sh --vocab` runs both at every "
              "vocab tp >= 2 when `tpdraft bench` offers the flag)")
    md += ["", f"## Projected exchange time per draft, ms (alpha-beta model, `{os.path.basename(a.params)}`)", "",
           f"tp above {a.gpus_per_node} spans nodes: NVLink inside, InfiniBand across (hierarchical all-gather). "
           f"Head HBM ms = this rank's head weights read once at {machine.label} HBM {machine.bw / 1e12:.3g} TB/s, "
           "the floor of the head's own time.", "", projected_table(prows, list(fabrics), machine), "",
           "Parameters: " + "; ".join(f"{f[0].describe()} ({f[0].source.rstrip('.')})" for f in fabrics.values())
           + f"; across nodes {inter.describe()} ({inter.source.rstrip('.')}).", ""]
    return "\n".join(md)


def main(argv=None):
    a = parse_args(argv)
    params = tb.read_json(a.params)
    d = params["defaults"]
    all_runs = records.read_runs(a.records) if a.records else []
    runs = [r for r in all_runs if r.study == "vocab"]
    b = a.sessions or (min(r.sessions for r in runs) if runs else 1)
    info = geometry.Info(a.bin)
    with tempfile.TemporaryDirectory(prefix="tpdraft-vocab-", ignore_cleanup_errors=True) as work_dir:
        paths = dict(geometry.write_vocab_configs(a.base, a.vocab, work_dir))
        dtype = geometry.info_dtype(d.get("weight_bytes", 2))
        answers = {(v, tp): info.query(path, tp, b, 1024, dtype) for v, path in paths.items()
                   for tp in a.tp if info.problem(path, tp) is None}
        machine = compute.gpu_machine(params, d["gpu"])
        intra, inter = (cm.fabric_range(params, d[side])["value"] for side in ("intra", "inter"))
        cpu = cm.cpu_fabric(records.scaling_runs(all_runs) or runs, params)  # the same fit as project.py
        fabrics = {f"{intra.label} (+ {inter.label} across nodes)": (intra, inter, True), cpu.label: (cpu, None, False)}
        brows = bytes_rows(answers)
        mrows, grows = measured_rows(runs, paths, info, b), gather_rows(runs, paths, info, b)
        prows = projected_rows(brows, fabrics, machine, a.gpus_per_node)
        text = report(a, brows, mrows, grows, prows, fabrics, machine, inter)
    tb.emit_report(text, {"sessions": b, "bytes": brows, "measured": mrows, "measured_gather": grows,
                          "projected": prows}, a.out, "vocab")
    return 0


if __name__ == "__main__":
    sys.exit(main())
