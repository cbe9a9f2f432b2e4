#!/usr/bin/env bash
# Part of scripts/gpu-check.sh: the same bench with each attention kernel.
#
#   scripts/lib/gpu-attention.sh SWITCH BENCH_COMMAND...
#
# SWITCH picks the kernel: a bench option ("--attention": the command gets "--attention simt",
# then "--attention mma"), an environment variable ("TPDRAFT_CUDA_ATTENTION=": run with
# TPDRAFT_CUDA_ATTENTION=simt, then mma), or empty (one run of the kernel there is, labelled
# "current"). The kernels are ATTENTION_KERNELS (default "simt mma": the CUDA backend's f32
# fallback and its tensor-core kernel). Prints the bench's JSON lines, each with
# "attention_kernel" set to its label.
set -euo pipefail
switch=$1
shift
read -r -a kernels <<< "${ATTENTION_KERNELS:-simt mma}"
label() {  # LABEL: the JSON lines on stdin, labelled
  python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        d = json.loads(line)
        d["attention_kernel"] = sys.argv[1]
        print(json.dumps(d))
' "$1"
}
case "$switch" in
  "") "$@" | label current ;;
  --*) for k in "${kernels[@]}"; do "$@" "$switch" "$k" | label "$k"; done ;;
  *=) for k in "${kernels[@]}"; do env "$switch$k" "$@" | label "$k"; done ;;
  *) echo "gpu-attention.sh: SWITCH '$switch' is neither an option (--name) nor a variable (NAME=)" >&2; exit 2 ;;
esac
