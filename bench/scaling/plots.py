"""The scaling plots (gnuplot PNGs latency, efficiency, comm_share; data in plot-data/): measured
runs (left: p10–p90 error bars, runs on a machine that was not idle circled) beside the
multi-GPU projection (right, marked PROJECTED, the parameter ranges as error bars), each with its
ideal-scaling line."""

import os
import shutil
import subprocess
import sys

# Columns of every .dat file written here.
COLUMNS = "tp ms ms_low ms_high efficiency_pct eff_low_pct eff_high_pct comm_pct ideal_ms shared"
X, MS, MS_LO, MS_HI, EFF, EFF_LO, EFF_HI, COMM, IDEAL, SHARED = range(1, 11)


def plot_row(tp, t, lo, hi, t1, scale, comm_share, shared):
    """One row of COLUMNS: efficiency t1 / (scale·t), its range from the slow and the fast end."""
    return (tp, t, lo, hi, 100 * t1 / (scale * t), 100 * t1 / (scale * hi), 100 * t1 / (scale * lo),
            100 * comm_share, t1 / tp, shared)


def measured_points(rows):
    """Plot rows of one measured series (report.py's strong or weak rows)."""
    t1 = rows[0]["t1_ms"]
    # weak: T1 / T(tp), no tp in the denominator
    return [plot_row(r["tp"], r["draft_ms"], r.get("p10") or r["draft_ms"],
                     r.get("p90") or r["draft_ms"], t1, 1 if r.get("weak") else r["tp"],
                     r["comm_share"], 1 if r.get("shared") else 0) for r in rows]


def projected_points(points):
    """Plot rows of one projected series: projection.json gpu points of one (config, ctx, sessions)."""
    rows = sorted(points, key=lambda p: p["tp"])
    t1 = rows[0]["total_ms"] * rows[0]["tp"]  # the smallest tp stands in for tp = 1 when that is missing
    return [plot_row(p["tp"], p["total_ms"], *p["total_ms_range"], t1, p["tp"], p["comm_share"], 0) for p in rows]


def projected_series(projection):
    """{title: [points]} of the projection's single-group layouts (one point per tp)."""
    series = {}
    for p in [p for p in projection.get("gpu_points", []) if "skipped" not in p and p.get("replicas", 1) == 1]:
        title = f"{p['config']} ctx={p['context']} b={p['sessions']}"
        series.setdefault(title, {})[p["tp"]] = p
    return {t: list(v.values()) for t, v in series.items() if v}


def write_dat(path, points):
    """Writes the points under a COLUMNS header; returns their tp values."""
    with open(path, "w") as f:
        f.write(f"# {COLUMNS}\n")
        for p in points:
            f.write(" ".join(f"{x:.6g}" for x in p) + "\n")
    return [p[0] for p in points]


def gnuplot_terminal(width, height):
    probe = subprocess.run(["gnuplot", "-e", "set terminal pngcairo"], capture_output=True, text=True)
    if probe.returncode == 0 and not probe.stderr.strip():
        return f"pngcairo size {width},{height} font 'Sans,11' linewidth 1.5"
    return f"png size {width},{height}"


def panel(title, ylabel, files, y, spread, ideal, tps, shared_note=None):
    """Gnuplot commands of one panel: each series with error bars, and the ideal line: per series
    (a column) or one constant for all (an expression)."""
    cmds = [f"set title \"{title}\"", f"set ylabel '{ylabel}'",
            "set xtics (" + ", ".join(f"'{t}' {t}" for t in tps) + ")",
            f"set xrange [{tps[0] / 1.25}:{tps[-1] * 1.25}]", "unset label"]
    if shared_note:
        cmds.append(f"set label 1 \"{shared_note}\" at graph 0.02, graph 0.96 font ',10' textcolor rgb '#b00000'")
    parts = []
    for i, (path, name, dashed) in enumerate(files, 1):
        style = f"linecolor {i} pointtype 7 pointsize 1.2" + (" dashtype 2" if dashed else "")
        parts.append(f"'{path}' using {X}:{y}:{spread[0]}:{spread[1]} with yerrorlines {style} title '{name}'")
        if isinstance(ideal, int) and not dashed:
            parts.append(f"'{path}' using {X}:{ideal} with lines linecolor {i} dashtype 3 notitle")
    if ideal is not None:
        curve = ideal if isinstance(ideal, str) else "1/0"
        parts.append(f"{curve} with lines linecolor rgb 'gray40' dashtype 3 title 'ideal scaling (dotted)'")
    if shared_note:
        parts.append(f"for [f in '{' '.join(p for p, _, _ in files)}'] f using {X}:(${SHARED} > 0 ? ${y} : 1/0) "
                     "with points pointtype 6 pointsize 3 linecolor rgb '#b00000' notitle")
    return cmds + ["plot " + ", \\\n  ".join(parts)]


FIGURES = (
    # (file, y label, title, y column, spread columns, ideal: column or constant, y range)
    ("latency.png", "draft latency, ms", "Latency per draft", MS, (MS_LO, MS_HI), IDEAL, "[0:*]"),
    ("efficiency.png", "parallel efficiency, %", "Efficiency T(1) / (tp·T(tp)); weak, dashed: T(1) / T(tp)", EFF,
     (EFF_LO, EFF_HI), "100", "[0:120]"),
    ("comm_share.png", "share of the draft in collectives, %", "Communication share", COMM, (COMM, COMM), None,
     "[0:100]"),
)


def figure_script(out_dir, fig, measured, projected, tps, shared_note, projection_label):
    name, ylabel, title, y, spread, ideal, yrange = fig
    two = bool(projected)
    entries = max(len(measured), len(projected)) + 1  # the key below the panels: one line each at most
    size = (1500 if two else 900, 520 + 18 * entries)
    script = [f"set terminal {gnuplot_terminal(*size)}", f"set output '{os.path.join(out_dir, name)}'",
              "set logscale x 2", "set grid", "set key below left Left reverse font ',10'",
              "set xlabel 'tensor-parallel ranks (tp)' offset 0,0.3", f"set bmargin {4 + entries}",
              f"set yrange {yrange}", "set format y '%g'"]
    script.append("set multiplot layout 1,2" if two else "")
    script += panel(f"MEASURED\\n{title}", f"{ylabel} (median)", measured, y, spread, ideal, tps["measured"],
                    shared_note)
    if two:
        script += panel(f"PROJECTED: {projection_label} (model, not measured)\\n{title.split(';')[0]}",
                        f"{ylabel} (projected)", projected, y, spread, ideal, tps["projected"])
        script.append("unset multiplot")
    return script


def plot(out_dir, strong, weak, projection=None, shared_runs=0):
    """The three figures; returns their file names (empty without gnuplot or data). shared_runs:
    how many runs were on a machine that was not idle (their points are circled)."""
    if shutil.which("gnuplot") is None:
        print("report.py: gnuplot not found (apt-get install gnuplot-nox): tables only", file=sys.stderr)
        return []
    data_dir = os.path.join(out_dir, "plot-data")
    os.makedirs(data_dir, exist_ok=True)
    measured, tps = [], {"measured": set(), "projected": set()}
    for kind, series in (("strong", strong), ("weak", weak)):
        for i, (title, rows) in enumerate(series.items()):
            path = os.path.join(data_dir, f"{kind}-{i}.dat")
            tps["measured"].update(write_dat(path, measured_points(rows)))
            measured.append((path, title + (" (weak)" if kind == "weak" else ""), kind == "weak"))
    if not measured:
        return []
    projected = []
    for i, (title, points) in enumerate(projected_series(projection or {}).items()):
        path = os.path.join(data_dir, f"projected-{i}.dat")
        tps["projected"].update(write_dat(path, projected_points(points)))
        projected.append((path, title, False))
    tps = {k: sorted(v) for k, v in tps.items()}
    note = f"circled: run(s) on a machine that was not idle ({shared_runs})" if shared_runs else None
    label = (projection or {}).get("gpu", "GPU")
    files = []
    for fig in FIGURES:
        script = figure_script(out_dir, fig, measured, projected, tps, note, f"{label} x tp")
        res = subprocess.run(["gnuplot"], input="\n".join(script) + "\n", capture_output=True, text=True)
        if res.returncode != 0:
            print(f"report.py: gnuplot failed on {fig[0]}: {res.stderr.strip()}", file=sys.stderr)
            return files
        files.append(fig[0])
    return files
