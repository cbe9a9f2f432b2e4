#!/usr/bin/env python3
"""Projects the per-draft latency on multi-GPU systems (OUT/projection.md, .json): T(tp) = compute +
comm, compute from measurements (GPU records, else CPU records carried to a GPU roofline), comm
from the alpha-beta model of comm-model.json over the collectives `tpdraft info --json` counts;
the floor of long contexts (to 131072) on one GPU and at tp 2, 4, 8, where each rank holds 1/tp
of the kv heads; and the same model beside this machine's CPU MPI runs."""

import argparse
import os
import sys
from collections import namedtuple

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import commmodel as cm  # noqa: E402
import compute  # noqa: E402
import geometry  # noqa: E402
import records  # noqa: E402
import tables as tb  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", help="records.jsonl written by launch/scale.sh (optional: without it, ideal rooflines)")
    p.add_argument("--params", default=cm.default_params_path(), help="comm-model.json to use (default: the one beside this script)")
    p.add_argument("--out", help="directory for projection.md and projection.json (default: print only)")
    p.add_argument("--config", action="append", default=[], help="drafter config.json to project (repeatable; default: the configs of the records)")
    p.add_argument("--sessions", type=tb.ints,
                   help="comma list of sessions per draft (default: those measured, else 1)")
    p.add_argument("--ctx", type=tb.ints, help="comma list of context lengths (default: those measured, else 1024)")
    p.add_argument("--layouts", help="comma list NODESxGPUS, e.g. 1x1,1x2,1x4,1x8,2x8 (default: comm-model.json)")
    p.add_argument("--span-nodes", action="store_true",
                   help="one tensor-parallel group across all nodes of a layout (tp = nodes x GPUs); by default "
                        "tp = GPUs per node and the nodes hold independent replicas")
    p.add_argument("--gpu", help="GPU entry of comm-model.json (default: defaults.gpu)")
    p.add_argument("--intra", help="intra-node fabric (default: defaults.intra)")
    p.add_argument("--inter", help="inter-node fabric (default: defaults.inter)")
    p.add_argument("--cpu-tp", type=tb.ints, default="1,2,4,8", help="tp values of the CPU MPI table")
    p.add_argument("--bin", help="the tpdraft binary that answers `info --json` (default: build/tpdraft)")
    p.add_argument("--quant", default="q8,q4,q8+head,q4+head",
                   help="comma list of --quant presets projected beside the float weights ('none': skip)")
    p.add_argument("--draft-vocab", default="32000",
                   help="comma list of draft vocabulary sizes N projected beside the full head ('none': skip)")
    p.add_argument("--long-ctx", default="4096,8192,16384,32768,65536,131072",
                   help="comma list of contexts of the long-context table ('none': skip it)")
    p.add_argument("--long-tp", type=tb.ints, default="1,2,4,8", help="tp values of the long-context table (one node)")
    return p.parse_args(argv)


def parse_layout(text):
    nodes, per_node = text.lower().split("x")
    return int(nodes), int(per_node)


# What every projected point of one run of this script shares.
Setting = namedtuple("Setting", "params runs info machine intra inter alt_intra span dtype")


def gpu_point(s, config, answer, layout, legend):
    nodes, per_node = parse_layout(layout)
    tp, sessions, ctx = answer["tp"], answer["sessions"], answer["context"]
    tp_nodes, replicas = (nodes, 1) if s.span else (1, nodes)
    # The compute: GPU records first, else the CPU records carried to the GPU roofline.
    comp, src = compute.estimate_compute(s.runs, s.info, config, tp, sessions, ctx, backend="cuda", machine=s.machine)
    if comp is not None:
        src, kind = "GPU " + src, "measured"
    else:
        comp, src, kind = compute.estimate_compute_on(s.machine, s.runs, s.info, config, tp, sessions, ctx, s.dtype)
    colls = geometry.collectives(answer)
    comm, lo, hi = (cm.comm_time(colls, tp, s.intra[w], s.inter[w], tp_nodes) * 1e3 for w in ("value", "low", "high"))
    total = comp + comm
    fabric = s.intra["value"].describe() + (f"; across nodes {s.inter['value'].describe()}" if tp_nodes > 1 else "")
    sources = s.intra["value"].source.rstrip(".") + (f"; {s.inter['value'].source.rstrip('.')}" if tp_nodes > 1 else "")
    tokens = sessions * (geometry.block(answer) - 1)
    return {
        "layout": layout, "nodes": nodes, "gpus_per_node": per_node, "tp": tp, "tp_nodes": tp_nodes,
        "replicas": replicas, "compute_ms": comp, "compute_source": src, "compute_kind": kind, "comm_ms": comm,
        "comm_ms_range": [lo, hi], "total_ms": total, "total_ms_range": [comp + lo, comp + hi],
        "comm_share": comm / total if total > 0 else 0.0, "comm_model": fabric,
        "drafts_per_s": replicas * 1e3 / total, "tokens_per_s": replicas * tokens * 1e3 / total,
        "compute_tag": legend.tag(f"compute: {src}"),
        "comm_tag": legend.tag("comm: none (one rank)") if tp == 1 else legend.tag(f"comm: {fabric} ({sources})"),
        "alt_total_ms": {name: comp + cm.comm_time(colls, tp, fab, s.inter["value"], tp_nodes) * 1e3
                         for name, fab in s.alt_intra.items()},
    }


def project_gpu(s, config, ctx, sessions, layouts, legend):
    rows = []
    for layout in layouts:
        nodes, per_node = parse_layout(layout)
        tp = nodes * per_node if s.span else per_node
        try:
            answer = s.info.query(config, tp, sessions, ctx, s.dtype)
        except geometry.NotShardable as e:
            rows.append({"layout": layout, "tp": tp, "skipped": str(e)})
            continue
        rows.append(gpu_point(s, config, answer, layout, legend))
    return rows


def project_cpu(s, config, ctx, sessions, tps, fabric, legend):
    """The model on this machine's CPU MPI ranks beside what was measured there."""
    rows = []
    name = geometry.config_name(config)
    measured = {r.tp: r for r in records.dedupe(s.runs) if r.config_name == name and r.context == ctx
                and r.sessions == sessions and r.backend == "cpu"}
    for tp in [t for t in tps if not s.info.problem(config, t)]:
        comp, src = compute.estimate_compute(s.runs, s.info, config, tp, sessions, ctx)
        if comp is None:
            continue
        colls = geometry.collectives(s.info.query(config, tp, sessions, ctx, s.dtype))
        comm = cm.comm_time(colls, tp, fabric) * 1e3
        comm_text = "comm: none (one rank)" if tp == 1 else f"comm: {fabric.describe()} ({fabric.source})"
        row = {"tp": tp, "compute_ms": comp, "compute_source": src, "comm_ms": comm, "total_ms": comp + comm,
               "compute_tag": legend.tag(f"compute: {src}"), "comm_tag": legend.tag(comm_text)}
        m = measured.get(tp)
        if m:
            row.update(measured_ms=m.draft_ms, measured_comm_ms=m.comm_ms, oversubscribed=m.oversubscribed,
                       shared=records.shared_reasons(m), error=(comp + comm) / m.draft_ms - 1)
        rows.append(row)
    return rows


def project_quant(s, config, ctx, sessions, rows, quants):
    """Per projected GPU layout, the total with each --quant preset: the compute at the GPU roofline
    of the quantized weights' bytes (`tpdraft info --json --quant`), carried at the float run's CPU
    efficiency; the collectives are those of the float weights (activations are not quantized)."""
    def total(r, q):
        try:
            comp, _, _ = compute.estimate_compute_on(s.machine, s.runs, s.info, config, r["tp"], sessions, ctx,
                                                     s.dtype, q)
        except geometry.NotShardable:  # the preset's groups do not split over this tp
            return None
        return comp + r["comm_ms"]

    return [{"layout": r["layout"], "tp": r["tp"],
             "total_ms": {"bf16": r["total_ms"], **{q: total(r, q) for q in quants}}}
            for r in rows if "skipped" not in r]


def project_draft_vocab(s, config, ctx, sessions, rows, sizes):
    """Per projected GPU layout, the total with a draft vocabulary of each size N: the compute at the
    GPU roofline of the N-row head (`tpdraft info --json --token-map-size N`), carried at the full
    run's CPU efficiency, and the collectives of that draft (those of the full head for a greedy
    draft: only the candidates cross the wire)."""
    def total(r, n):
        comp, _, _ = compute.estimate_compute_on(s.machine, s.runs, s.info, config, r["tp"], sessions, ctx,
                                                 s.dtype, draft_vocab=n)
        colls = geometry.collectives(s.info.query(config, r["tp"], sessions, ctx, s.dtype, draft_vocab=n))
        return comp + cm.comm_time(colls, r["tp"], s.intra["value"], s.inter["value"], r["tp_nodes"]) * 1e3

    return [{"layout": r["layout"], "tp": r["tp"],
             "total_ms": {"full": r["total_ms"], **{str(n): total(r, n) for n in sizes}}}
            for r in rows if "skipped" not in r]


def long_context_points(s, config, sessions, contexts, tps):
    """The floor of one draft at long contexts, tp GPUs in one node: per rank its kv heads, K/V
    bytes and attention FLOPs (geometry.attention: 1/tp of the kv heads, replicated past Nk), its
    weights and all its FLOPs (`tpdraft info --json`), the GPU roofline of those with an f32 and a
    bf16 cache, and the draft's collectives on the intra-node fabric. No measurement enters: the
    floor is a lower bound."""
    rows = []
    for ctx in contexts:
        for tp in tps:
            try:
                answer = s.info.query(config, tp, sessions, ctx, s.dtype)
            except geometry.NotShardable as e:
                rows.append({"context": ctx, "tp": tp, "skipped": str(e)})
                continue
            w = geometry.work(answer)
            att = {k: geometry.attention(answer, b) for k, b in geometry.KV_ELEMENT_BYTES.items()}
            floor = {k: compute.roofline_s(geometry.Work(w.flops, w.weight_bytes, a.kv_bytes), s.machine) * 1e3
                     for k, a in att.items()}
            comm = cm.comm_time(geometry.collectives(answer), tp, s.intra["value"]) * 1e3
            held = geometry.rank(answer)["bytes"]
            rows.append({
                "context": ctx, "tp": tp, "kv_heads": att["f32"].kv_heads, "q_heads": att["f32"].q_heads,
                "kv_bytes": {k: a.kv_bytes for k, a in att.items()}, "attention_flops": att["f32"].flops,
                "flops": w.flops, "weight_bytes": w.weight_bytes,
                "memory_bytes": held["total"] + sessions * ctx * held["context_per_position"],
                "floor_ms": floor, "comm_ms": comm, "total_ms": {k: f + comm for k, f in floor.items()},
                "bound": "FLOPs" if w.flops / s.machine.flops > (w.weight_bytes + att["f32"].kv_bytes) / s.machine.bw
                         else "bytes"})
    return rows


def f32_to_bf16(d, fmt):
    """A cell of both caches: "f32 value → bf16 value"."""
    return f"{fmt(d['f32'])} → {fmt(d['bf16'])}"


def long_context_table(rows):
    header = ["context", "tp", "kv heads / rank", "K/V GB / rank, f32 → bf16", "attention GFLOP / rank",
              "GFLOP / rank", "weights GB / rank", "held GB / rank (f32 cache)", "floor ms, f32 → bf16", "comm ms",
              "total ms, f32 → bf16", "bound by"]
    out = []
    for r in rows:
        if "skipped" in r:
            out.append([r["context"], r["tp"]] + ["–"] * (len(header) - 3) + [f"not shardable: {r['skipped']}"])
            continue
        out.append([r["context"], r["tp"], r["kv_heads"], f32_to_bf16(r["kv_bytes"], lambda x: f"{x / 1e9:.3f}"),
                    f"{r['attention_flops'] / 1e9:.2f}", f"{r['flops'] / 1e9:.1f}", f"{r['weight_bytes'] / 1e9:.3f}",
                    f"{r['memory_bytes'] / 1e9:.2f}", f32_to_bf16(r["floor_ms"], tb.fmt_ms), tb.fmt_ms(r["comm_ms"]),
                    f32_to_bf16(r["total_ms"], tb.fmt_ms), r["bound"]])
    return tb.md_table(header, out)


def long_context_lines(s, name, sessions, rows):
    m = s.machine
    return [f"## {name}: long contexts on {m.label} GPUs, {sessions} session(s) per draft (PROJECTED)", "",
            f"The floor of one draft: max(FLOPs / {m.flops / 1e12:.0f} TFLOP/s, bytes / {m.bw / 1e12:.3g} TB/s) per "
            f"rank ({m.source}), plus the collectives on {s.intra['value'].describe()} "
            f"({s.intra['value'].source.rstrip('.')}). Weights and FLOPs per rank from `tpdraft info --json --ctx N "
            "--tp T`; K/V bytes and attention FLOPs per rank from the rank's kv and q heads: each rank holds 1/tp "
            "of the kv heads (one, shared by tp / Nk ranks, when tp > Nk) and 1/tp of the q heads. A lower bound: "
            "no measured efficiency enters.", "", long_context_table(rows), ""]


def variants_table(points, columns):
    """The total per layout with each variant, {its key in total_ms: its column}, the first the one
    the others' speed is against (the float weights, the full head)."""
    base = next(iter(columns))
    body = [[p["layout"], p["tp"], tb.fmt_ms(p["total_ms"][base])]
            + [f"{tb.fmt_ms(p['total_ms'][k])} ({p['total_ms'][base] / p['total_ms'][k]:.2f}x)"
               if p["total_ms"][k] is not None else "– (tp cuts its groups)" for k in list(columns)[1:]]
            for p in points]
    return tb.md_table(["layout", "tp", *columns.values()], body)


def gpu_table(rows, alt_names):
    header = ["layout", "tp", "compute ms", "comm ms", "total ms", "efficiency", "comm share", "total over the ranges"]
    header += [f"total, {n}" for n in alt_names] + ["drafts/s (all replicas)", "assumptions"]
    base = next((r for r in rows if "skipped" not in r), None)
    out = []
    for r in rows:
        if "skipped" in r:
            out.append([r["layout"], r["tp"]] + ["–"] * (len(header) - 3) + [f"not shardable: {r['skipped']}"])
            continue
        lo, hi = r["total_ms_range"]
        eff = base["total_ms"] * base["tp"] / (r["tp"] * r["total_ms"])
        alt = [tb.fmt_ms(r["alt_total_ms"][n]) for n in alt_names]
        out.append([r["layout"] + (f" ({r['replicas']} replicas)" if r["replicas"] > 1 else ""), r["tp"],
                    f"{tb.fmt_ms(r['compute_ms'])} [{r['compute_tag']}]", f"{tb.fmt_ms(r['comm_ms'])} [{r['comm_tag']}]",
                    tb.fmt_ms(r["total_ms"]), tb.fmt_pct(eff), tb.fmt_pct(r["comm_share"]),
                    f"{tb.fmt_ms(lo)}–{tb.fmt_ms(hi)}", *alt, f"{r['drafts_per_s']:.0f}",
                    f"{r['compute_tag']}, {r['comm_tag']}"])
    return tb.md_table(header, out)


def cpu_table(rows):
    header = ["tp", "compute ms", "comm ms (model)", "total ms (model)", "measured ms", "measured comm ms",
              "model / measured − 1"]
    out = []
    for r in rows:
        err = f"{r['error']:+.0%}" if "error" in r else "–"
        if r["compute_source"].startswith("measured") and "error" in r:
            err += " (compute from this run: checks comm only)"
        out.append([r["tp"], f"{tb.fmt_ms(r['compute_ms'])} [{r['compute_tag']}]",
                    f"{tb.fmt_ms(r['comm_ms'])} [{r['comm_tag']}]", tb.fmt_ms(r["total_ms"]),
                    tb.fmt_ms(r.get("measured_ms")) + tb.flags(r) if "measured_ms" in r else "–",
                    tb.fmt_ms(r.get("measured_comm_ms")) if "measured_ms" in r else "–", err])
    return tb.md_table(header, out)


def fastest_line(rows):
    """The answer a reader looks for first: the lowest projected latency, and the smallest tp
    within 10 % of it."""
    ok = [r for r in rows if "skipped" not in r and r["replicas"] == 1]
    if not ok:
        return []
    best = min(ok, key=lambda r: r["total_ms"])
    enough = min((r for r in ok if r["total_ms"] <= 1.1 * best["total_ms"]), key=lambda r: r["tp"])
    return [f"Lowest projected latency: {tb.fmt_ms(best['total_ms'])} ms at tp = {best['tp']}; the smallest tp within "
            f"10 % of it: tp = {enough['tp']} ({tb.fmt_ms(enough['total_ms'])} ms).", ""]


def header_lines(a, params, machine, cpu_fab):
    d = params["defaults"]
    return ["# Multi-GPU projection", "",
            f"Parameters: `{os.path.basename(a.params)}`. T = compute + comm per draft; comm = the draft's collectives "
            "as `tpdraft info --json` counts them (src/model/cost.cpp: 2·L all-reduces of the block's rows, one "
            "all-gather of each rank's candidates, the broadcasts that end the draft) through the alpha-beta model of "
            "each fabric. Efficiency = T(first tp)·(first tp) / (tp·T(tp)). "
            + ("Each layout is one tensor-parallel group across all its nodes." if a.span_nodes else
               "A layout NxG runs tp = G inside a node; N nodes hold N independent replicas (same latency, N x drafts/s)."),
            "", f"GPU: {machine.label}, HBM {machine.bw / 1e12:.3g} TB/s, {machine.flops / 1e12:.0f} TFLOP/s BF16 "
            f"({machine.source}); weights of {d.get('weight_bytes', 2)} bytes.",
            f"CPU MPI transport of this machine: {cpu_fab.describe()} ({cpu_fab.source}).", ""]


def main(argv=None):
    a = parse_args(argv)
    params = tb.read_json(a.params)
    d = params["defaults"]
    runs = records.scaling_runs(records.read_runs(a.records)) if a.records else []
    machine = compute.gpu_machine(params, a.gpu or d["gpu"])
    alt = {params["fabrics"][n].get("label", n): cm.fabric_from_params(n, params["fabrics"][n]) for n in d.get("also_intra", [])}
    s = Setting(params, runs, geometry.Info(a.bin), machine, cm.fabric_range(params, a.intra or d["intra"]),
                cm.fabric_range(params, a.inter or d["inter"]), alt, a.span_nodes,
                geometry.info_dtype(d.get("weight_bytes", 2)))
    layouts = a.layouts.split(",") if a.layouts else d["layouts"]
    quants = [] if a.quant == "none" else [q for q in a.quant.split(",") if q]
    vocab_sizes = [] if a.draft_vocab == "none" else tb.ints(a.draft_vocab)
    cpu_fab = cm.cpu_fabric(runs, params)
    paths = [geometry.resolve_config(c) for c in a.config] or sorted({geometry.resolve_config(r.config_file) for r in runs})
    if not paths:
        raise SystemExit("project.py: no records and no --config: nothing to project")
    md = header_lines(a, params, machine, cpu_fab)
    out = {"params": a.params, "gpu": machine.label, "span_nodes": a.span_nodes,
           "cpu_fabric": {"alpha_us": cpu_fab.alpha["all_reduce"] * 1e6, "bw_GBps": cpu_fab.bw / 1e9, "source": cpu_fab.source},
           "gpu_points": [], "cpu_points": [], "quant_points": [], "draft_vocab_points": [], "long_context_points": []}
    long_ctx = [] if a.long_ctx == "none" else tb.ints(a.long_ctx)
    for path in paths:
        name = geometry.config_name(path)
        mine = [r for r in runs if r.config_name == name]
        for ctx in a.ctx or sorted({r.context for r in mine}) or [1024]:
            for b in a.sessions or sorted({r.sessions for r in mine}) or [1]:
                glegend, clegend = tb.Legend("G"), tb.Legend("C")
                where = {"config": name, "context": ctx, "sessions": b}  # the keys of every row below
                rows = project_gpu(s, path, ctx, b, layouts, glegend)
                md += [f"## {name}: context {ctx}, {b} session(s) per draft", "",
                       f"### Projected on {machine.label} nodes", "", *fastest_line(rows), gpu_table(rows, list(alt)), "",
                       glegend.markdown(), ""]
                out["gpu_points"] += [{**where, **r} for r in rows]
                if quants:
                    qpoints = project_quant(s, path, ctx, b, rows, quants)
                    md += [f"### Projected on {machine.label} nodes with quantized weights (PROJECTED)", "",
                           "Compute at the roofline of the quantized weights' bytes (`tpdraft info --json --quant`) "
                           "at the float run's efficiency, collectives unchanged; in brackets the speed against the "
                           "float weights.", "",
                           variants_table(qpoints, {"bf16": "float weights ms", **{q: f"{q} ms" for q in quants}}), ""]
                    out["quant_points"] += [{**where, **p} for p in qpoints]
                sizes = [n for n in vocab_sizes if n < geometry.vocab(s.info.query(path, 1, b, ctx, s.dtype))]
                if sizes:
                    vpoints = project_draft_vocab(s, path, ctx, b, rows, sizes)
                    md += [f"### Projected on {machine.label} nodes with a draft vocabulary (PROJECTED)", "",
                           "The head cut to N of the V target ids (a token map or a speculators checkpoint; "
                           "`tpdraft info --json --token-map-size N`): compute at the roofline of that head at the "
                           "full head's efficiency, collectives of that draft; in brackets the speed against the "
                           "full head.", "", variants_table(vpoints, {"full": "full head ms",
                                                                **{str(n): f"draft vocabulary {n} ms" for n in sizes}}), ""]
                    out["draft_vocab_points"] += [{**where, **p} for p in vpoints]
                crow = project_cpu(s, path, ctx, b, a.cpu_tp, cpu_fab, clegend)
                if crow:
                    md += ["### The same model on this machine's CPU MPI ranks", "", cpu_table(crow), "",
                           clegend.markdown(), ""]
                    out["cpu_points"] += [{**where, **r} for r in crow]
        if long_ctx:  # at the fewest sessions of the other tables
            b = min(a.sessions or {r.sessions for r in mine} or {1})
            lrows = long_context_points(s, path, b, long_ctx, a.long_tp)
            md += long_context_lines(s, name, b, lrows)
            out["long_context_points"] += [{"config": name, "sessions": b, **r} for r in lrows]
    tb.emit_report("\n".join(md), out, a.out, "projection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
