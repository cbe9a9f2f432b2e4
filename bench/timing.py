"""The Python benchmarks' timing harness (the twin of src/core/timing.h): warm-up runs then timed
ones, a timed figure as its median and spread in one JSON shape (NAME_median, NAME_min, NAME_max,
NAME_p10, NAME_p90, NAME_runs), and the machine's load around a measurement (other processes'
and stolen CPU time from /proc/stat, the load average), so that every report says when the
machine was not idle: other work only adds time."""

import os
import resource
import statistics
import time

# When other work makes a machine not idle: other processes kept more than this many cores busy
# on average, or the hypervisor stole more than this share of the CPU time.
OTHER_CORES_LIMIT = 0.25
STEAL_LIMIT = 0.02
# The shortest window the load is judged over (/proc/stat counts in ticks of 10 ms per core):
# with_load waits out the rest after a shorter run (while it waits, what runs is other work).
MIN_WINDOW_S = 0.2


def time_runs(fn, warmup, repeat):
    """Seconds of each of `repeat` runs of fn(i) after `warmup` untimed ones (i counts them all)."""
    out = []
    for i in range(warmup + repeat):
        t0 = time.perf_counter()
        fn(i)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def decode_steps(handle, steps, warmup=0, seed=0, context=64, new_rows=2, n=1, make=lambda a: a, **step_args):
    """Yields the wall seconds of each of `steps` steps of a tpdraft.Drafter or Client (after `warmup`
    untimed ones) that each carry n sessions' entries, made as a decoding loop makes them: roll
    back what was rejected (keep the prompt of `context` rows), settle `new_rows` rows, draft. The
    rows are seeded f32 numpy arrays, or what make() turns them into."""
    import numpy as np  # here: the scaling scripts import this module without numpy
    rng = np.random.default_rng(seed)  # the prompt's rows, then the rows each step settles
    prefix, rows = (make(rng.standard_normal((k, handle.caps.taps_width), dtype=np.float32))
                    for k in (context, new_rows))
    sessions = [handle.open_session() for _ in range(n)]
    handle.step([{"session": s, "taps": prefix, "anchor": 1} for s in sessions])
    for i in range(warmup + steps):
        entries = [{"session": s, "keep": context, "taps": rows, "anchor": 2 + (i + j) % 7}
                   for j, s in enumerate(sessions)]
        t0 = time.perf_counter()
        handle.step(entries, **step_args)
        if i >= warmup:
            yield time.perf_counter() - t0
    for s in sessions:
        handle.close_session(s)


def step_times(handle, steps, **kw):
    """(wall seconds, settle + draft seconds the library or the server measured) of each timed step
    of decode_steps(handle, steps, **kw)."""
    return [(wall, handle.last_times["settle"] + handle.last_times["draft"])
            for wall in decode_steps(handle, steps, **kw)]


def quantile(values, q):
    """The value at rank round(q * (n - 1)) of the sorted values."""
    v = sorted(values)
    return v[int(q * (len(v) - 1) + 0.5)]


def figure(name, seconds, scale):
    """A timed figure from its samples in seconds, shown in units of 1/scale (1e3: ms, 1e6: us)."""
    return {f"{name}_median": statistics.median(seconds) * scale, f"{name}_min": min(seconds) * scale,
            f"{name}_max": max(seconds) * scale, f"{name}_p10": quantile(seconds, 0.1) * scale,
            f"{name}_p90": quantile(seconds, 0.9) * scale, f"{name}_runs": len(seconds)}


def parse_stat_line(line):
    """(busy, steal, total) clock ticks from /proc/stat's aggregate `cpu` line: busy counts user,
    nice, system, irq and softirq (guest time is inside user); total adds idle, iowait and steal."""
    v = [int(x) for x in line.split()[1:]]
    v += [0] * (8 - len(v))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def snapshot():
    """The machine's CPU counters and load average now."""
    with open("/proc/stat") as f:
        busy, steal, total = parse_stat_line(f.readline())
    with open("/proc/loadavg") as f:
        loadavg = [float(x) for x in f.read().split()[:3]]
    return {"t": time.monotonic(), "busy": busy, "steal": steal, "total": total, "loadavg": loadavg}


def load_between(before, after, run_cpu_s, ticks_per_s):
    """What else ran on the machine between two snapshots while the benchmark took run_cpu_s of CPU
    time: the CPU time of other processes (machine busy time minus ours), as average busy cores,
    and the share of the machine's time the hypervisor stole."""
    wall = max(after["t"] - before["t"], 1e-9)
    busy = (after["busy"] - before["busy"]) / ticks_per_s
    total = (after["total"] - before["total"]) / ticks_per_s
    steal = (after["steal"] - before["steal"]) / ticks_per_s
    other = max(0.0, busy - run_cpu_s)
    return {"wall_s": round(wall, 3), "run_cpu_s": round(run_cpu_s, 3), "machine_busy_cpu_s": round(busy, 3),
            "other_cpu_s": round(other, 3), "other_cores": round(other / wall, 3),
            "steal_share": round(steal / total, 4) if total > 0 else 0.0,
            "loadavg_before": before["loadavg"], "loadavg_after": after["loadavg"]}


def _cpu_seconds():
    """CPU seconds of this process and of the children it has waited for."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def with_load(fn):
    """(fn(), the load around it): this process's CPU time and that of the children fn waited for
    are the run's; the rest is other work."""
    before, used0 = snapshot(), _cpu_seconds()
    result = fn()
    time.sleep(max(0.0, MIN_WINDOW_S - (time.monotonic() - before["t"])))
    after, used1 = snapshot(), _cpu_seconds()
    return result, load_between(before, after, used1 - used0, os.sysconf("SC_CLK_TCK"))


def load_reasons(load):
    """Why the machine was not idle around a measurement; empty when it was."""
    out = []
    if (other := (load or {}).get("other_cores") or 0) > OTHER_CORES_LIMIT:
        out.append(f"other processes kept {other:.2f} cores busy")
    if (steal := (load or {}).get("steal_share") or 0) > STEAL_LIMIT:
        out.append(f"{steal:.0%} of the CPU time stolen")
    return out


def describe(load):
    """'idle (...)' or 'NOT idle: ... ', for a report's text."""
    why, avg = load_reasons(load), load["loadavg_after"][0]
    if not why:
        return f"idle (other processes {load['other_cores']:.2f} cores, load average {avg:.2f})"
    return f"NOT idle: {', '.join(why)} (load average {avg:.2f}; other work only adds time)"


def machine_load(load):
    """The load as the benchmarks' JSON carries it (key machine_load)."""
    return dict(load, idle=not load_reasons(load), not_idle_because=load_reasons(load))
