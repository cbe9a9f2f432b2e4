#!/usr/bin/env bash
# Part of scripts/gpu-check.sh: where a draft's GPU time goes, kernel by kernel.
#
#   scripts/lib/gpu-kernels.sh LOGS SHORT LONG BENCH_COMMAND...
#
# Runs BENCH_COMMAND (a `tpdraft bench ... --json` without --repeat) twice, with --repeat SHORT
# and --repeat LONG, each under nsys (profile --cuda-graph-trace=node, then its kernel summary)
# where nsys is on PATH, else with a CUPTI kernel trace (scripts/lib/kernel-trace.cpp, built
# here) loaded by the driver. Everything but the timed drafts is the same in both runs, so
# kernel-table.py turns the difference into time per draft: LOGS/kernels.csv, and the five most
# expensive kernels and one line per class in LOGS/kernels.top (printed too).
set -euo pipefail
logs=$1 short=$2 long=$3
shift 3

if command -v nsys >/dev/null 2>&1; then
  source="nsys $(nsys --version 2>/dev/null | head -1)"
  for run in short long; do
    nsys profile --cuda-graph-trace=node --force-overwrite=true -o "$logs/kern-$run" "$@" --repeat "${!run}" \
      >"$logs/kern-$run.json"
    # The kernel summary's report is cuda_gpu_kern_sum in recent nsys, gpukernsum before.
    nsys stats --report cuda_gpu_kern_sum --format csv --force-export=true --output "$logs/kern-$run" \
      "$logs/kern-$run.nsys-rep" >&2 ||
      nsys stats --report gpukernsum --format csv --force-export=true --output "$logs/kern-$run" \
        "$logs/kern-$run.nsys-rep" >&2
    reports=("$logs/kern-${run}"_*.csv)
    mv "${reports[0]}" "$logs/kern-$run.csv"
    rm -f "$logs/kern-$run.nsys-rep" "$logs/kern-$run.sqlite"  # large; the CSV holds what is used
  done
else
  source="CUPTI kernel trace"
  # CUPTI in the toolkit nvcc uses: include/ in recent toolkits, extras/CUPTI/ in older ones.
  cuda=$("$(dirname "${BASH_SOURCE[0]}")/cuda-root.sh")
  cupti=
  for dir in "$cuda" "$cuda/extras/CUPTI"; do
    if [ -f "$dir/include/cupti.h" ]; then cupti=$dir; break; fi
  done
  if [ -z "$cupti" ]; then
    echo "gpu-kernels: no cupti.h in the CUDA toolkit at $cuda (include/ or extras/CUPTI/include/)" >&2
    exit 1
  fi
  lib=$logs/libkernel-trace.so
  "${CXX:-c++}" -std=c++17 -O2 -shared -fPIC -I"$cuda/include" -I"$cupti/include" \
    scripts/lib/kernel-trace.cpp -L"$cuda/lib64" -L"$cupti/lib64" -lcupti \
    -Wl,-rpath,"$cuda/lib64:$cupti/lib64" -o "$lib"
  for run in short long; do
    CUDA_INJECTION64_PATH=$lib TPDRAFT_KERNEL_TRACE=$logs/kern-$run.csv "$@" --repeat "${!run}" >"$logs/kern-$run.json"
  done
  rm -f "$lib"
fi
echo "($source; the difference of $((long - short)) timed drafts)" >"$logs/kernels.top"
python3 scripts/lib/kernel-table.py "$logs/kern-short.csv" "$logs/kern-long.csv" $((long - short)) \
  "$logs/kern-long.json" "$logs/kernels.csv" >>"$logs/kernels.top"
cat "$logs/kernels.top"
