#!/usr/bin/env python3
"""What `tpdraft serve` adds to a step, and what batching many clients buys. For each geometry
and transport (ipc:// + the shared-memory ring, tcp:// with taps inline): a server at tp 1 with
one CPU thread, then 1 client and 8 concurrent clients (threads, one session each) making steps
as a decoding loop does (roll back to the prompt, settle 2 new rows, draft). Reports, per step,
the round trip beyond the draft (the client's wall time minus the server's settle + draft), the
same figure for tpdraft.Drafter in process, their difference (what serving adds), sequences
drafted per second with 8 clients against 1, and the most batching could give: in process, 8
sessions in each step against 1 (the same forward a server batches), all in one run (medians),
and whether the machine was idle meanwhile (bench/timing.py).
Usage:
serve_overhead.py [--config configs/X.json]... [--steps N] (the module from build/python, the
checkpoint made by build/tpdraft init in a temp dir)."""

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "build", "python"))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
import timing  # noqa: E402
import tpdraft  # noqa: E402
from served import Server, checkpoint  # noqa: E402

TPDRAFT = os.path.join(REPO, "build", "tpdraft")
CONTEXT, NEW_ROWS = 64, 2


def batched_rate(handle, steps, n, seed):
    """Sequences per second of `steps` steps that each carry n sessions' entries (in process)."""
    return n / statistics.median(timing.decode_steps(handle, steps, seed=seed, context=CONTEXT, new_rows=NEW_ROWS,
                                                     n=n))


def run_clients(address, n, steps):
    """n clients at once; returns (per-step samples, sequences drafted per second, whether the
    ring was used, entries per forward)."""
    clients = [tpdraft.Client(address, timeout=600) for _ in range(n)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        per = list(pool.map(lambda i: timing.step_times(clients[i], steps, seed=i, context=CONTEXT,
                                                        new_rows=NEW_ROWS), range(n)))
    elapsed = time.perf_counter() - start
    stats = clients[0].stats()
    shm = clients[0].shared_memory
    for c in clients:
        c.close()
    samples = [x for p in per for x in p]
    return samples, n * steps / elapsed, shm, stats["entries"], stats["forwards"]


def beyond(samples):
    return statistics.median(w - d for w, d in samples) * 1e6


def measure(config, steps):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ck = tmp + "/ck"
        checkpoint(TPDRAFT, os.path.join(REPO, config), ck)
        with tpdraft.Drafter(ck + "/drafter", ck + "/target", backend="cpu", threads=1, max_sessions=8,
                             max_context=CONTEXT + 64) as d:
            local = timing.step_times(d, steps, seed=0, context=CONTEXT, new_rows=NEW_ROWS)
            few = max(3, steps // 4)
            ceiling = batched_rate(d, few, 8, 1) / batched_rate(d, few, 1, 1)
        in_process = beyond(local)
        draft_ms = statistics.median(d for _, d in local) * 1e3
        for name, listen in (("ipc+shm", f"ipc://{tmp}/s.sock"), ("tcp", "tcp://127.0.0.1:*")):
            server = Server(TPDRAFT, ck, listen, os.path.join(tmp, "server"),
                            ["--max-sessions", "8", "--max-open-sessions", "16", "--max-context", str(CONTEXT + 64)])
            try:
                one, one_rate, shm, entries, forwards = run_clients(server.address, 1, steps)
                eight, eight_rate, _, entries8, forwards8 = run_clients(server.address, 8, max(3, steps // 4))
                batch = (entries8 - entries) / max(1, forwards8 - forwards)
            finally:
                server.stop()
            assert shm == (name == "ipc+shm")
            rows.append({"config": os.path.basename(config), "transport": name, "draft_ms": draft_ms,
                         "in_process_us": in_process, "one_us": beyond(one), "added_us": beyond(one) - in_process,
                         "eight_us": beyond(eight), "one_rate": one_rate, "eight_rate": eight_rate,
                         "batch": batch, "ceiling": ceiling})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append")
    ap.add_argument("--steps", type=int, default=2000, help="steps of the 1-client run (tiny geometry; the bench "
                    "geometry takes a hundredth, at least 8)")
    a = ap.parse_args()
    configs = a.config or ["configs/tiny-dflash2.json", "configs/bench-dflash2-2048.json"]
    steps = {c: a.steps if "bench" not in c else max(8, a.steps // 100) for c in configs}
    rows, load = timing.with_load(lambda: [r for c in configs for r in measure(c, steps[c])])
    print(f"{'geometry':24} {'transport':9} {'draft ms':>9} {'in-process us':>14} {'served us':>10} "
          f"{'added us':>9} {'8 clients us':>13} {'seq/s 1':>8} {'seq/s 8':>8} {'8 vs 1':>7} {'batch':>6} "
          f"{'in-process 8 vs 1':>18}")
    for r in rows:
        print(f"{r['config']:24} {r['transport']:9} {r['draft_ms']:9.2f} {r['in_process_us']:14.1f} "
              f"{r['one_us']:10.1f} {r['added_us']:9.1f} {r['eight_us']:13.1f} {r['one_rate']:8.1f} "
              f"{r['eight_rate']:8.1f} {r['eight_rate'] / r['one_rate']:6.2f}x {r['batch']:6.1f} "
              f"{r['ceiling']:17.2f}x")
    print("machine:", timing.describe(load))


if __name__ == "__main__":
    main()
