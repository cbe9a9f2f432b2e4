#!/usr/bin/env python3
"""Part of scripts/gpu-check.sh: what the GPU and its driver are, before anything is built.

    gpu-probe.py TOOLKIT_VERSION [MIN_FREE_GIB]

Asks the driver itself (libcuda through ctypes, so nothing needs compiling): the CUDA version
the driver supports, the device count, and device 0's name, multiprocessor count and memory;
then nvidia-smi, where present, for the driver's version, MIG mode and clocks. Prints one
`name: value` line each and exits 0 when a build with the toolkit TOOLKIT_VERSION (e.g. 13.0,
from nvcc) can run here; otherwise exit 3 with the reason on the last line. A build runs when
the driver supports at least the toolkit's major version (CUDA's minor-version compatibility)
and at least 12.5 (the runtime's versioned driver entry points the backend uses), a device is
visible, and device 0 has MIN_FREE_GIB (default 8) free.
"""
import ctypes
import subprocess
import sys

NEEDED = (12, 5)


def version(code):
    return (code // 1000, code % 1000 // 10)


def fail(lines, why):
    lines.append(f"verdict: CANNOT RUN: {why}")
    print("\n".join(lines))
    return 3


def smi(lines):
    fields = "driver_version,mig.mode.current,clocks.sm,clocks.max.sm,clocks.mem,memory.used"
    try:
        p = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        lines.append(f"nvidia-smi: not answering ({e.__class__.__name__})")
        return
    first = p.stdout.strip().splitlines()[:1]
    if p.returncode != 0 or not first:
        lines.append(f"nvidia-smi: failed (exit {p.returncode})")
        return
    values = [v.strip() for v in first[0].split(",")]
    for name, value in zip(("driver", "MIG mode", "SM clock", "SM clock max", "memory clock", "memory used"), values):
        lines.append(f"{name}: {value}")


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    toolkit = tuple(int(x) for x in argv[1].split(".")[:2])
    min_free = float(argv[2]) if len(argv) > 2 else 8.0
    lines = [f"toolkit: CUDA {toolkit[0]}.{toolkit[1]}"]
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return fail(lines, f"no NVIDIA driver library (libcuda.so.1: {e})")
    rc = cu.cuInit(0)
    if rc != 0:
        return fail(lines, f"cuInit failed with CUDA driver error {rc} (a driver without a usable device?)")
    code = ctypes.c_int(0)
    cu.cuDriverGetVersion(ctypes.byref(code))
    drv = version(code.value)
    lines.append(f"driver supports: CUDA {drv[0]}.{drv[1]}")
    count = ctypes.c_int(0)
    cu.cuDeviceGetCount(ctypes.byref(count))
    lines.append(f"devices: {count.value}")
    smi(lines)
    if drv < NEEDED:
        return fail(lines, f"the driver supports CUDA {drv[0]}.{drv[1]}; the backend needs {NEEDED[0]}.{NEEDED[1]} "
                           "or later")
    if drv[0] < toolkit[0]:
        return fail(lines, f"the driver supports CUDA {drv[0]}.{drv[1]}, older than the toolkit's {toolkit[0]}.x: "
                           f"a build with it would not start (use a CUDA {drv[0]}.x toolkit or a newer driver)")
    if count.value < 1:
        return fail(lines, "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    dev = ctypes.c_int(0)
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    name = ctypes.create_string_buffer(256)
    cu.cuDeviceGetName(name, 256, dev)
    sms = ctypes.c_int(0)
    cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    lines.append(f"device 0: {name.value.decode(errors='replace')}, {sms.value} SMs")
    ctx = ctypes.c_void_p()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    if cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0:
        cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        cu.cuDevicePrimaryCtxRelease_v2(dev)
    gib = 1 << 30
    lines.append(f"memory: {free.value / gib:.1f} GiB free of {total.value / gib:.1f} GiB")
    if free.value < min_free * gib:
        return fail(lines, f"device 0 has {free.value / gib:.1f} GiB free; the check needs {min_free:g} GiB")
    lines.append("verdict: ok")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
