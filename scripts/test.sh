#!/usr/bin/env bash
# Every test this machine can run: installs what is missing, builds with warnings as errors,
# then runs CTest (labels: cpu, mpi, gpu, slow; GPU tests skip themselves without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DTPDRAFT_WERROR=ON
cd build
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
