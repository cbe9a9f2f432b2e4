#!/usr/bin/env bash
# On a machine with a GPU: builds tpdraft with the CUDA backend, runs the GPU tests, times drafts
# of the Qwen3-8B geometry (graph replay and op by op) and the same draft in PyTorch bf16 eager,
# and prints a short table last. Fetches nothing; stays within ~8 minutes (see --help).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/gpu-check.sh

On a machine with a GPU: builds tpdraft with the CUDA backend, runs the GPU tests (ctest -L gpu),
times drafts of the Qwen3-8B geometry (bf16, one session, 4096 context rows) with the forward
replayed from a CUDA graph and issued op by op, times the same draft in PyTorch bf16 eager on the
same GPU and checkpoint, and prints a short table last. Fetches nothing from the network: when a
build dependency is missing it names it and stops (scripts/gpu-deps.sh, run on a Debian machine,
gathers them into .gpu-deps/). Builds without MPI when mpicxx is absent. Stays within ~8 minutes:
each step has its own time limit, and an interrupt stops the running step, build included.

Environment:
  BUILD=dir      build directory (default build-gpu)
  CUDA_ARCH=NN   CUDA architecture (default 90, the H100/H200 one)
  CTX=N          context rows of the timed drafts (default 4096)
  CKPT_DIR=dir   where the random checkpoint is written and reused (default $BUILD/gpu-check-ckpt)
  OUT=dir        logs go to $OUT/gpu-check (default $BUILD/gpu-check)
  PYTHON=path    the Python with torch (default python3)
  CXX=compiler   host C++ compiler (default c++)
USAGE
}
case "${1:-}" in
  "") ;;
  -h|--help) usage; exit 0 ;;
  *) echo "gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
. scripts/lib/steps.bash

BUILD=${BUILD:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
LOGS=${OUT:-$BUILD}/gpu-check
mkdir -p "$LOGS"
jobs=$(nproc 2>/dev/null || echo 4)
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }
say() { echo "gpu-check [$(elapsed)s]: $*" >&2; }

build_status="not run" test_status="not run" bench_status="not run" torch_status="not run"
gpu_name="?"

# ---- what the machine has --------------------------------------------------------------------
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc >/dev/null 2>&1 || { say "no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin"; exit 2; }
command -v cmake >/dev/null 2>&1 || { say "no cmake"; exit 2; }
CXX_BIN=${CXX:-c++}
command -v "$CXX_BIN" >/dev/null 2>&1 || { say "no C++ compiler ($CXX_BIN)"; exit 2; }
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1) \
    || gpu_name="? (nvidia-smi failed)"
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
if step --timeout 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTPDRAFT_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" "${mpi_flag[@]}" "${prefix_flag[@]}" >"$LOGS/configure.log" 2>&1 &&
   say "building (log: $LOGS/build.log)" &&
   step --timeout 300 cmake --build "$BUILD" -j "$jobs" --target tpdraft_cli test_cuda_ops test_cuda_drafter test_lazy_libs \
     >"$LOGS/build.log" 2>&1; then
  build_status="ok ($(($(elapsed) - t0)) s)"
else
  build_status="FAILED (see $LOGS/configure.log, build.log)"
  tail -30 "$LOGS/build.log" "$LOGS/configure.log" 2>/dev/null >&2 || true
fi
grep -q "NCCL communicator: ON" "$LOGS/configure.log" 2>/dev/null && nccl="yes" || nccl="no"

# ---- GPU tests ---------------------------------------------------------------------------------
if [[ $build_status == ok* ]]; then
  say "running ctest -L gpu"
  if step --timeout 200 ctest --test-dir "$BUILD" -L gpu -V --timeout 180 >"$LOGS/ctest.log" 2>&1; then
    test_status="passed"
  else
    test_status="FAILED"
    tail -60 "$LOGS/ctest.log" >&2
  fi
  # A test that skipped itself (no device seen, too few GPUs) does not fail ctest; say how many did.
  skipped=$(grep -c "\[  SKIPPED \] .*(" "$LOGS/ctest.log" 2>/dev/null || true)
  [ "${skipped:-0}" -gt 0 ] && test_status="$test_status, $skipped test(s) skipped (see ctest.log)"
fi

# ---- benchmarks ---------------------------------------------------------------------------------
# One random bf16 checkpoint on disk serves every run: tpdraft with graphs on and off, and torch.
CONFIG=configs/qwen3-8b-dflash-b16.json
CTX=${CTX:-4096}
CKPT=${CKPT_DIR:-$BUILD/gpu-check-ckpt}
if [[ $build_status == ok* ]]; then
  if [ ! -f "$CKPT/drafter/config.json" ]; then
    say "writing a random bf16 checkpoint of $CONFIG to $CKPT"
    rm -rf "$CKPT"
    step --timeout 240 "$BUILD/tpdraft" init --config "$CONFIG" --out "$CKPT" --seed 1 --dtype bf16 \
      >"$LOGS/init.log" 2>&1 || { bench_status="FAILED (tpdraft init, see $LOGS/init.log)"; tail -5 "$LOGS/init.log" >&2; }
  fi
fi
for mode in on off; do
  [[ $build_status == ok* && $bench_status != FAILED* ]] || break
  say "timing drafts: bench --backend cuda --graphs $mode --ctx $CTX"
  if step --timeout 150 "$BUILD/tpdraft" bench --backend cuda --graphs "$mode" --drafter "$CKPT/drafter" \
       --target "$CKPT/target" --ctx "$CTX" --repeat 30 --warmup 3 --json >"$LOGS/bench-$mode.json" \
       2>"$LOGS/bench-$mode.log"; then
    bench_status="ok"
  else
    bench_status="FAILED (see $LOGS/bench-$mode.log)"
    tail -20 "$LOGS/bench-$mode.log" >&2
  fi
done
PY=${PYTHON:-python3}
if [ "$bench_status" = ok ]; then
  if "$PY" -c "import torch, numpy, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    say "timing the same draft in PyTorch bf16 eager on the GPU"
    if step --timeout 240 "$PY" bench/torch_draft.py --drafter "$CKPT/drafter" --target "$CKPT/target" --ctx "$CTX" \
         --anchor 17 --device cuda --dtype bf16 --repeat 30 --warmup 3 --threads "$jobs" --json \
         >"$LOGS/torch.json" 2>"$LOGS/torch.log"; then
      torch_status="ok"
    else
      torch_status="FAILED (see $LOGS/torch.log)"
      tail -10 "$LOGS/torch.log" >&2
    fi
  else
    torch_status="skipped: $PY has no torch with CUDA"
  fi
fi

# ---- the table ---------------------------------------------------------------------------------
echo
echo "== tpdraft gpu-check ($(elapsed) s) =="
printf '%-22s %s\n' "GPU" "$gpu_name" "build" "$build_status" "NCCL" "$nccl" "ctest -L gpu" "$test_status" \
  "bench" "$bench_status" "torch bf16 eager" "$torch_status"
if [ "$bench_status" = ok ] && command -v python3 >/dev/null 2>&1; then
  python3 - "$LOGS" <<'EOF' || { say "the table above is incomplete (see the error)"; exit 1; }
import json, os, sys
logs = sys.argv[1]
def last_json(name):
    path = os.path.join(logs, name)
    if not os.path.exists(path):
        return None
    lines = [l for l in open(path).read().splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None
on, off, torch = last_json("bench-on.json"), last_json("bench-off.json"), last_json("torch.json")
floor_ms = on["draft_gbytes"] / on["machine_read_gbps"] * 1e3
rows = [
    ("draft, graph replay", f'{on["draft_ms"]:.3f} ms (p10..p90 {on["draft_ms_p10"]:.3f}..{on["draft_ms_p90"]:.3f}; '
                            f'{on["replayed_drafts"]} of 30 replayed)'),
    ("draft, op by op", f'{off["draft_ms"]:.3f} ms (p10..p90 {off["draft_ms_p10"]:.3f}..{off["draft_ms_p90"]:.3f})'),
    ("phases (graph)", f'layers {on["layers_ms"]:.3f} ms, head {on["head_ms"]:.3f} ms, selection {on["select_ms"]:.3f} ms'),
    ("memory floor", f'{floor_ms:.3f} ms ({on["draft_gbytes"]:.3f} GB at the measured {on["machine_read_gbps"]:.0f} GB/s copy)'),
    ("draft / floor", f'{on["draft_ms"] / floor_ms:.2f}x (target <= 1.3x)'),
    ("achieved", f'{on["achieved_gbps"]:.0f} GB/s = {100 * on["achieved_gbps"] / on["machine_read_gbps"]:.0f}% of copy '
                 f'bandwidth; {on["achieved_gflops"]:.0f} GFLOP/s'),
]
if torch:
    rows.append(("torch bf16 eager", f'{torch["draft_ms_median"]:.3f} ms (min {torch["draft_ms_min"]:.3f}, torch {torch["torch"]})'))
    rows.append(("torch / tpdraft", f'{torch["draft_ms_median"] / on["draft_ms"]:.2f}x (target >= 1.5x)'))
settle = f'{on["settle_rows_per_s"]:.0f} rows/s, {on["settle_gflops"]:.0f} GFLOP/s'
if "settle_fraction_of_cublas" in on:
    settle += (f' = {100 * on["settle_fraction_of_cublas"]:.0f}% of cuBLAS bf16 {on["cublas_gemm_gflops_peak"]:.0f} '
               f'GFLOP/s ({on["cublas_gemm_gflops_settle_shape"]:.0f} at the fc shape)')
rows.append(("settle (256-row chunks)", settle))
rows.append(("tokens", " ".join(str(t) for t in on["tokens"])))
for k, v in rows:
    print(f"{k:<24} {v}")
if on["tokens"] != off["tokens"]:
    print("graph replay and op-by-op drafts gave different tokens")
    sys.exit(1)
EOF
elif [ "$bench_status" = ok ]; then
  tail -1 "$LOGS/bench-on.json"
fi
[[ $build_status == ok* && $test_status == passed* && $bench_status == ok ]]
