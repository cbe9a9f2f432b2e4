#!/usr/bin/env python3
"""The head at large vocabularies: bytes of the default candidate exchange (an all-gather of
M'·tp·k pairs of 16 bytes) against a full-logits all-gather (M'·Vp·4 bytes), exact; the head time
measured by `tpdraft bench` on configs that differ only in vocab_size; both exchanges measured
(the same points run with and without `--gather-logits`) and projected on NVLink, InfiniBand and
this machine's CPU MPI. Writes OUT/vocab.md and OUT/vocab.json."""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scalelib as sl  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the config the study varies (only vocab_size changes)")
    p.add_argument("--vocab", default="151936,202048,248320", help="comma list of vocabulary sizes")
    p.add_argument("--records", help="records.jsonl with the study's runs (study = vocab)")
    p.add_argument("--params", default=sl.default_params_path(), help="comm-model.json")
    p.add_argument("--sessions", type=int, help="sessions per draft (default: those of the records, else 1)")
    p.add_argument("--tp", default="2,4,8,16", help="tp sizes of the byte and projection tables")
    p.add_argument("--gpus-per-node", type=int, default=8, help="tp above this spans nodes (InfiniBand between them)")
    p.add_argument("--out", help="directory for vocab.md and vocab.json (default: print only)")
    return p.parse_args(argv)


def geometry_with_vocab(base_path, v):
    with open(base_path) as f:
        cfg = json.load(f)
    cfg["vocab_size"] = v
    name = os.path.splitext(os.path.basename(base_path))[0]
    return sl.Geometry(cfg, f"{name}-v{v}")


def bytes_rows(geos, tps, b):
    rows = []
    for v, geo in geos.items():
        for tp in tps:
            if sl.tp_problem(geo, tp):
                continue
            s = sl.Shard(geo, tp)
            Md = b * (geo.B - 1)
            cand_block = Md * geo.candidates * sl.CANDIDATE_BYTES
            full_block = sl.full_logits_block(geo, tp, b)
            rows.append({"vocab": v, "tp": tp, "vocab_padded": s.vocab_padded, "draft_rows": Md, "k": geo.candidates,
                         "head_bytes_per_rank": s.vocab * geo.H * 2, "candidates_block": cand_block,
                         "candidates_total": cand_block * tp, "full_block": full_block, "full_total": full_block * tp,
                         "full_unpadded_total": Md * v * 4})
    return rows


def study_points(recs, geos, b):
    """The study's records at b sessions, one per point (config, tp, … and gather flag)."""
    return [r for r in sl.dedupe(recs) if r.get("vocab_size") in geos and r["sessions"] == b]


def measured_rows(recs, geos, b):
    """The default (candidate-exchange) runs: the head's time and read rate per (V, tp)."""
    rows = []
    for r in study_points(recs, geos, b):
        v = r["vocab_size"]
        if sl.gathers_logits(r):
            continue
        geo = geos[v]
        head_bytes = sl.Shard(geo, r["tp"]).vocab * geo.H * sl.dtype_bytes(r.get("dtype", "BF16"))
        rows.append({"vocab": v, "tp": r["tp"], "backend": r.get("backend", "cpu"), "oversubscribed": sl.oversubscribed(r),
                     "head_ms": r["head_ms"], "draft_ms": r["draft_ms"], "comm_ms": sl.comm_ms(r),
                     "head_share": r["head_ms"] / r["draft_ms"], "head_gbps": head_bytes / (r["head_ms"] * 1e-3) / 1e9,
                     "all_gather_bytes": r.get("all_gather_bytes", 0.0)})
    return sorted(rows, key=lambda x: (x["vocab"], x["tp"]))


def gather_rows(recs, geos, b):
    """Each tp >= 2 point run both ways: the default candidate exchange and the same draft with the
    full logits all-gathered (`--gather-logits`), side by side with their differences. The full
    path's all-gather bytes hold both gathers; their difference is the full-logits block."""
    pairs = {}
    for r in study_points(recs, geos, b):
        if r["tp"] < 2:
            continue
        key = (r["vocab_size"], r["tp"], r.get("backend", "cpu"), r.get("context"), r.get("threads"))
        pairs.setdefault(key, {})["full" if sl.gathers_logits(r) else "cand"] = r
    rows = []
    for (v, tp, backend, ctx, threads), pair in sorted(pairs.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2:]))):
        row = {"vocab": v, "tp": tp, "backend": backend, "context": ctx, "threads": threads,
               "oversubscribed": any(sl.oversubscribed(r) for r in pair.values()),
               "full_block_model": sl.full_logits_block(geos[v], tp, b)}
        for side in ("cand", "full"):
            r = pair.get(side)
            row[side] = None if r is None else {
                "draft_ms": r["draft_ms"], "comm_ms": sl.comm_ms(r), "head_ms": r.get("head_ms"),
                "all_gather_calls": r.get("all_gather_calls", 0.0), "all_gather_bytes": r.get("all_gather_bytes", 0.0)}
        if row["cand"] and row["full"]:
            row["diff"] = {k: row["full"][k] - row["cand"][k] for k in ("draft_ms", "comm_ms", "all_gather_bytes")}
        rows.append(row)
    return rows


def gather_table(grows):
    def side(r, name, key, fmt):
        return "–" if r[name] is None else fmt(r[name][key])

    def diff(r, key, fmt):
        return fmt(r["diff"][key]) if "diff" in r else "–"

    def signed_ms(x):
        return ("+" if x >= 0 else "−") + sl.fmt_ms(abs(x))

    def nbytes(x):
        return f"{x:,.0f} B"

    out = []
    for r in grows:
        out.append([r["vocab"], f"{r['tp']}" + (" (oversubscribed)" if r["oversubscribed"] else ""), r["backend"],
                    side(r, "cand", "draft_ms", sl.fmt_ms), side(r, "full", "draft_ms", sl.fmt_ms),
                    diff(r, "draft_ms", signed_ms),
                    side(r, "cand", "comm_ms", sl.fmt_ms), side(r, "full", "comm_ms", sl.fmt_ms),
                    diff(r, "comm_ms", signed_ms),
                    side(r, "cand", "all_gather_bytes", nbytes), side(r, "full", "all_gather_bytes", nbytes),
                    diff(r, "all_gather_bytes", lambda x: f"{x:+,.0f} B"), nbytes(r["full_block_model"])])
    return sl.md_table(["V", "tp", "backend", "draft ms: candidates", "draft ms: full logits", "Δ draft ms",
                        "comm ms: candidates", "comm ms: full logits", "Δ comm ms", "all-gather B/rank: candidates",
                        "all-gather B/rank: full logits", "Δ all-gather B/rank", "model: M'·(Vp/tp)·4"], out)


def projected_rows(brows, fabrics, machine, per_node):
    """Both exchanges through the fabric a tp lands on, beside the head's HBM time per rank."""
    rows = []
    for br in brows:
        tp = br["tp"]
        nodes = max(1, -(-tp // per_node))
        row = {"vocab": br["vocab"], "tp": tp, "nodes": nodes,
               "head_hbm_ms": br["head_bytes_per_rank"] / machine.bw * 1e3}
        for name, (intra, inter, multi_ok) in fabrics.items():
            if nodes > 1 and not multi_ok:
                continue
            cand = sl.collective_time("all_gather", br["candidates_block"], tp, intra, inter, nodes) * 1e3
            full = sl.collective_time("all_gather", br["full_block"], tp, intra, inter, nodes) * 1e3
            row[name] = {"candidates_ms": cand, "full_ms": full}
        rows.append(row)
    return rows


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    params = sl.load_params(a.params)
    d = params["defaults"]
    recs = [r for r in sl.read_records(a.records) if r.get("study") == "vocab"] if a.records else []
    vocabs = [int(x) for x in a.vocab.split(",") if x.strip()]
    geos = {v: geometry_with_vocab(a.base, v) for v in vocabs}
    b = a.sessions or (min(r["sessions"] for r in recs) if recs else 1)
    tps = [int(x) for x in a.tp.split(",") if x.strip()]
    machine = sl.gpu_machine(params, d["gpu"])
    intra = sl.fabric_from_params(d["intra"], params["fabrics"][d["intra"]])
    inter = sl.fabric_from_params(d["inter"], params["fabrics"][d["inter"]])
    scaling = sl.scaling_records(sl.read_records(a.records)) if a.records else []
    cpu = sl.cpu_fabric(scaling or recs, params)  # the same fit as project.py when the sweep has one
    fabrics = {f"{intra.label} (+ {inter.label} across nodes)": (intra, inter, True), cpu.label: (cpu, None, False)}

    brows = bytes_rows(geos, tps, b)
    mrows = measured_rows(recs, geos, b)
    grows = gather_rows(recs, geos, b)
    prows = projected_rows(brows, fabrics, machine, a.gpus_per_node)
    geo0 = next(iter(geos.values()))
    md = ["# The head at large vocabularies", "",
          f"Base config `{os.path.basename(a.base)}` (H = {geo0.H}, B = {geo0.B}, k = {geo0.candidates} candidates per row), "
          f"{b} session(s): M' = {b * (geo0.B - 1)} draft rows. The default exchange all-gathers each rank's k best "
          "(value, id) pairs per row, 16 bytes each: M'·k·16 bytes sent per rank, M'·tp·k·16 received. A full-logits "
          "all-gather sends each rank's padded slice in f32: M'·(Vp/tp)·4 per rank, M'·Vp·4 received (Vp = V rounded up "
          "to a multiple of tp; M'·V·4 without the padding).", "", "## Bytes per draft (exact)", ""]
    md.append(sl.md_table(
        ["V", "tp", "Vp", "head weights/rank (bf16)", "candidates: sent/rank", "candidates: gathered", "full logits: sent/rank",
         "full logits: gathered (M'·V·4)", "full / candidates"],
        [[r["vocab"], r["tp"], r["vocab_padded"], sl.fmt_bytes(r["head_bytes_per_rank"]), f"{r['candidates_block']:,} B",
          f"{r['candidates_total']:,} B", f"{r['full_block']:,} B", f"{r['full_total']:,} B ({r['full_unpadded_total']:,} B)",
          f"{r['full_total'] / r['candidates_total']:.0f}x"] for r in brows]))
    md += ["", "## Measured head time (`tpdraft bench`, head_ms: local head GEMM + top-k + candidate exchange + selector projection)", ""]
    if mrows:
        md.append(sl.md_table(
            ["V", "tp", "backend", "head ms", "draft ms", "head share", "head weights GB/s", "all-gather bytes/rank (measured)"],
            [[r["vocab"], f"{r['tp']}" + (" (oversubscribed)" if r["oversubscribed"] else ""), r["backend"],
              sl.fmt_ms(r["head_ms"]), sl.fmt_ms(r["draft_ms"]), f"{r['head_share']:.0%}", f"{r['head_gbps']:.3g}",
              f"{r['all_gather_bytes']:,.0f} B"] for r in mrows]))
    else:
        md.append("(no vocabulary-study records: run `launch/scale.sh` with `--vocab`)")
    md += ["", "## Measured: candidates vs full-logits gather", "",
           "Each tp >= 2 point run twice: the default draft (candidate exchange) and the same draft with "
           "`--gather-logits`, which also all-gathers every rank's padded [M', Vp/tp] f32 logits slice so that "
           "each rank holds the whole [M', V]. Medians per draft (rank 0); all-gather bytes are what one rank "
           "sends per draft, and the full path's hold both gathers, so their difference should equal the "
           "model's M'·(Vp/tp)·4. The full path also writes the head's logits to memory (instead of the fused "
           "top-k), copies the hidden rows out and assembles the gathered logits: Δ draft ms holds that work "
           "besides Δ comm ms.", ""]
    if grows:
        md.append(gather_table(grows))
    else:
        md.append("(no pair of runs with and without `--gather-logits`: `launch/scale.sh --vocab` runs both at "
                  "every vocab tp >= 2 when `tpdraft bench` offers the flag)")
    md += ["", f"## Projected exchange time per draft, ms (alpha-beta model, `{os.path.basename(a.params)}`)", "",
           f"tp above {a.gpus_per_node} spans nodes: NVLink inside, InfiniBand across (hierarchical all-gather). "
           f"Head HBM ms = this rank's head weights read once at {machine.label} HBM {machine.bw / 1e12:.3g} TB/s, "
           "the floor of the head's own time.", ""]
    names = list(fabrics)
    header = ["V", "tp", f"head HBM ms ({machine.label})"]
    for n in names:
        header += [f"{n}: candidates", f"{n}: full logits"]
    table = []
    for r in prows:
        row = [r["vocab"], r["tp"], sl.fmt_ms(r["head_hbm_ms"])]
        for n in names:
            if n in r:
                row += [sl.fmt_ms(r[n]["candidates_ms"]), sl.fmt_ms(r[n]["full_ms"])]
            else:
                row += ["–", "–"]
        table.append(row)
    md.append(sl.md_table(header, table))
    md += ["", "Parameters: " + "; ".join(f"{f[0].describe()} ({f[0].source.rstrip('.')})" for f in fabrics.values())
           + f"; across nodes {inter.describe()} ({inter.source.rstrip('.')}).", ""]
    sl.emit_report("\n".join(md), {"sessions": b, "bytes": brows, "measured": mrows, "measured_gather": grows,
                                    "projected": prows}, a.out, "vocab")
    return 0


if __name__ == "__main__":
    sys.exit(main())
