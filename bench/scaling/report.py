#!/usr/bin/env python3
"""Scaling tables and plots from the records of launch/scale.sh: strong scaling (latency, speedup,
efficiency T1/(tp·Ttp), comm share), weak scaling and the context sweep, every row with its
roofline ratio (draft time over the roofline the run measured), runs marked when their spread or
load says the machine was not idle. Writes OUT/scaling.md, OUT/scaling.json and, with gnuplot, the plots
of plots.py (measured beside the projection of --projection)."""

import argparse
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plots  # noqa: E402
import records  # noqa: E402
import tables as tb  # noqa: E402


def series_title(key, weak=False):
    config, backend, ctx, b, threads = key
    size = f"{b}/rank" if weak else f"b={b}"
    return f"{config} {backend} ctx={ctx} {size} thr={threads}"


def strong_series(runs):
    """{(config, backend, ctx, sessions, threads): [runs by tp]} with at least two tp values."""
    groups = records.group_by(runs, lambda r: (r.config_name, r.backend, r.context, r.sessions, r.threads))
    return {k: sorted(v, key=lambda r: r.tp) for k, v in sorted(groups.items()) if len({r.tp for r in v}) > 1}


def weak_series(runs):
    """{(config, backend, ctx, sessions per rank, threads): [runs by tp]} from tp = 1 up."""
    per_rank = [r for r in runs if r.sessions % r.tp == 0]
    groups = records.group_by(per_rank, lambda r: (r.config_name, r.backend, r.context, r.sessions // r.tp, r.threads))
    series = {k: sorted(v, key=lambda r: r.tp) for k, v in sorted(groups.items())}
    return {k: v for k, v in series.items() if len(v) > 1 and v[0].tp == 1}


def context_series(runs):
    """{(config, backend, tp, sessions, threads): [runs by context]} with at least two contexts."""
    groups = records.group_by(runs, lambda r: (r.config_name, r.backend, r.tp, r.sessions, r.threads))
    return {k: sorted(v, key=lambda r: r.context) for k, v in sorted(groups.items()) if len({r.context for r in v}) > 1}


def context_title(key):
    config, backend, tp, b, threads = key
    return f"{config} {backend} tp={tp} b={b} thr={threads}"


def coll_cell(run, op):
    calls, nbytes = run.collectives.get(op, (0, 0))
    return f"{calls:g} x {tb.fmt_bytes(nbytes / calls)}" if calls else "–"


def timing(r):
    """The fields of a strong and a weak row alike: the machine and the draft's times."""
    return {"oversubscribed": r.oversubscribed, "shared": records.shared_reasons(r), "note": r.note,
            "draft_ms": r.draft_ms, "roofline_ms": r.roofline_ms, "roofline_ratio": r.roofline_ratio,
            "p10": r.draft_ms_p10, "p90": r.draft_ms_p90, "compute_ms": r.compute_ms, "comm_ms": r.comm_ms}


def strong_rows(series):
    base = series[0]
    t1 = base.draft_ms * base.tp  # the smallest tp stands in for tp = 1 when that is missing
    return [{
        "tp": r.tp, "t1_ms": t1, **timing(r),
        "speedup": t1 / r.draft_ms, "efficiency": t1 / (r.tp * r.draft_ms),
        "comm_share": r.comm_ms / r.draft_ms, "layers_ms": r.layers_ms, "head_ms": r.head_ms,
        "select_ms": r.select_ms, **{op: coll_cell(r, op) for op in records.OPS},
        "weights": tb.fmt_bytes(r.weights_bytes), "context": tb.fmt_bytes(r.context_bytes),
        "load": r.load,
    } for r in series]


def weak_rows(series):
    t1 = series[0].draft_ms
    return [{"tp": r.tp, "t1_ms": t1, "weak": True, "sessions": r.sessions, **timing(r),
             "efficiency": t1 / r.draft_ms, "comm_share": r.comm_ms / r.draft_ms,
             "tokens_per_s": r.sessions * (r.draft_tokens or 1) * 1e3 / r.draft_ms} for r in series]


def context_rows(series):
    return [{"context": r.context, "tp": r.tp, **timing(r), "layers_ms": r.layers_ms, "head_ms": r.head_ms,
             "context_bytes": r.context_bytes} for r in series]


def ratio_cell(x):
    return "–" if x is None else f"{x:.2f}"


def tp_cell(r, notes, key="tp"):
    """The first column (tp, or the context): a footnote mark when the machine was not idle or the
    run has a note (the reasons go under the table)."""
    if not r["shared"]:
        return f"{r[key]}"
    notes.append(f"{key} = {r[key]}: " + "; ".join(r["shared"]))
    return f"{r[key]} ({r['note'] or 'not idle'}{'*' * len(notes)})"


def with_notes(table, notes):
    return table + ("\n\n" + "\n".join(f"{'*' * (i + 1)} {n}" for i, n in enumerate(notes)) if notes else "")


def strong_table(rows):
    header = ["tp", "draft ms (median)", "p10–p90", "compute ms", "comm ms", "speedup", "efficiency", "comm share",
              "layers / head / select ms", "all-reduce", "all-gather", "broadcast", "weights/rank", "context/rank", "roofline ratio"]
    out, notes = [], []
    for r in rows:
        spread = f"{tb.fmt_ms(r['p10'])}–{tb.fmt_ms(r['p90'])}" if r["p10"] is not None else "–"
        phases = "/".join(tb.fmt_ms(r[k]) for k in ("layers_ms", "head_ms", "select_ms"))
        out.append([tp_cell(r, notes), tb.fmt_ms(r["draft_ms"]), spread, tb.fmt_ms(r["compute_ms"]),
                    tb.fmt_ms(r["comm_ms"]), f"{r['speedup']:.2f}", tb.fmt_pct(r["efficiency"]),
                    tb.fmt_pct(r["comm_share"]), phases, r["all_reduce"], r["all_gather"], r["broadcast"],
                    r["weights"], r["context"], ratio_cell(r["roofline_ratio"])])
    return with_notes(tb.md_table(header, out), notes)


def weak_table(rows):
    header = ["tp", "sessions", "draft ms (median)", "compute ms", "comm ms", "weak efficiency", "comm share",
              "draft tokens/s", "roofline ratio"]
    notes = []
    out = [[tp_cell(r, notes), r["sessions"], tb.fmt_ms(r["draft_ms"]), tb.fmt_ms(r["compute_ms"]),
            tb.fmt_ms(r["comm_ms"]), tb.fmt_pct(r["efficiency"]), tb.fmt_pct(r["comm_share"]),
            f"{r['tokens_per_s']:.0f}", ratio_cell(r["roofline_ratio"])] for r in rows]
    return with_notes(tb.md_table(header, out), notes)


def context_table(rows):
    header = ["context", "draft ms (median)", "layers ms", "head ms", "comm ms", "context/rank", "roofline ms",
              "roofline ratio"]
    notes = []
    out = [[tp_cell(r, notes, "context"), tb.fmt_ms(r["draft_ms"]), tb.fmt_ms(r["layers_ms"]), tb.fmt_ms(r["head_ms"]),
            tb.fmt_ms(r["comm_ms"]), tb.fmt_bytes(r["context_bytes"]), tb.fmt_ms(r["roofline_ms"]),
            ratio_cell(r["roofline_ratio"])] for r in rows]
    return with_notes(tb.md_table(header, out), notes)


def machine_lines(runs):
    machines = records.group_by(runs, lambda r: (r.hostname, r.cpu_model, r.nproc))
    lines = [f"- {host}: {cpu}, {nproc} core(s)" for host, cpu, nproc in machines]
    gpus = sorted({r.gpu_name for r in runs if r.gpu_name})
    if gpus:
        lines.append(f"- GPU: {', '.join(gpus)}")
    return lines


def load_lines(runs):
    """A note on the machine's load: how many runs were on a machine that was not idle."""
    shared = [r for r in runs if records.shared_reasons(r)]
    with_load = sum(1 for r in runs if r.load)
    if not shared:
        seen = f"the load recorded around {with_load} of {len(runs)} run(s)" if with_load else "no recorded load"
        return [f"Machine load: no run shows a busy machine ({seen}, and the p10–p90 spreads)."]
    return [f"**Machine load: {len(shared)} of {len(runs)} run(s) ran on a machine that was not idle** (marked "
            "\"not idle\" below, circled in the plots): other load only adds time, so their times and the "
            "efficiencies built on them are pessimistic. Rerun on an idle machine before deciding from them."]


def intro(runs):
    return ["# Scaling", "", "Machine(s):", *machine_lines(runs), "", *load_lines(runs), "",
            "Strong scaling: the same drafts at every tp. speedup = T(1)/T(tp), efficiency = T(1)/(tp·T(tp)), "
            "comm share = time inside collectives / draft time (medians per draft). Weak scaling: tp·b sessions "
            "at tp ranks, efficiency = T(1, b)/T(tp, tp·b). A run is marked \"not idle\" when its p10–p90 spread "
            f"exceeds {records.SPREAD_LIMIT:.0%} of its median, other processes kept more than "
            f"{records.OTHER_CORES_LIMIT} cores busy during it, more than {records.STEAL_LIMIT:.0%} of the CPU time "
            "was stolen, or its ranks were oversubscribed (see docs/scaling.md). Roofline ratio = draft time / the "
            "run's roofline (the larger of its FLOPs at the GEMM rate and its bytes at the read bandwidth the run "
            "measured, `roofline_ms` of `tpdraft bench --json`): 1 is the floor of this machine.", ""]


def sections(strong, weak, contexts):
    md = ["## Strong scaling", ""]
    for title, rows in strong.items():
        md += [f"### {title}", ""]
        if rows[0]["tp"] != 1:
            md += [f"(no tp = 1 run: speedup and efficiency take {rows[0]['tp']}·T({rows[0]['tp']}) for T(1))", ""]
        md += [strong_table(rows), ""]
    if not strong:
        md += ["(no series with two or more tp values)", ""]
    md += ["## Weak scaling", ""]
    for title, rows in weak.items():
        md += [f"### {title}", "", weak_table(rows), ""]
    if not weak:
        md += ["(no series with b·tp sessions at several tp, from tp = 1)", ""]
    if contexts:
        md += ["## Context sweep", "", "The same draft at each context (scale.sh --ctx LIST): how far the context "
               "pushes it past the weights, and how close each run came to its roofline.", ""]
    for title, rows in contexts.items():
        md += [f"### {title}", "", context_table(rows), ""]
    return md


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", required=True, help="records.jsonl of launch/scale.sh")
    p.add_argument("--out", help="directory for scaling.md, scaling.json and the plots (default: print only)")
    p.add_argument("--projection", help="projection.json of project.py: plotted beside the measurements")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    a = p.parse_args(argv)
    runs = records.dedupe(records.scaling_runs(records.read_runs(a.records)))
    if not runs:
        raise SystemExit(f"report.py: {a.records} holds no scaling records")
    strong = {series_title(k): strong_rows(v) for k, v in strong_series(runs).items()}
    weak = {series_title(k, True): weak_rows(v) for k, v in weak_series(runs).items()}
    contexts = {context_title(k): context_rows(v) for k, v in context_series(runs).items()}
    md = intro(runs) + sections(strong, weak, contexts)
    if a.out:
        projection = tb.read_json(a.projection) if a.projection and os.path.isfile(a.projection) else None
        shared = sum(1 for r in runs if records.shared_reasons(r))
        pngs = [] if a.no_plots else plots.plot(a.out, strong, weak, projection, shared)
        if pngs:
            md += ["## Plots", "", "Measured on the left; the multi-GPU projection (projection.md) on the right, "
                   "marked PROJECTED. Error bars: the p10–p90 spread of the measured drafts, the parameter ranges of "
                   "the projection. Dotted: ideal scaling.", ""] + [f"![{p[:-4]}]({p})" for p in pngs] + [""]
    tb.emit_report("\n".join(md), {"strong": [{"series": k, "rows": v} for k, v in strong.items()],
                                   "weak": [{"series": k, "rows": v} for k, v in weak.items()],
                                   "contexts": [{"series": k, "rows": v} for k, v in contexts.items()]},
                   a.out, "scaling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
