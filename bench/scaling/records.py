"""The records of a scaling sweep: the key names of `tpdraft bench --json` that these scripts read
(the contract with the program, written down here and nowhere else), the fields launch/scale.sh
adds to each record (run parameters, the machine and its load around the run), and the pure
functions that read, group and judge records."""

import datetime
import json
import os
import sys
from dataclasses import dataclass, field

import geometry

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import timing  # noqa: E402  (bench/timing.py)

OPS = ("all_reduce", "all_gather", "broadcast")

# Run fields read straight from a record, by the key of `tpdraft bench --json`
# (src/cli/cmd_bench.cpp; the same name unless given) or, from "study" on, of record.py.
COPIED = {k: k for k in (
    "tp sessions context threads backend communicator dtype draft_ms draft_ms_p10 draft_ms_p90 "
    "layers_ms head_ms select_ms draft_gflop draft_gbytes machine_read_gbps machine_gemm_gflops "
    "roofline_ms roofline_ratio gather_logits study vocab_size nproc cpu_model hostname gpu_name load hosts "
    "note").split()}
COPIED.update(weights_bytes="weights_bytes_per_rank", context_bytes="context_bytes_per_rank")
# Bench keys the derived fields come from.
CONFIG, TOKENS = "config", "tokens"
COMPUTE_MS, COMM_MS_MEAN, COMM_MS_MEDIAN = "compute_ms", "comm_ms", "comm_ms_median"
# Keys record.py adds besides the copied ones.
CONFIG_FILE, CONFIG_NAME, TIMESTAMP, OVERSUBSCRIBED = "config_file", "config_name", "timestamp", "oversubscribed"

# When a record says the machine was not idle during its run (see shared_reasons).
SPREAD_LIMIT = 0.10        # (p90 - p10) / median
OTHER_CORES_LIMIT, STEAL_LIMIT = timing.OTHER_CORES_LIMIT, timing.STEAL_LIMIT  # (other load: bench/timing.py)


@dataclass
class Run:
    """One `tpdraft bench` run as launch/scale.sh recorded it."""
    config_name: str
    config_file: str
    tp: int
    sessions: int
    context: int
    threads: int = 1
    backend: str = "cpu"
    communicator: str = "single"
    dtype: str = "BF16"
    draft_ms: float = 0.0
    draft_ms_p10: float = None
    draft_ms_p90: float = None
    compute_ms: float = 0.0
    comm_ms: float = 0.0
    layers_ms: float = None
    head_ms: float = None
    select_ms: float = None
    collectives: dict = field(default_factory=dict)  # op -> (calls, bytes) per draft
    weights_bytes: float = 0.0
    context_bytes: float = 0.0
    draft_gflop: float = 0.0
    draft_gbytes: float = 0.0
    machine_read_gbps: float = 0.0
    machine_gemm_gflops: float = 0.0
    roofline_ms: float = None  # the draft's work at the ceilings the run measured (max of FLOPs, bytes)
    roofline_ratio: float = None  # draft_ms / roofline_ms
    draft_tokens: int = 0  # tokens session 0 drafted (B - 1)
    gather_logits: bool = False
    study: str = "strong"
    vocab_size: int = None
    nproc: int = None
    cpu_model: str = "?"
    hostname: str = "?"
    gpu_name: str = None
    oversubscribed: bool = False
    load: dict = None
    hosts: int = 1  # nodes the ranks were spread over (scale.sh --hostfile)
    note: str = None  # scale.sh --note: why these runs are not what they seem, e.g. "2 hosts, one machine"

    @property
    def spread(self):
        """(p90 - p10) / median of the draft time, or None when the record has no spread."""
        if self.draft_ms_p10 is None or self.draft_ms_p90 is None or not self.draft_ms:
            return None
        return (self.draft_ms_p90 - self.draft_ms_p10) / self.draft_ms


def run_from_json(d):
    """A Run from one records.jsonl object (older records lack some keys: their defaults stand)."""
    kw = {attr: d[key] for attr, key in COPIED.items() if key in d and d[key] is not None}
    kw["config_file"] = d.get(CONFIG_FILE) or d.get(CONFIG, "?")
    kw["config_name"] = d.get(CONFIG_NAME) or geometry.config_name(kw["config_file"] or "?")
    kw["comm_ms"] = d.get(COMM_MS_MEDIAN, d.get(COMM_MS_MEAN, 0.0))
    kw["compute_ms"] = d.get(COMPUTE_MS, d[COPIED["draft_ms"]] - d.get(COMM_MS_MEAN, 0.0))
    # Each collective's per-draft counters: bench keys OP_calls and OP_bytes.
    kw["collectives"] = {op: (d.get(f"{op}_calls") or 0, d.get(f"{op}_bytes") or 0) for op in OPS}
    kw["draft_tokens"] = len(d.get(TOKENS) or [])
    if "roofline_ratio" not in kw:  # records older than the key: the bench's formula over its own fields
        kw.update(roofline(kw))
    over = d.get(OVERSUBSCRIBED)
    if over is None:  # records older than the flag
        over = bool(kw.get("nproc")) and kw.get("tp", 1) * kw.get("threads", 1) > kw["nproc"]
    kw["oversubscribed"] = bool(over)
    return Run(**kw)


def roofline(kw):
    """{roofline_ms, roofline_ratio} of a record without them, as `tpdraft bench` computes them: the
    larger of its FLOPs at the GEMM rate and its bytes at the read rate it measured; {} when the
    record lacks the ceilings."""
    gflop, gbytes = kw.get("draft_gflop", 0.0), kw.get("draft_gbytes", 0.0)
    gemm, read = kw.get("machine_gemm_gflops", 0.0), kw.get("machine_read_gbps", 0.0)
    if not (gemm > 0 and read > 0 and (gflop > 0 or gbytes > 0)):
        return {}
    ms = max(gflop / gemm, gbytes / read) * 1e3
    return {"roofline_ms": ms, "roofline_ratio": kw.get("draft_ms", 0.0) / ms}


def read_runs(path):
    """Every record of a records.jsonl file, as Runs."""
    runs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                if line.strip():
                    runs.append(run_from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SystemExit(f"{path}:{n}: not a bench record ({e!r})")
    return runs


def annotate(bench, config, nproc, cpu_model, hostname, extra, load=None):
    """The record launch/scale.sh appends: the bench JSON plus the run's parameters and machine."""
    rec = dict(bench)
    rec[CONFIG_FILE], rec[CONFIG_NAME] = config, geometry.config_name(config)
    rec[COPIED["nproc"]], rec[COPIED["cpu_model"]], rec[COPIED["hostname"]] = nproc, cpu_model, hostname
    rec[TIMESTAMP] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rec.update(extra)
    # Runs of a bench without the flag are default runs; the reports tell the two paths apart by it.
    gather = COPIED["gather_logits"]
    rec[gather] = bool(rec.get(gather, False))
    cpu = rec.get(COPIED["backend"], "cpu") == "cpu"
    per_node = -(-rec.get(COPIED["tp"], 1) // rec.get(COPIED["hosts"], 1))  # ranks on the busiest node
    rec[OVERSUBSCRIBED] = cpu and per_node * rec.get(COPIED["threads"], 1) > nproc
    if load is not None:
        rec[COPIED["load"]] = load
    return rec


def shared_reasons(run):
    """Why a run's machine was not idle, from its spread and the load recorded around it, and the
    run's note (scale.sh --note) first; empty when nothing says so. Other load only adds time, so
    such runs overstate the draft time."""
    out = [run.note] if run.note else []
    if run.oversubscribed:
        out.append("oversubscribed")
    if run.spread is not None and run.spread > SPREAD_LIMIT:
        out.append(f"p10–p90 spread {run.spread:.0%} of the median")
    return out + timing.load_reasons(run.load)


def scaling_runs(runs):
    """The runs of the scaling sweep: strong and weak runs of the default draft."""
    return [r for r in runs if r.study in ("strong", "weak") and not r.gather_logits]


def group_by(items, keyfn):
    out = {}
    for x in items:
        out.setdefault(keyfn(x), []).append(x)
    return out


def dedupe(runs):
    """One run per (config, backend, context, sessions, threads, tp, full-logits gather or not): of
    repeated runs of one point, the run with the median draft time (a real record)."""
    points = group_by(runs, lambda r: (r.config_name, r.backend, r.context, r.sessions, r.threads, r.tp,
                                       r.gather_logits))
    return [sorted(v, key=lambda r: r.draft_ms)[(len(v) - 1) // 2] for v in points.values()]


def measured_collectives(run):
    """[(op, calls, bytes per call)] per draft as the run counted them; one rank moves nothing."""
    return [(op, calls, nbytes / calls) for op, (calls, nbytes) in run.collectives.items() if calls and run.tp > 1]
