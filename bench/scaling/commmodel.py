"""The cost of a draft's collectives: an alpha-beta model per collective and fabric (one node, or
hierarchical across nodes), the parameters of bench/scaling/comm-model.json, and the fit of
alpha and beta to the measured CPU MPI runs of a sweep. The collectives themselves come from
`tpdraft info --json` (geometry.py) or from a run's counters (records.py)."""

import math
import os

import records

OPS = records.OPS


class Fabric:
    """One interconnect: alpha (s) per collective call, bandwidth beta (bytes/s) per rank."""

    def __init__(self, name, alpha_s, bw_Bps, source="", label=None):
        self.name = name
        self.alpha = alpha_s if isinstance(alpha_s, dict) else {op: alpha_s for op in OPS}
        self.bw = bw_Bps
        self.source = source
        self.label = label or name

    def describe(self):
        a = "/".join(f"{x * 1e6:.3g}" for x in sorted(set(self.alpha.values())))
        return f"{self.label}: alpha {a} us, beta {self.bw / 1e9:.4g} GB/s"


def default_params_path():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "comm-model.json")


def fabric_from_params(name, p, which="value"):
    """A Fabric from a comm-model.json entry; which = value | low | high picks the nominal figures
    or the ends of the documented ranges (low = the fast end)."""
    def pick(key):
        if which != "value" and key + "_range" in p:
            lo, hi = p[key + "_range"]
            if key == "alpha_us":
                return lo if which == "low" else hi
            return hi if which == "low" else lo  # a faster fabric has more bandwidth
        return p[key]

    alpha = pick("alpha_us")
    alpha_s = ({op: alpha.get(op, alpha.get("default")) * 1e-6 for op in OPS} if isinstance(alpha, dict)
               else alpha * 1e-6)
    return Fabric(name, alpha_s, pick("bw_GBps") * 1e9, p.get("source", ""), p.get("label", name))


def fabric_range(params, name):
    """{value, low, high}: the nominal fabric and the two ends of its documented ranges."""
    p = params["fabrics"][name]
    return {w: fabric_from_params(name, p, w) for w in ("value", "low", "high")}


def collective_time(op, nbytes, tp, intra, inter=None, nodes=1):
    """Seconds of one collective whose per-rank buffer (all-gather: per-rank block) is nbytes, over
    tp ranks on `nodes` nodes. One node: ring/LL cost, all-reduce α + 2(p−1)/p·n/β, all-gather
    α + (p−1)·n/β, broadcast α + n/β. Several nodes: hierarchical (NCCL-like) — the intra-node
    fabric inside, the inter-node one across, each paying its own α."""
    if tp <= 1:
        return 0.0
    if nodes <= 1:
        return intra.alpha[op] + link_bytes(op, nbytes, tp) / intra.bw
    if inter is None:
        raise ValueError("a collective across nodes needs the inter-node fabric")
    g = tp // nodes  # ranks per node
    if op == "all_reduce":
        # reduce-scatter inside the node, all-reduce of 1/g of the data across, all-gather inside
        t = 2 * intra.alpha[op] + 2 * (g - 1) / g * nbytes / intra.bw if g > 1 else 0.0
        return t + inter.alpha[op] + 2 * (nodes - 1) / nodes * (nbytes / g) / inter.bw
    if op == "all_gather":
        t = inter.alpha[op] + (nodes - 1) * nbytes / inter.bw
        return t + (intra.alpha[op] + (g - 1) * nodes * nbytes / intra.bw if g > 1 else 0.0)
    t = inter.alpha[op] + nbytes / inter.bw
    return t + (intra.alpha[op] + nbytes / intra.bw if g > 1 else 0.0)


def comm_time(colls, tp, intra, inter=None, nodes=1):
    """Seconds of a draft's collectives [(op, calls, bytes per call)]."""
    return sum(calls * collective_time(op, n, tp, intra, inter, nodes) for op, calls, n in colls)


def link_bytes(op, nbytes, tp):
    """Bytes one rank moves over a one-node ring in one call of op with an nbytes buffer."""
    if op == "all_reduce":
        return 2 * (tp - 1) / tp * nbytes
    return (tp - 1) * nbytes if op == "all_gather" else nbytes


def comm_features(colls, tp):
    """(collective calls, bytes-over-the-link) of one draft on one node: comm = calls·α + bytes/β."""
    return sum(c for _, c, _ in colls), sum(c * link_bytes(op, n, tp) for op, c, n in colls)


def _one_term(rows):
    """The better of α alone and 1/β alone, for one message size or a negative coefficient."""
    def solve(col):
        den = sum(r[col] ** 2 for r in rows)
        return sum(r[col] for r in rows) / den if den > 0 else 0.0

    a_only, g_only = solve(0), solve(1)
    err_a = sum((a * a_only - 1) ** 2 for a, _ in rows)
    err_g = sum((b * g_only - 1) ** 2 for _, b in rows)
    return (a_only, 0.0) if err_a <= err_g else (0.0, g_only)


def fit_alpha_beta(points):
    """Least squares (relative error) of comm = calls·α + moved/β over [(calls, moved, seconds)],
    with α, 1/β >= 0. Returns (alpha_s, bw_Bps or inf, rms relative residual)."""
    rows = [(c / y, m / y) for c, m, y in points if y > 0]
    if not rows:
        raise ValueError("no measured communication time to fit")
    s11 = sum(a * a for a, _ in rows)
    s12 = sum(a * b for a, b in rows)
    s22 = sum(b * b for _, b in rows)
    t1 = sum(a for a, _ in rows)
    t2 = sum(b for _, b in rows)
    det = s11 * s22 - s12 * s12
    alpha = inv_bw = None
    if det > 1e-12 * max(s11 * s22, 1e-300):
        alpha = (t1 * s22 - t2 * s12) / det
        inv_bw = (s11 * t2 - s12 * t1) / det
    if alpha is None or alpha < 0 or inv_bw < 0:
        alpha, inv_bw = _one_term(rows)
    resid = math.sqrt(sum((a * alpha + b * inv_bw - 1) ** 2 for a, b in rows) / len(rows))
    return alpha, (1.0 / inv_bw if inv_bw > 0 else math.inf), resid


def cpu_fabric(runs, params):
    """The CPU MPI transport: α/β fitted to the measured tp > 1 MPI runs (those not
    oversubscribed when there are such), else the defaults in params, labelled as such."""
    mpi = [r for r in records.dedupe(runs) if r.tp > 1 and r.communicator == "mpi" and r.backend == "cpu"
           and not r.gather_logits]
    quiet = [r for r in mpi if not r.oversubscribed]
    use = quiet or mpi
    if use:
        pts = [(*comm_features(records.measured_collectives(r), r.tp), r.comm_ms * 1e-3) for r in use]
        a, bw, resid = fit_alpha_beta(pts)
        tag = "fitted to {} CPU MPI record(s){}; rms rel. residual {:.0%}".format(
            len(use), "" if quiet else ", oversubscribed", resid)
        return Fabric("cpu_mpi", a, bw if math.isfinite(bw) else 1e15, tag, "CPU MPI (fit)")
    f = fabric_from_params("cpu_mpi", params["fabrics"]["cpu_mpi"])
    return Fabric(f.name, f.alpha, f.bw, "defaults of comm-model.json (no tp > 1 MPI record to fit)",
                  "CPU MPI (default)")
