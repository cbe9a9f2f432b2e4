"""Shared pieces of the scaling scripts: drafter geometry, per-rank work and the collectives of one
draft (spec/parallel.md §1-§3, §7), an alpha-beta model per collective and fabric, the fit of
that model to measured CPU MPI runs, and the choice of a compute figure for a projected point.
Standard library only, so that every script runs with the system's python3."""

import json
import math
import os

# ---------------------------------------------------------------------------------------------
# Geometry


def _nested(cfg, key, default=None):
    """A key at the top level or in dflash_config (the config reader's rule)."""
    if key in cfg:
        return cfg[key]
    return cfg.get("dflash_config", {}).get(key, default)


class Geometry:
    """The numbers of a drafter config.json that decide work and traffic."""

    def __init__(self, cfg, name="config"):
        self.name = name
        self.arch = cfg["architectures"][0]
        self.dflash2 = self.arch == "DFlash2DraftModel"
        self.H = int(cfg["hidden_size"])
        self.L = int(cfg["num_hidden_layers"])
        self.Nq = int(cfg["num_attention_heads"])
        self.Nk = int(cfg.get("num_key_value_heads", self.Nq))
        self.D = int(cfg.get("head_dim", self.H // self.Nq))
        self.F = int(cfg["intermediate_size"])
        self.V = int(cfg["vocab_size"])
        self.B = int(_nested(cfg, "block_size", 16))
        kinds = cfg.get("layer_types") or ["full_attention"] * self.L
        self.sliding = [k == "sliding_attention" for k in kinds]
        self.W = int(cfg.get("sliding_window") or 0)
        self.K = int(_nested(cfg, "conv_kernel_size", 0) or 0)
        self.gs = int(_nested(cfg, "conv_group_size", 0) or 0)
        self.R = int(_nested(cfg, "selector_rank", 0) or 0)
        self.k_top = int(_nested(cfg, "selector_top_k", 0) or 0)

    @property
    def G(self):
        return self.H // self.gs if self.gs else 0

    @property
    def candidates(self):
        """Candidates per draft row in the head exchange: k_top for DFlash 2, 1 for greedy DFlash."""
        return self.k_top if self.dflash2 else 1


def load_geometry(path):
    with open(path) as f:
        cfg = json.load(f)
    return Geometry(cfg, os.path.splitext(os.path.basename(path))[0])


def tp_problem(geo, tp):
    """Why tp cannot shard this geometry (the shard plan's rules), or None when it can."""
    if tp < 1:
        return f"tp must be >= 1, got {tp}"
    if geo.Nq % tp:
        return f"num_attention_heads ({geo.Nq}) is not divisible by tp = {tp}"
    if geo.Nk % tp and tp % geo.Nk:
        return f"num_key_value_heads ({geo.Nk}) and tp = {tp}: one must divide the other"
    if geo.F % tp:
        return f"intermediate_size ({geo.F}) is not divisible by tp = {tp}"
    return None


class Shard:
    """What rank 0 of tp ranks holds (the widest slice: it bounds the step time)."""

    def __init__(self, geo, tp):
        problem = tp_problem(geo, tp)
        if problem:
            raise ValueError(f"{geo.name}: {problem}")
        self.tp = tp
        self.q_heads = geo.Nq // tp
        self.kv_heads = geo.Nk // tp if geo.Nk >= tp else 1
        self.ffn = geo.F // tp
        self.vocab_padded = -(-geo.V // tp) * tp
        self.vocab_stride = self.vocab_padded // tp
        self.vocab = min(geo.V, self.vocab_stride)


class Work:
    def __init__(self, flops=0.0, weight_bytes=0.0, context_bytes=0.0):
        self.flops = flops
        self.weight_bytes = weight_bytes
        self.context_bytes = context_bytes

    @property
    def bytes(self):
        return self.weight_bytes + self.context_bytes


def draft_work(geo, tp, sessions, context, weight_bytes=2.0, context_elem_bytes=4.0):
    """FLOPs (2 per multiply-add) and bytes one rank must do and read for one draft: every weight
    of its shard once, its kv heads' context rows, and the GEMMs over M = sessions·B rows."""
    s = Shard(geo, tp)
    H, D, B = geo.H, geo.D, geo.B
    M, Md = sessions * B, sessions * (B - 1)
    layer_params = H * s.q_heads * D * 2 + H * s.kv_heads * D * 2 + 3 * H * s.ffn
    if geo.dflash2:
        layer_params += 2 * (2 * geo.K * geo.G) * H  # both convs' kernel projections
    w = Work()
    for l in range(geo.L):
        keys = min(context, geo.W) if geo.sliding[l] else context
        w.flops += 2 * M * layer_params + 4 * M * s.q_heads * D * (keys + B)
        w.weight_bytes += layer_params * weight_bytes
        w.context_bytes += sessions * keys * 2 * s.kv_heads * D * context_elem_bytes
    w.flops += 2 * Md * s.vocab * H
    w.weight_bytes += s.vocab * H * weight_bytes
    if geo.dflash2:
        w.flops += 2 * Md * geo.R * H
        w.weight_bytes += geo.R * H * weight_bytes
    return w


# ---------------------------------------------------------------------------------------------
# The collectives of one draft

CANDIDATE_BYTES = 16  # (value f32, valid u32, id i64) per candidate on the wire


def collectives(geo, tp, sessions, reduce_elem_bytes=4):
    """[(op, calls, bytes per call on one rank)] of one greedy/selector draft at tp ranks:
    2·L all-reduces of [M, H], one all-gather of each rank's [M', k] candidates (block bytes),
    and the broadcast of the tokens (int64) and their probabilities (f32). Nothing at tp = 1."""
    if tp == 1:
        return []
    M, Md = sessions * geo.B, sessions * (geo.B - 1)
    return [
        ("all_reduce", 2 * geo.L, M * geo.H * reduce_elem_bytes),
        ("all_gather", 1, Md * geo.candidates * CANDIDATE_BYTES),
        ("broadcast", 1, Md * 8),
        ("broadcast", 1, Md * 4),
    ]


def record_collectives(rec):
    """The same list read from a bench record's counters (per draft)."""
    out = []
    for op in ("all_reduce", "all_gather", "broadcast"):
        calls = rec.get(op + "_calls", 0) or 0
        if calls and rec.get("tp", 1) > 1:
            out.append((op, calls, rec[op + "_bytes"] / calls))
    return out


def full_logits_block(geo, tp, sessions):
    """Bytes each rank sends in a full-logits all-gather: its padded slice of M' rows in f32."""
    return sessions * (geo.B - 1) * Shard(geo, tp).vocab_stride * 4


# ---------------------------------------------------------------------------------------------
# Alpha-beta model


class Fabric:
    """One interconnect: alpha (s) per collective call, bandwidth beta (bytes/s) per rank."""

    def __init__(self, name, alpha_s, bw_Bps, source="", label=None):
        self.name = name
        self.alpha = alpha_s if isinstance(alpha_s, dict) else {op: alpha_s for op in ("all_reduce", "all_gather", "broadcast")}
        self.bw = bw_Bps
        self.source = source
        self.label = label or name

    def describe(self):
        alphas = sorted(set(self.alpha.values()))
        a = "/".join(f"{x * 1e6:.3g}" for x in alphas)
        return f"{self.label}: alpha {a} us, beta {self.bw / 1e9:.4g} GB/s"


def fabric_from_params(name, p, which="value"):
    """A Fabric from a comm-model.json entry; which = value | low | high picks the nominal figures
    or the ends of the documented ranges (low = the fast end)."""
    def pick(key):
        v = p[key]
        if which != "value" and key + "_range" in p:
            lo, hi = p[key + "_range"]
            if key == "alpha_us":
                return lo if which == "low" else hi
            return hi if which == "low" else lo  # a faster fabric has more bandwidth
        return v

    alpha = pick("alpha_us")
    if isinstance(alpha, dict):
        alpha_s = {op: alpha.get(op, alpha.get("default")) * 1e-6 for op in ("all_reduce", "all_gather", "broadcast")}
    else:
        alpha_s = alpha * 1e-6
    return Fabric(name, alpha_s, pick("bw_GBps") * 1e9, p.get("source", ""), p.get("label", name))


def collective_time(op, nbytes, tp, intra, inter=None, nodes=1):
    """Seconds of one collective whose per-rank buffer (all-gather: per-rank block) is nbytes, over
    tp ranks on `nodes` nodes. One node: ring/LL cost, all-reduce α + 2(p−1)/p·n/β, all-gather
    α + (p−1)·n/β, broadcast α + n/β. Several nodes: hierarchical (NCCL-like) — the intra-node
    fabric inside, the inter-node one across, each paying its own α."""
    if tp <= 1:
        return 0.0
    if nodes <= 1:
        if op == "all_reduce":
            return intra.alpha[op] + 2 * (tp - 1) / tp * nbytes / intra.bw
        if op == "all_gather":
            return intra.alpha[op] + (tp - 1) * nbytes / intra.bw
        return intra.alpha[op] + nbytes / intra.bw
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
    return sum(calls * collective_time(op, n, tp, intra, inter, nodes) for op, calls, n in colls)


def comm_features(colls, tp):
    """(collective calls, bytes-over-the-link) of one draft on one node: comm = calls·α + bytes/β."""
    calls = sum(c for _, c, _ in colls)
    moved = 0.0
    for op, c, n in colls:
        if op == "all_reduce":
            moved += c * 2 * (tp - 1) / tp * n
        elif op == "all_gather":
            moved += c * (tp - 1) * n
        else:
            moved += c * n
    return calls, moved


def fit_alpha_beta(points):
    """Least squares (relative error) of comm = calls·α + moved/β over [(calls, moved, seconds)],
    with α, 1/β >= 0. Returns (alpha_s, bw_Bps or inf, rms relative residual)."""
    rows = [(c / y, m / y) for c, m, y in points if y > 0]
    if not rows:
        raise ValueError("no measured communication time to fit")

    def solve_one(col):
        num = sum(r[col] for r in rows)  # target 1 after the relative scaling
        den = sum(r[col] ** 2 for r in rows)
        return num / den if den > 0 else 0.0

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
        # One size of message, or a negative coefficient: keep the term that explains more.
        a_only, g_only = solve_one(0), solve_one(1)
        err_a = sum((a * a_only - 1) ** 2 for a, _ in rows)
        err_g = sum((b * g_only - 1) ** 2 for _, b in rows)
        alpha, inv_bw = (a_only, 0.0) if err_a <= err_g else (0.0, g_only)
    resid = math.sqrt(sum((a * alpha + b * inv_bw - 1) ** 2 for a, b in rows) / len(rows))
    return alpha, (1.0 / inv_bw if inv_bw > 0 else math.inf), resid


# ---------------------------------------------------------------------------------------------
# Records


def read_records(path):
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not a JSON line ({e})")
    return recs


def config_name(rec):
    return rec.get("config_name") or os.path.splitext(os.path.basename(rec.get("config", "?")))[0]


def comm_ms(rec):
    """Time inside collectives per draft: the per-draft median when the record has it."""
    return rec.get("comm_ms_median", rec.get("comm_ms", 0.0))


def compute_ms(rec):
    """Time outside collectives per draft (median per draft when present)."""
    if "compute_ms" in rec:
        return rec["compute_ms"]
    return rec["draft_ms"] - rec.get("comm_ms", 0.0)


def oversubscribed(rec):
    if "oversubscribed" in rec:
        return bool(rec["oversubscribed"])
    n = rec.get("nproc")
    return bool(n) and rec.get("tp", 1) * rec.get("threads", 1) > n


def median_record(recs):
    """Of repeated runs of one point, the run with the median draft time (a real record)."""
    s = sorted(recs, key=lambda r: r["draft_ms"])
    return s[(len(s) - 1) // 2]


def group_by(recs, keyfn):
    out = {}
    for r in recs:
        out.setdefault(keyfn(r), []).append(r)
    return out


def gathers_logits(rec):
    """Whether the run also all-gathered the full logits every draft (`bench --gather-logits`):
    its head took the full-logits path and its comm holds a large extra all-gather, so it is no
    compute measurement and no point of the default draft's scaling."""
    return bool(rec.get("gather_logits", False))


def scaling_records(recs):
    """The records of the scaling sweep: strong and weak runs of the default draft (the
    vocabulary study's configs and any full-logits run stay out)."""
    return [r for r in recs if r.get("study", "strong") in ("strong", "weak") and not gathers_logits(r)]


def point_key(rec):
    return (config_name(rec), rec.get("backend", "cpu"), rec.get("context"), rec.get("sessions"),
            rec.get("threads"), rec.get("tp"), gathers_logits(rec))


def dedupe(recs):
    """One record per (config, backend, context, sessions, threads, tp, full-logits gather or not)."""
    return [median_record(v) for v in group_by(recs, point_key).values()]


# ---------------------------------------------------------------------------------------------
# Roofline


def roofline_s(work, flops_per_s, bytes_per_s):
    """Time of one rank's work at a machine's ceilings: the larger of compute and memory time."""
    return max(work.flops / flops_per_s, work.bytes / bytes_per_s)


def record_roofline_s(rec, geo, tp, machine=None):
    """The per-rank roofline time of (geo, tp) at the ceilings the record measured on its machine
    (or at `machine`'s, for records whose own ceilings describe the host, not the device)."""
    w = draft_work(geo, tp, rec["sessions"], rec["context"], weight_bytes=dtype_bytes(rec.get("dtype", "BF16")))
    if machine is not None:
        return roofline_s(w, machine.flops, machine.bw)
    return roofline_s(w, rec["machine_gemm_gflops"] * 1e9, rec["machine_read_gbps"] * 1e9)


def dtype_bytes(name):
    return {"BF16": 2, "F16": 2, "F32": 4}.get(str(name).upper(), 2)


# ---------------------------------------------------------------------------------------------
# Parameters


def load_params(path):
    with open(path) as f:
        return json.load(f)


def default_params_path():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "comm-model.json")


def cpu_fabric(recs, params):
    """The CPU MPI transport: α/β fitted to the measured tp > 1 MPI records (not oversubscribed
    when there are such), else the defaults in params, labelled as such."""
    mpi = [r for r in dedupe(recs) if r.get("tp", 1) > 1 and r.get("communicator") == "mpi"
           and r.get("backend", "cpu") == "cpu" and not gathers_logits(r)]
    quiet = [r for r in mpi if not oversubscribed(r)]
    use = quiet or mpi
    if use:
        pts = []
        for r in use:
            c, m = comm_features(record_collectives(r), r["tp"])
            pts.append((c, m, comm_ms(r) * 1e-3))
        a, bw, resid = fit_alpha_beta(pts)
        tag = "fitted to {} CPU MPI record(s){}; rms rel. residual {:.0%}".format(
            len(use), "" if quiet else ", oversubscribed", resid)
        return Fabric("cpu_mpi", a, bw if math.isfinite(bw) else 1e15, tag, "CPU MPI (fit)")
    p = params["fabrics"]["cpu_mpi"]
    f = fabric_from_params("cpu_mpi", p)
    f.source = "defaults of comm-model.json (no tp > 1 MPI record to fit)"
    f.label = "CPU MPI (default)"
    return f


# ---------------------------------------------------------------------------------------------
# Markdown


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(x) for x in r) + " |")
    return "\n".join(out)


def fmt_ms(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}g}" if x < 10 ** digits else f"{x:.0f}"


def fmt_bytes(n):
    for unit, div in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} B"


# ---------------------------------------------------------------------------------------------
# Compute figures for projected points


class Machine:
    """Ceilings of the machine a projection targets (a GPU's HBM and tensor-core rate)."""

    def __init__(self, label, flops_per_s, bytes_per_s, source=""):
        self.label = label
        self.flops = flops_per_s
        self.bw = bytes_per_s
        self.source = source


def gpu_machine(params, name):
    g = params["gpus"][name]
    return Machine(g.get("label", name), g["bf16_tflops"] * 1e12, g["hbm_GBps"] * 1e9,
                   "; ".join(x for x in (g.get("hbm_source"), g.get("flops_source")) if x))


def _log_distance(a, b):
    return abs(math.log2(a) - math.log2(b))


def compute_candidates(recs, geo, context, backend="cpu", threads=None):
    """Records that can serve as compute measurements for geo: same config name, context, backend
    (and threads per rank when given), never oversubscribed (time-slicing inflates them) and
    never a full-logits run (another head path and a large extra collective)."""
    out = []
    for r in dedupe(recs):
        if gathers_logits(r) or config_name(r) != geo.name or r.get("context") != context or r.get("backend", "cpu") != backend:
            continue
        if threads is not None and r.get("threads") != threads:
            continue
        if oversubscribed(r):
            continue
        out.append(r)
    return out


def estimate_compute(recs, geo, tp, sessions, context, backend="cpu", threads=None, machine=None):
    """(ms, label) of one rank's time outside collectives at (tp, sessions, context) on the machine
    the records were measured on, from the closest measurements:
      1. that point measured: its compute_ms;
      2. the same tp at two or more other session counts: affine in sessions (weights are read
         once per draft, the per-row work grows with the rows), interpolated or extrapolated;
      3. another tp at the same sessions: scaled by the per-rank roofline ratio of the two shards
         (at `machine`'s ceilings when given, else at those the record measured).
    Returns (None, reason) when nothing fits."""
    cands = compute_candidates(recs, geo, context, backend, threads)
    for r in cands:
        if r["tp"] == tp and r["sessions"] == sessions:
            return compute_ms(r), f"measured at tp={tp}, b={sessions}"
    same_tp = sorted({r["sessions"]: r for r in cands if r["tp"] == tp}.items())
    if len(same_tp) >= 2:
        xs = [s for s, _ in same_tp]
        ys = [compute_ms(r) for _, r in same_tp]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        return my + slope * (sessions - mx), f"affine in sessions from b={','.join(map(str, xs))} at tp={tp}"
    same_b = [r for r in cands if r["sessions"] == sessions and tp_problem(geo, r["tp"]) is None]
    if same_b:
        r0 = min(same_b, key=lambda r: (_log_distance(r["tp"], tp), -r["tp"]))
        ratio = record_roofline_s(r0, geo, tp, machine) / record_roofline_s(r0, geo, r0["tp"], machine)
        return compute_ms(r0) * ratio, f"tp={r0['tp']} measured x roofline ratio {ratio:.3g}"
    return None, "no measurement of this config and context"


def estimate_compute_on(machine, recs, geo, tp, sessions, context, weight_bytes=2.0):
    """(ms, label, kind) of one rank's compute on another machine (a GPU). With records of that
    backend the caller uses estimate_compute; here the nearest CPU record's efficiency against
    its own roofline is carried over: T = roofline_target(tp) / (roofline_cpu(rec) / T_cpu(rec)).
    Without any record: the ideal roofline (a lower bound)."""
    ideal = roofline_s(draft_work(geo, tp, sessions, context, weight_bytes), machine.flops, machine.bw) * 1e3
    cands = compute_candidates(recs, geo, context, "cpu")
    if not cands:
        return ideal, f"ideal {machine.label} roofline (no measurement; a lower bound)", "ideal"
    r0 = min(cands, key=lambda r: (r["sessions"] != sessions, _log_distance(r["tp"], tp), -r["tp"]))
    eff = record_roofline_s(r0, geo, r0["tp"]) * 1e3 / compute_ms(r0)
    capped = eff > 1  # cache-resident weights can beat the CPU's streaming ceiling; never the GPU's
    eff = min(eff, 1.0)
    label = (f"roofline estimate: {machine.label} roofline / CPU efficiency {eff:.0%}{' (capped)' if capped else ''} "
             f"(CPU tp={r0['tp']}, b={r0['sessions']})")
    return ideal / eff, label, "roofline"


def emit_report(text, data, out_dir, stem):
    """Prints a report; with out_dir, also writes it as STEM.md and its data as STEM.json there."""
    print(text)
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(data, f, indent=1)
