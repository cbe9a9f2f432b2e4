#!/usr/bin/env python3
"""Projects the per-draft latency of a drafter on multi-GPU systems: T(tp) = compute(tp) + comm(tp),
compute from measurements (GPU records, else CPU records carried to a GPU roofline), comm from an
alpha-beta model per collective and fabric (bench/scaling/comm-model.json). Also checks the same
model against this machine's CPU MPI runs. Writes OUT/projection.md and OUT/projection.json."""

import argparse
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scalelib as sl  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", help="records.jsonl written by launch/scale.sh (optional: without it, ideal rooflines)")
    p.add_argument("--params", default=sl.default_params_path(), help="comm-model.json to use (default: the one beside this script)")
    p.add_argument("--out", help="directory for projection.md and projection.json (default: print only)")
    p.add_argument("--config", action="append", default=[], help="drafter config.json to project (repeatable; default: the configs of the records)")
    p.add_argument("--sessions", help="comma list of sessions per draft (default: those measured, else 1)")
    p.add_argument("--ctx", help="comma list of context lengths (default: those measured, else 1024)")
    p.add_argument("--layouts", help="comma list NODESxGPUS, e.g. 1x1,1x2,1x4,1x8,2x8 (default: comm-model.json)")
    p.add_argument("--span-nodes", action="store_true",
                   help="one tensor-parallel group across all nodes of a layout (tp = nodes x GPUs); by default "
                        "tp = GPUs per node and the nodes hold independent replicas")
    p.add_argument("--gpu", help="GPU entry of comm-model.json (default: defaults.gpu)")
    p.add_argument("--intra", help="intra-node fabric (default: defaults.intra)")
    p.add_argument("--inter", help="inter-node fabric (default: defaults.inter)")
    p.add_argument("--cpu-tp", default="1,2,4,8", help="tp values of the CPU MPI check table")
    return p.parse_args(argv)


def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def resolve_config(path):
    for cand in (path, os.path.join(REPO, path)):
        if os.path.isfile(cand):
            return cand
    raise SystemExit(f"project.py: config '{path}' not found (as given, or relative to the repository)")


def scaling_records(recs):
    """The records of the scaling sweep (the vocabulary study's configs and full-logits runs stay out)."""
    return sl.scaling_records(recs)


class Legend:
    """Numbered assumption tags printed beside the numbers and spelled out under each table."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.items = {}

    def tag(self, text):
        if text not in self.items:
            self.items[text] = f"{self.prefix}{len(self.items) + 1}"
        return self.items[text]

    def markdown(self):
        return "\n".join(f"- **{t}**: {text}" for text, t in self.items.items())


def parse_layout(text):
    nodes, per_node = text.lower().split("x")
    return int(nodes), int(per_node)


def gpu_compute(recs, machine, geo, tp, sessions, ctx, wbytes):
    """(ms, source, kind): GPU records first, else the CPU records carried to the GPU roofline."""
    ms, src = sl.estimate_compute(recs, geo, tp, sessions, ctx, backend="cuda", machine=machine)
    if ms is not None:
        return ms, "GPU " + src, "measured"
    return sl.estimate_compute_on(machine, recs, geo, tp, sessions, ctx, wbytes)


def project_gpu(recs, params, geo, ctx, sessions, layouts, span, machine, intra, inter, alt_intra, legend):
    d = params["defaults"]
    rows = []
    for layout in layouts:
        nodes, per_node = parse_layout(layout)
        tp = nodes * per_node if span else per_node
        tp_nodes = nodes if span else 1
        replicas = 1 if span else nodes
        problem = sl.tp_problem(geo, tp)
        if problem:
            rows.append({"layout": layout, "tp": tp, "skipped": problem})
            continue
        comp, src, kind = gpu_compute(recs, machine, geo, tp, sessions, ctx, d.get("weight_bytes", 2))
        colls = sl.collectives(geo, tp, sessions, d.get("reduce_elem_bytes", 4))
        comm = sl.comm_time(colls, tp, intra["value"], inter["value"], tp_nodes) * 1e3
        lo = sl.comm_time(colls, tp, intra["low"], inter["low"], tp_nodes) * 1e3
        hi = sl.comm_time(colls, tp, intra["high"], inter["high"], tp_nodes) * 1e3
        total = comp + comm
        fabric_text = intra["value"].describe() + (f"; across nodes {inter['value'].describe()}" if tp_nodes > 1 else "")
        row = {
            "layout": layout, "nodes": nodes, "gpus_per_node": per_node, "tp": tp, "tp_nodes": tp_nodes,
            "replicas": replicas, "compute_ms": comp, "compute_source": src, "compute_kind": kind,
            "comm_ms": comm, "comm_ms_range": [lo, hi], "total_ms": total, "total_ms_range": [comp + lo, comp + hi],
            "comm_share": comm / total if total > 0 else 0.0, "comm_model": fabric_text,
            "drafts_per_s": replicas * 1e3 / total, "tokens_per_s": replicas * sessions * (geo.B - 1) * 1e3 / total,
            "compute_tag": legend.tag(f"compute: {src}"),
            "comm_tag": legend.tag("comm: none (one rank)") if tp == 1 else
                        legend.tag(f"comm: {fabric_text} ({intra['value'].source.rstrip('.')}"
                                   + (f"; {inter['value'].source.rstrip('.')}" if tp_nodes > 1 else "") + ")"),
        }
        for name, fab in alt_intra.items():
            row.setdefault("alt_total_ms", {})[name] = comp + sl.comm_time(colls, tp, fab, inter["value"], tp_nodes) * 1e3
        rows.append(row)
    return rows


def project_cpu(recs, geo, ctx, sessions, tps, fabric, legend):
    """The model on this machine's CPU MPI ranks beside what was measured there."""
    rows = []
    measured = {r["tp"]: r for r in sl.dedupe(recs) if sl.config_name(r) == geo.name and r.get("context") == ctx
                and r.get("sessions") == sessions and r.get("backend", "cpu") == "cpu"}
    for tp in tps:
        if sl.tp_problem(geo, tp):
            continue
        comp, src = sl.estimate_compute(recs, geo, tp, sessions, ctx)
        if comp is None:
            continue
        comm = sl.comm_time(sl.collectives(geo, tp, sessions), tp, fabric) * 1e3
        m = measured.get(tp)
        comm_text = "comm: none (one rank)" if tp == 1 else f"comm: {fabric.describe()} ({fabric.source})"
        row = {"tp": tp, "compute_ms": comp, "compute_source": src, "comm_ms": comm, "total_ms": comp + comm,
               "compute_tag": legend.tag(f"compute: {src}"), "comm_tag": legend.tag(comm_text)}
        if m:
            row.update(measured_ms=m["draft_ms"], measured_comm_ms=sl.comm_ms(m), oversubscribed=sl.oversubscribed(m),
                       error=(comp + comm) / m["draft_ms"] - 1)
        rows.append(row)
    return rows


def gpu_table(rows, alt_names):
    header = ["layout", "tp", "compute ms", "comm ms", "total ms", "comm share", "total over the ranges"]
    header += [f"total, {n}" for n in alt_names] + ["drafts/s (all replicas)", "assumptions"]
    out = []
    for r in rows:
        if "skipped" in r:
            out.append([r["layout"], r["tp"]] + ["–"] * (len(header) - 3) + [f"not shardable: {r['skipped']}"])
            continue
        lo, hi = r["total_ms_range"]
        alt = [sl.fmt_ms(r["alt_total_ms"][n]) for n in alt_names]
        out.append([r["layout"] + (f" ({r['replicas']} replicas)" if r["replicas"] > 1 else ""), r["tp"],
                    f"{sl.fmt_ms(r['compute_ms'])} [{r['compute_tag']}]", f"{sl.fmt_ms(r['comm_ms'])} [{r['comm_tag']}]",
                    sl.fmt_ms(r["total_ms"]), f"{r['comm_share']:.0%}", f"{sl.fmt_ms(lo)}–{sl.fmt_ms(hi)}", *alt,
                    f"{r['drafts_per_s']:.0f}", f"{r['compute_tag']}, {r['comm_tag']}"])
    return sl.md_table(header, out)


def cpu_table(rows):
    header = ["tp", "compute ms", "comm ms (model)", "total ms (model)", "measured ms", "measured comm ms", "model / measured − 1"]
    out = []
    for r in rows:
        meas = sl.fmt_ms(r.get("measured_ms")) + (" (oversubscribed)" if r.get("oversubscribed") else "")
        err = f"{r['error']:+.0%}" if "error" in r else "–"
        if r["compute_source"].startswith("measured") and "error" in r:
            err += " (compute from this run: checks comm only)"
        out.append([r["tp"], f"{sl.fmt_ms(r['compute_ms'])} [{r['compute_tag']}]", f"{sl.fmt_ms(r['comm_ms'])} [{r['comm_tag']}]",
                    sl.fmt_ms(r["total_ms"]), meas if "measured_ms" in r else "–",
                    sl.fmt_ms(r.get("measured_comm_ms")) if "measured_ms" in r else "–", err])
    return sl.md_table(header, out)


def fabrics(params, name):
    p = params["fabrics"][name]
    return {w: sl.fabric_from_params(name, p, w) for w in ("value", "low", "high")}


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    params = sl.load_params(a.params)
    d = params["defaults"]
    recs = scaling_records(sl.read_records(a.records)) if a.records else []
    machine = sl.gpu_machine(params, a.gpu or d["gpu"])
    intra, inter = fabrics(params, a.intra or d["intra"]), fabrics(params, a.inter or d["inter"])
    alt = {params["fabrics"][n].get("label", n): sl.fabric_from_params(n, params["fabrics"][n]) for n in d.get("also_intra", [])}
    layouts = a.layouts.split(",") if a.layouts else d["layouts"]
    cpu_fab = sl.cpu_fabric(recs, params)

    paths = [resolve_config(c) for c in a.config] or sorted({resolve_config(r["config"]) for r in recs})
    if not paths:
        raise SystemExit("project.py: no records and no --config: nothing to project")
    md = ["# Multi-GPU projection", "",
          f"Parameters: `{os.path.relpath(a.params)}`. T = compute + comm per draft; comm = the draft's collectives "
          f"(2·L all-reduces of M·H·{d.get('reduce_elem_bytes', 4)} bytes, one all-gather of M'·k candidates of 16 bytes "
          "per rank, two token broadcasts) through the alpha-beta model of each fabric. "
          + ("Each layout is one tensor-parallel group across all its nodes." if a.span_nodes else
             "A layout NxG runs tp = G inside a node; N nodes hold N independent replicas (same latency, N x drafts/s)."),
          "", f"GPU: {machine.label}, HBM {machine.bw / 1e12:.3g} TB/s, {machine.flops / 1e12:.0f} TFLOP/s BF16 ({machine.source}).",
          f"CPU MPI transport of this machine: {cpu_fab.describe()} ({cpu_fab.source}).", ""]
    out = {"params": a.params, "gpu": machine.label, "span_nodes": a.span_nodes,
           "cpu_fabric": {"alpha_us": cpu_fab.alpha["all_reduce"] * 1e6, "bw_GBps": cpu_fab.bw / 1e9, "source": cpu_fab.source},
           "gpu_points": [], "cpu_points": []}
    for path in paths:
        geo = sl.load_geometry(path)
        mine = [r for r in recs if sl.config_name(r) == geo.name]
        ctxs = ints(a.ctx) if a.ctx else sorted({r["context"] for r in mine}) or [1024]
        sess = ints(a.sessions) if a.sessions else sorted({r["sessions"] for r in mine}) or [1]
        for ctx in ctxs:
            for b in sess:
                glegend, clegend = Legend("G"), Legend("C")
                rows = project_gpu(recs, params, geo, ctx, b, layouts, a.span_nodes, machine, intra, inter, alt, glegend)
                md += [f"## {geo.name}: context {ctx}, {b} session(s) per draft", "",
                       f"### Projected on {machine.label} nodes", "", gpu_table(rows, list(alt)), "", glegend.markdown(), ""]
                for r in rows:
                    out["gpu_points"].append({"config": geo.name, "context": ctx, "sessions": b, **r})
                crow = project_cpu(recs, geo, ctx, b, ints(a.cpu_tp), cpu_fab, clegend)
                if crow:
                    md += ["### The same model on this machine's CPU MPI ranks", "", cpu_table(crow), "", clegend.markdown(), ""]
                    for r in crow:
                        out["cpu_points"].append({"config": geo.name, "context": ctx, "sessions": b, **r})
    sl.emit_report("\n".join(md), out, a.out, "projection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
