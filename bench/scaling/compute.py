"""The compute half of a projected draft: the time one rank spends outside collectives, taken
from the nearest measurement (the point itself, affine in sessions, or another tp scaled by the
roofline ratio of the two shards) or carried to another machine (a GPU) through the measured
efficiency against the roofline. Work counts come from `tpdraft info --json` (geometry.py)."""

import math
import statistics
from collections import namedtuple

import geometry
import records

# Ceilings of the machine a projection targets (a GPU's HBM and tensor-core rate): flops per
# second, bw in bytes per second.
Machine = namedtuple("Machine", "label flops bw source", defaults=("",))


def gpu_machine(params, name):
    g = params["gpus"][name]
    return Machine(g.get("label", name), g["bf16_tflops"] * 1e12, g["hbm_GBps"] * 1e9,
                   "; ".join(x for x in (g.get("hbm_source"), g.get("flops_source")) if x))


def run_machine(run):
    """The ceilings a run measured on its own machine."""
    return Machine(run.hostname, run.machine_gemm_gflops * 1e9, run.machine_read_gbps * 1e9, "measured by the run")


def roofline_s(work, machine):
    """Time of one rank's work at a machine's ceilings: the larger of compute and memory time."""
    return max(work.flops / machine.flops, geometry.total_bytes(work) / machine.bw)


def _log_distance(a, b):
    return abs(math.log2(a) - math.log2(b))


def compute_candidates(runs, name, context, backend="cpu", threads=None, busy_too=False):
    """Runs that can serve as compute measurements for config `name`: same context and backend
    (and threads per rank when given), never oversubscribed (time-slicing inflates them) and never
    a full-logits run (another head path and a large extra collective). Runs on a machine that was
    not idle only when no idle one fits, or with busy_too."""
    out = [r for r in records.dedupe(runs) if not r.gather_logits and not r.oversubscribed
           and (r.config_name, r.context, r.backend) == (name, context, backend)
           and threads in (None, r.threads)]
    idle = [r for r in out if not records.shared_reasons(r)]
    return out if busy_too else idle or out


def busy_note(run):
    return " (machine not idle)" if records.shared_reasons(run) else ""


def estimate_compute(runs, info, config, tp, sessions, context, backend="cpu", threads=None, machine=None):
    """(ms, label) of one rank's time outside collectives at (tp, sessions, context) on the machine
    the runs were measured on, from the closest measurements:
      1. that point measured: its compute_ms;
      2. the same tp at two or more other session counts: affine in sessions (weights are read
         once per draft, the per-row work grows with the rows), interpolated or extrapolated;
      3. another tp at the same sessions: scaled by the per-rank roofline ratio of the two shards
         (at `machine`'s ceilings when given, else at those the run measured).
    Runs on a machine that was not idle count where the idle ones give no estimate.
    Returns (None, reason) when nothing fits."""
    name = geometry.config_name(config)
    for busy_too in (False, True):
        cands = compute_candidates(runs, name, context, backend, threads, busy_too)
        found = _estimate_from(cands, info, config, tp, sessions, context, machine)
        if found:
            return found
    return None, "no measurement of this config and context"


def _estimate_from(cands, info, config, tp, sessions, context, machine):
    """estimate_compute's three ways over the runs `cands`; None when none applies."""
    for r in cands:
        if r.tp == tp and r.sessions == sessions:
            return r.compute_ms, f"measured at tp={tp}, b={sessions}{busy_note(r)}"
    same_tp = sorted({r.sessions: r for r in cands if r.tp == tp}.values(), key=lambda r: r.sessions)
    if len(same_tp) >= 2:
        label = f"affine in sessions from b={','.join(str(r.sessions) for r in same_tp)} at tp={tp}"
        label += busy_note(max(same_tp, key=lambda r: bool(records.shared_reasons(r))))
        slope, intercept = statistics.linear_regression([r.sessions for r in same_tp], [r.compute_ms for r in same_tp])
        return slope * sessions + intercept, label
    same_b = [r for r in cands if r.sessions == sessions and info.problem(config, r.tp) is None]
    if same_b:
        r0 = min(same_b, key=lambda r: (_log_distance(r.tp, tp), -r.tp))
        ceilings = machine or run_machine(r0)
        at = [roofline_s(geometry.work(info.query(config, t, sessions, context, r0.dtype)), ceilings) for t in (tp, r0.tp)]
        ratio = at[0] / at[1]
        return r0.compute_ms * ratio, f"tp={r0.tp} measured{busy_note(r0)} x roofline ratio {ratio:.3g}"
    return None


def estimate_compute_on(machine, runs, info, config, tp, sessions, context, dtype="bf16", quant="", draft_vocab=0):
    """(ms, label, kind) of one rank's compute on another machine (a GPU). The nearest CPU run's
    efficiency against its own roofline is carried over: T = roofline_target(tp) / (roofline_cpu(run)
    / T_cpu(run)). Without any run: the ideal roofline (a lower bound). With `quant` (a --quant
    preset) the target's roofline counts the quantized weights' bytes, and with `draft_vocab` N the
    head of a draft vocabulary of N ids, at the full float run's efficiency."""
    ideal = roofline_s(geometry.work(info.query(config, tp, sessions, context, dtype, quant, draft_vocab)),
                       machine) * 1e3
    cands = compute_candidates(runs, geometry.config_name(config), context, "cpu")
    if not cands:
        return ideal, f"ideal {machine.label} roofline (no measurement; a lower bound)", "ideal"
    r0 = min(cands, key=lambda r: (r.sessions != sessions, _log_distance(r.tp, tp), -r.tp))
    own = geometry.work(info.query(config, r0.tp, r0.sessions, context, r0.dtype))
    eff = roofline_s(own, run_machine(r0)) * 1e3 / r0.compute_ms
    capped = eff > 1  # cache-resident weights can beat the CPU's streaming ceiling; never the GPU's
    eff = min(eff, 1.0)
    label = (f"roofline estimate: {machine.label} roofline / CPU efficiency {eff:.0%}{' (capped)' if capped else ''} "
             f"(CPU tp={r0.tp}, b={r0.sessions}{busy_note(r0)})")
    return ideal / eff, label, "roofline"
