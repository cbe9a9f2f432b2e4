"""What every training stage shares: errors that name the file and field, the work folder, a
progress bar, resumable checkpoints that carry the CPU time spent so far, the loss curve as a PNG,
and a safetensors writer (bf16 / f32 / int) for the Hugging Face layouts the stages export."""

import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PAIR = os.path.join(REPO, "pair")                  # the shipped, trained files
WORK = os.path.join(REPO, "build", "train")        # what the stages make on the way (not committed)


class TrainError(Exception):
    """A bad input or state: the message names the file and the field at fault."""


def fail(message):
    raise TrainError(message)


def main_guard(name, run):
    """Runs run() and turns a TrainError into one line on stderr and exit status 2 (the CLI's
    usage / input convention); Ctrl-C leaves with 130 after the last checkpoint."""
    try:
        sys.exit(run())
    except TrainError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted; run the same command again to resume", file=sys.stderr)
        sys.exit(130)


def set_threads(n):
    """Fixes the BLAS / OpenMP thread count before torch is imported (OpenBLAS sizes its pool
    when it loads) and returns torch with the same count."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    torch.set_num_threads(n)
    return torch


def read_json(path, what):
    if not os.path.isfile(path):
        fail(f"{path}: {what} not found")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        fail(f"{path}: not valid JSON ({e})")


def write_json(path, value):
    """Writes value as JSON through a temporary file, so a reader never sees half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def field(obj, key, kind, where):
    """obj[key] checked to be of `kind`, or an error naming the file and the field."""
    if key not in obj:
        fail(f"{where}: missing field '{key}'")
    value = obj[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        fail(f"{where}: field '{key}' is {value!r}, expected {kind.__name__}")
    return value


class Progress:
    """One status line on stderr, redrawn at most 4 times a second: step / total, the figures
    given, elapsed wall time, CPU minutes and the time left at the current rate."""

    def __init__(self, label, total, start=0):
        self.label, self.total, self.start = label, total, start
        self.t0, self.last = time.monotonic(), 0.0
        self.tty = sys.stderr.isatty()

    def update(self, step, cpu_seconds, **figures):
        now = time.monotonic()
        final = step >= self.total
        if not final and now - self.last < (0.25 if self.tty else 30.0):
            return
        self.last = now
        done = max(step - self.start, 1)
        left = (now - self.t0) / done * (self.total - step)
        width = 24
        fill = int(width * step / max(self.total, 1))
        bar = "#" * fill + "-" * (width - fill)
        text = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
        line = (f"{self.label} [{bar}] {step}/{self.total} {text} | cpu {cpu_seconds / 60:.1f} min, "
                f"left {left / 60:.1f} min")
        print(("\r" + line + "\033[K") if self.tty else line, end="\n" if final or not self.tty else "",
              file=sys.stderr, flush=True)


class CpuClock:
    """The process's CPU time (every thread, user + system) added to what earlier runs of the
    same training spent, so a resumed run reports the whole training's cost."""

    def __init__(self, spent=0.0):
        self.spent, self.base = spent, time.process_time()

    def total(self):
        return self.spent + time.process_time() - self.base


def save_state(path, torch, state):
    """A training checkpoint, written whole or not at all."""
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def plot_losses(path, title, series):
    """series: {name: [(step, value), ...]} drawn on one log-scale axis into a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for name, points in series.items():
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=name, marker="o" if len(points) < 30 else None, markersize=3)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path + ".tmp.png")
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def cosine_lr(step, total, peak, warmup, floor=0.1):
    """Linear warm-up to `peak`, then a cosine down to floor * peak at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


_ST_TYPES = {"bf16": ("BF16", 2), "f32": ("F32", 4), "i64": ("I64", 8)}


def tensor_bytes(torch, t, kind):
    """The little-endian bytes of tensor t stored as `kind` (bf16 rounds to nearest even)."""
    t = t.detach().contiguous()
    if kind == "bf16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    if kind == "f32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    return t.to(torch.int64).numpy().astype("<i8").tobytes()


def write_safetensors(path, torch, tensors, metadata=None):
    """tensors: {name: (tensor, kind)} with kind bf16 / f32 / i64, written in name order."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t, kind = tensors[name]
        blob = tensor_bytes(torch, t, kind)
        dtype, width = _ST_TYPES[kind]
        assert len(blob) == t.numel() * width
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def read_safetensors(path, torch):
    """{name: f32 tensor} of a safetensors file with BF16 / F16 / F32 / I64 tensors."""
    if not os.path.isfile(path):
        fail(f"{path}: not found")
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail(f"{path}: too short for a safetensors header")
    n = int.from_bytes(raw[:8], "little")
    if n <= 0 or 8 + n > len(raw):
        fail(f"{path}: header length {n} does not fit the file of {len(raw)} bytes")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    kinds = {"BF16": np.int16, "F16": np.float16, "F32": np.float32, "I64": np.int64}
    for name, info in header.items():
        if info["dtype"] not in kinds:
            fail(f"{path}: tensor '{name}' has dtype {info['dtype']}, expected BF16, F16, F32 or I64")
        begin, end = info["data_offsets"]
        a = np.frombuffer(raw, dtype=kinds[info["dtype"]], count=(end - begin) // np.dtype(kinds[info["dtype"]]).itemsize,
                          offset=8 + n + begin).reshape(info["shape"])
        t = torch.from_numpy(a.copy())
        out[name] = t.view(torch.bfloat16).float() if info["dtype"] == "BF16" else (
            t if info["dtype"] == "I64" else t.float())
    return out
