#!/usr/bin/env bash
# Prints the CUDA toolkit that `nvcc` on PATH compiles with. nvcc may be a wrapper script
# outside the toolkit (/usr/local/bin/nvcc), so its own TOP is asked for, not its folder.
set -euo pipefail
top=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
cd "${top:-$(dirname "$(command -v nvcc)")/..}" && pwd -P
