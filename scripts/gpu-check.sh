#!/usr/bin/env bash
# On a machine with a GPU: builds tpdraft with the CUDA backend, runs the GPU tests, times drafts
# of the Qwen3-8B geometry (graph replay and op by op) and the same draft in PyTorch bf16 eager.
# One call, one global deadline, a summary table always printed and written; everything else in
# one tarball, so that a run returns at most a handful of files (see --help).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/gpu-check.sh

On a machine with a GPU, from the working tree alone: builds tpdraft with the CUDA backend,
runs the GPU tests (ctest -L gpu: CUDA ops against the CPU, int8 / int4 matmuls, whole drafts,
graph replays, two and four in-process ranks sharing the one GPU through the thread
communicator, NCCL at one rank inside a captured forward), times drafts of the Qwen3-8B geometry
(bf16, one session, 4096 context rows) replayed from a CUDA graph and issued op by op, the same
draft in PyTorch bf16 eager, and the graph draft with int8 and int4 layer weights (--quant q8,
q4) and with the head int8 too (q4+head). Needs no network and no MPI.

Needs carried with the tree when the image lacks them: .gpu-deps/ (fmt, spdlog, nlohmann-json,
CLI11, GoogleTest as .deb files), made on a Debian machine by scripts/gpu-deps.sh. The script
says at once what is missing (headers, cuBLAS, NCCL) before building anything.

Limits: one deadline for the whole run (GPU_CHECK_DEADLINE, default 420 s), and tighter limits
per step; a step that hangs (a build, NCCL's start) is cut and reported, and later steps are
skipped. The summary table is printed last and written to $OUT/summary.txt even then.

Results (at most 3 files): $OUT/summary.txt, $OUT/bench.json (the timed runs, one JSON line
each), $OUT/logs.tar.gz (every log).

Environment:
  OUT=dir        where the results go (default build-gpu/gpu-check)
  BUILD=dir      build directory (default build-gpu)
  CUDA_ARCH=NN   CUDA architecture (default 90, the H100/H200 one)
  CTX=N          context rows of the timed drafts (default 4096)
  CKPT_DIR=dir   where the random checkpoint is written and reused (default $BUILD/gpu-check-ckpt)
  PYTHON=path    the Python with torch (default python3)
  CXX=compiler   host C++ compiler (default c++)
  GPU_CHECK_DEADLINE=S   the whole run's limit in seconds (default 420)
  GPU_CHECK_STUB=hang    every step a command that never ends (tests/scripts/test_gpu_check.py)

Several GPUs (not checked here; one command on such a machine, with MPI):
  mpirun -np 2 build-gpu/tpdraft bench --backend cuda --config configs/qwen3-8b-dflash-b16.json --ctx 4096
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
OUT=${OUT:-$BUILD/gpu-check}
CUDA_ARCH=${CUDA_ARCH:-90}
DEADLINE=${GPU_CHECK_DEADLINE:-420}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
jobs=$(nproc 2>/dev/null || echo 4)
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }
say() { echo "gpu-check [$(elapsed)s]: $*" >&2; }

# ---- steps under the deadline, and the summary ------------------------------------------------
declare -a summary=()
record() { summary+=("$(printf '%-24s %s' "$1" "$2")"); }
cut_off=""

# run_step NAME LIMIT COMMAND...: runs COMMAND within LIMIT seconds and what is left of the
# deadline, recording "ok", "FAILED (exit N)", "CUT after N s" or "skipped". Output goes to
# $LOGS/NAME.log. Returns 0 only when the command succeeded.
run_step() {
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - $(elapsed)))
  if [ -n "$cut_off" ] || ((left <= 5)); then
    record "$name" "skipped (${cut_off:-the deadline is spent})"
    return 1
  fi
  ((limit > left)) && limit=$left
  say "$name (limit ${limit} s)"
  local t0 rc=0
  t0=$(elapsed)
  step --timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    record "$name" "ok ($(($(elapsed) - t0)) s)"
  elif ((rc == 124 || rc == 137)); then
    record "$name" "CUT after $(($(elapsed) - t0)) s (limit $limit s; see $name.log)"
    cut_off="$name was cut"
    tail -20 "$LOGS/$name.log" >&2 || true
  else
    record "$name" "FAILED (exit $rc; see $name.log)"
    tail -30 "$LOGS/$name.log" >&2 || true
  fi
  return "$rc"
}

# The summary, the timed runs and the logs: written whatever happened before (set -e is off here,
# so that no failing line can keep the rest from being written).
finish() {
  local rc=$?
  trap - EXIT
  set +e
  {
    echo "== tpdraft gpu-check: $(elapsed) s of $DEADLINE =="
    printf '%s\n' "${summary[@]}"
    if [ -f "$LOGS/table.txt" ]; then cat "$LOGS/table.txt"; fi
  } | tee "$OUT/summary.txt"
  cat "$LOGS"/bench-*.json "$LOGS"/torch.json 2>/dev/null | grep '^{' >"$OUT/bench.json"
  [ -s "$OUT/bench.json" ] || rm -f "$OUT/bench.json"
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
  rm -rf "$LOGS"
  exit "$rc"
}
trap finish EXIT

# GPU_CHECK_STUB=hang: every step is a command that never ends (the deadline's own test).
if [ "${GPU_CHECK_STUB:-}" = hang ]; then
  record "GPU" "(stub run: every step hangs)"
  run_step build 600 sleep "${GPU_CHECK_STUB_SECONDS:-1000}" || true
  run_step gpu-tests 200 sleep "${GPU_CHECK_STUB_SECONDS:-1000}" || true
  exit 1
fi

# ---- what the machine has (before anything is built) -------------------------------------------
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
gpu_name="?"
command -v nvidia-smi >/dev/null 2>&1 &&
  gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1) || true
record "GPU" "$gpu_name"
scripts/lib/gpu-prereqs.sh "$LOGS/prereqs.env" || { record "prerequisites" "MISSING (see above)"; exit 3; }
. "$LOGS/prereqs.env"  # prefix_flag, mpi_flag, nccl_flag, nccl, and the compiler's paths
record "prerequisites" "ok (NCCL: $nccl)"

# ---- build and tests ---------------------------------------------------------------------------
run_step configure 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTPDRAFT_CUDA=ON -DTPDRAFT_PYTHON=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" "${mpi_flag[@]}" "${nccl_flag[@]}" "${prefix_flag[@]}" || exit 1
run_step build 240 cmake --build "$BUILD" -j "$jobs" --target tpdraft_cli test_cuda_ops test_cuda_drafter \
  test_cuda_qmatmul test_lazy_libs || exit 1
tests_ok=1
run_step gpu-tests 150 ctest --test-dir "$BUILD" -L gpu -V --timeout 120 || tests_ok=0
skipped=$(grep -c "\[  SKIPPED \] .*(" "$LOGS/gpu-tests.log" 2>/dev/null || true)
record "skipped GPU cases" "${skipped:-0} (a case needing 2 GPUs skips on one)"

# ---- timed drafts --------------------------------------------------------------------------------
CONFIG=configs/qwen3-8b-dflash-b16.json
CTX=${CTX:-4096}
CKPT=${CKPT_DIR:-$BUILD/gpu-check-ckpt}
if [ ! -f "$CKPT/drafter/config.json" ]; then
  rm -rf "$CKPT"
  run_step checkpoint 120 "$BUILD/tpdraft" init --config "$CONFIG" --out "$CKPT" --seed 1 --dtype bf16 || exit 1
fi
bench_ok=1
for mode in on off; do
  run_step "bench-$mode" 90 sh -c "\"$BUILD/tpdraft\" bench --backend cuda --graphs $mode --drafter \"$CKPT/drafter\" \
    --target \"$CKPT/target\" --ctx $CTX --repeat 30 --warmup 3 --json >\"$LOGS/bench-$mode.json\"" || bench_ok=0
done
PY=${PYTHON:-python3}
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  run_step torch 120 sh -c "\"$PY\" bench/torch_draft.py --drafter \"$CKPT/drafter\" --target \"$CKPT/target\" \
    --ctx $CTX --anchor 17 --device cuda --dtype bf16 --repeat 30 --warmup 3 --threads $jobs --json \
    >\"$LOGS/torch.json\"" || true
else
  record "torch" "skipped: $PY has no torch with CUDA"
fi
# Quantized weights (quantized from the bf16 checkpoint while loading): the graph draft's time at
# q8, q4 and q4+head (the head int8 too) beside bf16's (bench-on). Last, so that it never takes
# time from the above.
quant_ok=1
for quant in q8 q4 q4+head; do
  run_step "bench-$quant" 90 sh -c "\"$BUILD/tpdraft\" bench --backend cuda --graphs on --quant $quant \
    --drafter \"$CKPT/drafter\" --target \"$CKPT/target\" --ctx $CTX --repeat 20 --warmup 3 --json \
    >\"$LOGS/bench-$quant.json\"" || quant_ok=0
done
record "draft ms bf16 q8 q4 q4+head" "$(python3 scripts/lib/gpu-table.py --draft-ms "$LOGS" bench-on=bf16 bench-q8=q8 \
  bench-q4=q4 bench-q4+head=q4+head)"
((bench_ok)) && { python3 scripts/lib/gpu-table.py "$LOGS" >"$LOGS/table.txt" || bench_ok=0; }
((tests_ok && bench_ok && quant_ok))
