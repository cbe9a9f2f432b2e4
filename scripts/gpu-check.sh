#!/usr/bin/env bash
# On a machine with a GPU: build tpdraft with the CUDA backend, run the GPU tests (ctest -L gpu),
# time a draft of the Qwen3-8B geometry on the GPU, and print a short table last. Fetches
# nothing from the network: when a build dependency is missing it names it and stops. Builds
# without MPI when mpicxx is absent. Stays within ~8 minutes (each step has its own timeout).
# Usage: scripts/gpu-check.sh            (BUILD=dir to choose the build directory, default build-gpu;
#                                          CUDA_ARCH=90 by default, the H100/H200 architecture)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

BUILD=${BUILD:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
LOGS=${OUT:-$BUILD}/gpu-check
mkdir -p "$LOGS"
jobs=$(nproc 2>/dev/null || echo 4)
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }
say() { echo "gpu-check [$(elapsed)s]: $*" >&2; }

build_status="not run" test_status="not run" bench_status="not run"
gpu_name="?"

# ---- what the machine has --------------------------------------------------------------------
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc >/dev/null 2>&1 || { say "no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin"; exit 2; }
command -v cmake >/dev/null 2>&1 || { say "no cmake"; exit 2; }
CXX_BIN=${CXX:-c++}
command -v "$CXX_BIN" >/dev/null 2>&1 || { say "no C++ compiler ($CXX_BIN)"; exit 2; }
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
fi
say "GPU: ${gpu_name}; nvcc: $(nvcc --version | tail -1)"

# Build dependencies carried as .deb files (scripts/gpu-deps.sh) are unpacked into a private
# prefix and used from there: CMake finds their package configs, the compiler their headers.
prefix_flag=()
if compgen -G ".gpu-deps/*.deb" >/dev/null; then
  deps_root=$(pwd)/.gpu-deps/root
  mkdir -p "$deps_root"
  for deb in .gpu-deps/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$deb" "$deps_root"
    else  # a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d) && (cd "$tmp" && ar x "$OLDPWD/$deb" && tar -xf data.tar.* -C "$deps_root") && rm -rf "$tmp"
    fi
  done
  export CPATH="$deps_root/usr/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$deps_root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$deps_root/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  prefix_flag=(-DCMAKE_PREFIX_PATH="$deps_root/usr")
  say "using the build dependencies unpacked from .gpu-deps/ into $deps_root"
fi

# Headers of the libraries tpdraft builds against (Debian package names in brackets).
missing=()
check_header() {  # header package
  echo "#include <$1>" | "$CXX_BIN" -std=c++17 -E -x c++ - >/dev/null 2>&1 || missing+=("$1 [$2]")
}
check_header fmt/format.h libfmt-dev
check_header spdlog/spdlog.h libspdlog-dev
check_header nlohmann/json.hpp nlohmann-json3-dev
check_header CLI/CLI.hpp libcli11-dev
check_header gtest/gtest.h libgtest-dev
if ((${#missing[@]})); then
  say "cannot build here, missing: ${missing[*]}"
  say "install those packages, or run scripts/gpu-deps.sh on a Debian machine and bring .gpu-deps/ along"
  exit 3
fi
mpi_flag=()
if ! command -v mpicxx >/dev/null 2>&1; then
  mpi_flag=(-DTPDRAFT_MPI=OFF)
  say "no mpicxx: building without the MPI communicator (mpi tests and NCCL-over-MPI launch skipped)"
fi

# ---- build -----------------------------------------------------------------------------------
say "configuring $BUILD (CUDA architectures $CUDA_ARCH)"
t0=$(elapsed)
if timeout 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTPDRAFT_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" "${mpi_flag[@]}" "${prefix_flag[@]}" >"$LOGS/configure.log" 2>&1 &&
   timeout 300 cmake --build "$BUILD" -j "$jobs" --target tpdraft_cli test_cuda_ops test_cuda_drafter \
     >"$LOGS/build.log" 2>&1; then
  build_status="ok ($(($(elapsed) - t0)) s)"
else
  build_status="FAILED (see $LOGS/configure.log, build.log)"
  tail -30 "$LOGS/build.log" "$LOGS/configure.log" 2>/dev/null >&2
fi
grep -q "NCCL communicator: ON" "$LOGS/configure.log" 2>/dev/null && nccl="yes" || nccl="no"

# ---- GPU tests ---------------------------------------------------------------------------------
if [[ $build_status == ok* ]]; then
  say "running ctest -L gpu"
  if timeout 200 ctest --test-dir "$BUILD" -L gpu -V --timeout 180 >"$LOGS/ctest.log" 2>&1; then
    test_status="passed"
  else
    test_status="FAILED"
    tail -60 "$LOGS/ctest.log" >&2
  fi
  # A test that skipped itself (no device seen, too few GPUs) passes; say how many did.
  skipped=$(grep -c "\[  SKIPPED \] .*(" "$LOGS/ctest.log" 2>/dev/null || true)
  [ "${skipped:-0}" -gt 0 ] && test_status="$test_status, $skipped test(s) skipped (see ctest.log)"
fi

# ---- benchmark ---------------------------------------------------------------------------------
bench_json="$LOGS/bench.json"
if [[ $build_status == ok* ]]; then
  say "timing drafts: bench --backend cuda --config configs/qwen3-8b-dflash-b16.json --ctx 4096"
  if timeout 150 "$BUILD/tpdraft" bench --backend cuda --config configs/qwen3-8b-dflash-b16.json --ctx 4096 \
       --repeat 20 --warmup 3 --json >"$bench_json" 2>"$LOGS/bench.log"; then
    bench_status="ok"
  else
    bench_status="FAILED (see $LOGS/bench.log)"
    tail -20 "$LOGS/bench.log" >&2
  fi
fi

# ---- the table ---------------------------------------------------------------------------------
echo
echo "== tpdraft gpu-check ($(elapsed) s) =="
printf '%-22s %s\n' "GPU" "$gpu_name" "build" "$build_status" "NCCL" "$nccl" "ctest -L gpu" "$test_status" \
  "bench" "$bench_status"
if [ "$bench_status" = ok ] && command -v python3 >/dev/null 2>&1; then
  python3 - "$bench_json" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
floor_ms = j["draft_gbytes"] / j["machine_read_gbps"] * 1e3
rows = [
    ("draft median", f'{j["draft_ms"]:.3f} ms (p10..p90 {j["draft_ms_p10"]:.3f}..{j["draft_ms_p90"]:.3f})'),
    ("phases", f'layers {j["layers_ms"]:.3f} ms, head {j["head_ms"]:.3f} ms, selection {j["select_ms"]:.3f} ms'),
    ("memory floor", f'{floor_ms:.3f} ms ({j["draft_gbytes"]:.3f} GB at the measured {j["machine_read_gbps"]:.0f} GB/s copy)'),
    ("achieved", f'{j["achieved_gbps"]:.0f} GB/s = {100 * j["achieved_gbps"] / j["machine_read_gbps"]:.0f}% of copy bandwidth; '
                 f'{j["achieved_gflops"]:.0f} GFLOP/s'),
    ("GEMM ceiling", f'{j["machine_gemm_gflops"]:.0f} GFLOP/s (our matmul)'),
    ("settle", f'{j["settle_rows_per_s"]:.0f} rows/s'),
    ("tokens", " ".join(str(t) for t in j["tokens"])),
]
for k, v in rows:
    print(f"{k:<22} {v}")
EOF
elif [ "$bench_status" = ok ]; then
  tail -1 "$bench_json"
fi
[[ $build_status == ok* && $test_status == passed* && $bench_status == ok ]]
