#!/usr/bin/env python3
"""Scaling tables and plots from the records of launch/scale.sh: strong scaling (one problem, tp
grows: latency, speedup, efficiency T1/(tp·Ttp), communication share) and weak scaling (sessions
grow with tp). Writes OUT/scaling.md, OUT/scaling.json and, with gnuplot, OUT/latency.png,
OUT/efficiency.png and OUT/comm_share.png."""

import argparse
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scalelib as sl  # noqa: E402


def series_title(key, weak=False):
    config, backend, ctx, b, threads = key
    size = f"{b}/rank" if weak else f"b={b}"
    return f"{config} {backend} ctx={ctx} {size} thr={threads}"


def strong_series(recs):
    """{(config, backend, ctx, sessions, threads): [records by tp]} with at least two tp values."""
    groups = sl.group_by(recs, lambda r: (sl.config_name(r), r.get("backend", "cpu"), r["context"], r["sessions"], r["threads"]))
    return {k: sorted(v, key=lambda r: r["tp"]) for k, v in sorted(groups.items()) if len({r["tp"] for r in v}) > 1}


def weak_series(recs):
    """{(config, backend, ctx, sessions per rank, threads): [records by tp]} from tp = 1 up."""
    per_rank = [r for r in recs if r["sessions"] % r["tp"] == 0]
    groups = sl.group_by(per_rank, lambda r: (sl.config_name(r), r.get("backend", "cpu"), r["context"],
                                              r["sessions"] // r["tp"], r["threads"]))
    out = {}
    for k, v in sorted(groups.items()):
        v = sorted(v, key=lambda r: r["tp"])
        if len(v) > 1 and v[0]["tp"] == 1:
            out[k] = v
    return out


def coll_cell(r, op):
    calls = r.get(op + "_calls", 0) or 0
    if not calls:
        return "–"
    return f"{calls:g} x {sl.fmt_bytes(r[op + '_bytes'] / calls)}"


def strong_rows(series):
    base = series[0]
    t1 = base["draft_ms"] * base["tp"]  # the smallest tp stands in for tp = 1 when that is missing
    rows = []
    for r in series:
        t = r["draft_ms"]
        rows.append({
            "tp": r["tp"], "oversubscribed": sl.oversubscribed(r), "draft_ms": t, "p10": r.get("draft_ms_p10"),
            "p90": r.get("draft_ms_p90"), "compute_ms": sl.compute_ms(r), "comm_ms": sl.comm_ms(r),
            "speedup": t1 / t,
            "efficiency": t1 / (r["tp"] * t), "comm_share": sl.comm_ms(r) / t,
            "layers_ms": r.get("layers_ms"), "head_ms": r.get("head_ms"), "select_ms": r.get("select_ms"),
            "all_reduce": coll_cell(r, "all_reduce"), "all_gather": coll_cell(r, "all_gather"),
            "broadcast": coll_cell(r, "broadcast"), "weights": sl.fmt_bytes(r.get("weights_bytes_per_rank", 0)),
            "context": sl.fmt_bytes(r.get("context_bytes_per_rank", 0)),
        })
    return rows


def weak_rows(series):
    t1 = series[0]["draft_ms"]
    rows = []
    for r in series:
        t = r["draft_ms"]
        tokens = r["sessions"] * (len(r.get("tokens", [])) or 1)  # `tokens` holds session 0's B-1 drafts
        rows.append({"tp": r["tp"], "sessions": r["sessions"], "oversubscribed": sl.oversubscribed(r), "draft_ms": t,
                     "compute_ms": sl.compute_ms(r), "comm_ms": sl.comm_ms(r), "efficiency": t1 / t,
                     "comm_share": sl.comm_ms(r) / t, "tokens_per_s": tokens * 1e3 / t})
    return rows


def strong_table(rows):
    header = ["tp", "draft ms (median)", "p10–p90", "compute ms", "comm ms", "speedup", "efficiency", "comm share",
              "layers / head / select ms", "all-reduce", "all-gather", "broadcast", "weights/rank", "context/rank"]
    out = []
    for r in rows:
        tp = f"{r['tp']}" + (" (oversubscribed)" if r["oversubscribed"] else "")
        spread = f"{sl.fmt_ms(r['p10'])}–{sl.fmt_ms(r['p90'])}" if r["p10"] is not None else "–"
        phases = "/".join(sl.fmt_ms(r[k]) for k in ("layers_ms", "head_ms", "select_ms"))
        out.append([tp, sl.fmt_ms(r["draft_ms"]), spread, sl.fmt_ms(r["compute_ms"]), sl.fmt_ms(r["comm_ms"]),
                    f"{r['speedup']:.2f}", f"{r['efficiency']:.0%}", f"{r['comm_share']:.0%}", phases,
                    r["all_reduce"], r["all_gather"], r["broadcast"], r["weights"], r["context"]])
    return sl.md_table(header, out)


def weak_table(rows):
    header = ["tp", "sessions", "draft ms (median)", "compute ms", "comm ms", "weak efficiency", "comm share", "draft tokens/s"]
    out = [[f"{r['tp']}" + (" (oversubscribed)" if r["oversubscribed"] else ""), r["sessions"], sl.fmt_ms(r["draft_ms"]),
            sl.fmt_ms(r["compute_ms"]), sl.fmt_ms(r["comm_ms"]), f"{r['efficiency']:.0%}", f"{r['comm_share']:.0%}",
            f"{r['tokens_per_s']:.0f}"] for r in rows]
    return sl.md_table(header, out)


def machine_lines(recs):
    lines = []
    for (host, cpu, nproc), _ in sl.group_by(recs, lambda r: (r.get("hostname", "?"), r.get("cpu_model", "?"),
                                                              r.get("nproc", "?"))).items():
        lines.append(f"- {host}: {cpu}, {nproc} core(s)")
    gpus = sorted({r["gpu_name"] for r in recs if r.get("gpu_name")})
    if gpus:
        lines.append(f"- GPU: {', '.join(gpus)}")
    return lines


def gnuplot_terminal():
    probe = subprocess.run(["gnuplot", "-e", "set terminal pngcairo"], capture_output=True, text=True)
    return "pngcairo size 960,600 font ',10'" if probe.returncode == 0 and not probe.stderr.strip() else "png size 960,600"


def plot(out_dir, strong, weak):
    """latency.png, efficiency.png and comm_share.png against tp, one line per series."""
    if shutil.which("gnuplot") is None:
        print("report.py: gnuplot not found (apt-get install gnuplot-nox): tables only", file=sys.stderr)
        return []
    data_dir = os.path.join(out_dir, "plot-data")
    os.makedirs(data_dir, exist_ok=True)
    files = []
    for i, (key, rows) in enumerate(list(strong.items()) + list(weak.items())):
        is_weak = i >= len(strong)
        path = os.path.join(data_dir, f"{'weak' if is_weak else 'strong'}-{i}.dat")
        with open(path, "w") as f:
            f.write("# tp draft_ms efficiency comm_share\n")
            for r in rows:
                f.write(f"{r['tp']} {r['draft_ms']:.6g} {r['efficiency']:.6g} {r['comm_share']:.6g}\n")
        files.append((path, series_title(key, is_weak) + (" (weak)" if is_weak else ""), is_weak))
    if not files:
        return []
    tps = sorted({r["tp"] for rows in list(strong.values()) + list(weak.values()) for r in rows})
    common = [f"set terminal {gnuplot_terminal().replace('960,600', f'960,{560 + 18 * len(files)}')}", "set logscale x 2", "set grid", "set key below Left reverse",
              "set xlabel 'tensor-parallel ranks (tp)'", "set xtics (" + ", ".join(f"'{t}' {t}" for t in tps) + ")",
              f"set xrange [{tps[0] / 1.2}:{tps[-1] * 1.2}]"]

    def plot_cmd(col, only_strong=False):
        parts = []
        for path, title, is_weak in files:
            if only_strong and is_weak:
                continue
            style = "linespoints dashtype 2" if is_weak else "linespoints"
            parts.append(f"'{path}' using 1:{col} with {style} title '{title}'")
        return "plot " + ", \\\n  ".join(parts)

    script = common + [
        f"set output '{os.path.join(out_dir, 'latency.png')}'", "set ylabel 'draft latency, ms (median)'",
        "set title 'Latency per draft'", "set logscale y", plot_cmd(2), "unset logscale y",
        f"set output '{os.path.join(out_dir, 'efficiency.png')}'", "set ylabel 'efficiency'", "set yrange [0:1.2]",
        "set title 'Parallel efficiency (strong: T1/(tp*Ttp); weak, dashed: T1/Ttp)'", plot_cmd(3),
        f"set output '{os.path.join(out_dir, 'comm_share.png')}'", "set ylabel 'share of the draft in collectives'",
        "set yrange [0:1]", "set title 'Communication share (comm ms / draft ms)'", plot_cmd(4, only_strong=True),
    ]
    res = subprocess.run(["gnuplot"], input="\n".join(script) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        print(f"report.py: gnuplot failed: {res.stderr.strip()}", file=sys.stderr)
        return []
    return ["latency.png", "efficiency.png", "comm_share.png"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", required=True, help="records.jsonl of launch/scale.sh")
    p.add_argument("--out", help="directory for scaling.md, scaling.json and the plots (default: print only)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    recs = sl.dedupe(sl.scaling_records(sl.read_records(a.records)))
    if not recs:
        raise SystemExit(f"report.py: {a.records} holds no scaling records")
    strong = {k: strong_rows(v) for k, v in strong_series(recs).items()}
    weak = {k: weak_rows(v) for k, v in weak_series(recs).items()}
    md = ["# Scaling", "", "Machine(s):", *machine_lines(recs), "",
          "Strong scaling: the same drafts at every tp. speedup = T(1)/T(tp), efficiency = T(1)/(tp·T(tp)), "
          "comm share = time inside collectives / draft time (medians per draft). Weak scaling: tp·b sessions "
          "at tp ranks, efficiency = T(1, b)/T(tp, tp·b). Oversubscribed runs time-slice ranks on fewer cores.", ""]
    md += ["## Strong scaling", ""]
    for key, rows in strong.items():
        md += [f"### {series_title(key)}", ""]
        if rows[0]["tp"] != 1:
            md += [f"(no tp = 1 run: speedup and efficiency take {rows[0]['tp']}·T({rows[0]['tp']}) for T(1))", ""]
        md += [strong_table(rows), ""]
    if not strong:
        md += ["(no series with two or more tp values)", ""]
    md += ["## Weak scaling", ""]
    for key, rows in weak.items():
        md += [f"### {series_title(key, weak=True)}", "", weak_table(rows), ""]
    if not weak:
        md += ["(no series with b·tp sessions at several tp, from tp = 1)", ""]
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        pngs = [] if a.no_plots else plot(a.out, strong, weak)
        if pngs:
            md += ["## Plots", ""] + [f"![{p[:-4]}]({p})" for p in pngs] + [""]
    text = "\n".join(md)
    print(text)
    if a.out:
        with open(os.path.join(a.out, "scaling.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(a.out, "scaling.json"), "w") as f:
            json.dump({"strong": [{"series": series_title(k), "rows": v} for k, v in strong.items()],
                       "weak": [{"series": series_title(k, True), "rows": v} for k, v in weak.items()]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
