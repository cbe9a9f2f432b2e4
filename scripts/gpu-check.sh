#!/usr/bin/env bash
# On a machine with a GPU: probes the GPU and its driver, builds tpdraft with the CUDA backend,
# times drafts of the Qwen3-8B geometry (headline first, then per-kernel time, then the rest of
# the coverage), runs the GPU tests, all under one deadline, in the order of what each result is
# worth. A step cut at its limit cancels only the steps that need its result. The summary is
# rewritten after every step and completed at the end, also when the run is cut (see --help).
set -euo pipefail

# ---- the plan: one line per step, in the order they run ----------------------------------------
# name, limit in seconds, the steps whose success it needs ("gpu": the GPU still answers), and
# what it gives. --help prints this table; run_step NAME below looks its limit and needs up here.
PLAN=(
  "probe          10  -                      driver vs toolkit (runtime >= 12.5), devices, SMs, memory, MIG, clocks"
  "prerequisites  30  -                      nvcc, compiler, CMake, headers, cuBLAS, NCCL; .gpu-deps/ unpacked"
  "configure      60  probe,prerequisites    CMake, CUDA_ARCH only"
  "build-cli     210  configure              the program alone, so that the drafts are timed first"
  "checkpoint     40  build-cli              random bf16 checkpoint of configs/qwen3-8b-dflash-b16.json"
  "bench-graph    60  checkpoint,gpu         HEADLINE: graph replay, bf16, tp 1, greedy DFlash, ctx \$CTX"
  "kernels        90  checkpoint,gpu         per-kernel time (nsys, else a CUPTI trace): kernels.csv, top 5"
  "bench-op       45  checkpoint,gpu         op by op (the graph's launch saving; same tokens)"
  "bench-sampled  30  checkpoint,gpu         sampled drafts (temperature 0.8, top-k 50, top-p 0.95) beside greedy"
  "bench-context  45  checkpoint,gpu         ctx 256 and 32768: the context's cost (attention)"
  "build-tests   150  configure              the GPU test binaries"
  "gpu-tests     120  build-tests,gpu        ctest -L gpu: ops vs CPU, quantized matmuls, drafts, graphs, NCCL"
  "bench-q8       30  checkpoint,gpu         int8 layer weights (quantized while loading)"
  "bench-q4       30  checkpoint,gpu         int4 layer weights"
  "bench-q4+head  30  checkpoint,gpu         int4 layers, int8 head"
  "bench-q8a8     30  checkpoint,gpu         int8 layers with int8 activations (W8A8 tensor cores)"
  "bench-q4a8+head 30 checkpoint,gpu        int4 layers, int8 head, int8 activations"
  "bench-tp2      45  checkpoint,gpu         tp 2: two in-process ranks sharing the GPU (host staging)"
  "bench-dflash2  45  build-cli,gpu          DFlash 2 (configs/bench-dflash2-2048.json, random weights)"
  "attention      60  checkpoint,gpu         old and new attention kernels at ctx 4096 and 32768"
  "torch          60  checkpoint,gpu         PyTorch bf16 eager (launch bound: last)"
)

# The switch between the two attention kernels: the CUDA backend reads TPDRAFT_CUDA_ATTENTION
# (simt: the f32 fallback, mma: the tensor-core kernel). Set empty, the attention step times the
# default kernel only.
ATTENTION_SWITCH=${GPU_CHECK_ATTENTION_SWITCH-TPDRAFT_CUDA_ATTENTION=}

usage() {
  cat <<'USAGE'
Usage: scripts/gpu-check.sh

On a machine with a GPU, from the working tree alone: probes the GPU, builds tpdraft with the
CUDA backend and times drafts of the Qwen3-8B geometry (configs/qwen3-8b-dflash-b16.json, 4096
context rows, one session), then the rest, in this order (limit in seconds; what must have
succeeded first):

USAGE
  local line
  for line in "${PLAN[@]}"; do
    read -r name limit needs what <<<"$line"
    printf '  %-14s %4s s  %-22s %s\n' "$name" "$limit" "${needs//,/ }" "$what"
  done
  cat <<'USAGE'

Deadline: one for the whole run, GPU_CHECK_DEADLINE (default 330 s: with a bare machine's
start, about 1.5 minutes, the check fits 7 minutes of device time; give the command that runs
it a limit of at least the deadline + 30 s). Each step runs within its limit and what is left
of the deadline, and one that would start with 5 s or less left is skipped. A step cut at its
limit (CUT in the summary) cancels only the steps that need it; after a cut the GPU is probed
again, and if it no longer answers, the steps that need it are skipped too. A failed step
(FAILED) likewise. NCCL gives up after 20 s (TPDRAFT_NCCL_TIMEOUT_S), so a hang costs seconds.
The summary is rewritten after each step, so even a killed run leaves one.

Carry with the tree: .gpu-deps/ (fmt, spdlog, nlohmann-json, CLI11, GoogleTest as .deb files,
made here by scripts/gpu-deps.sh; ignored by git, ~1.2 MB) where the GPU machine's image lacks
those headers. Nothing else: the build happens there. The prerequisites step says what is
missing (headers, cuBLAS, NCCL) before anything is built.

Results (4 files): $OUT/summary.txt (printed too: the probe, every step's state, the draft
table, the five most expensive kernels against their floors, the all-reduce path),
$OUT/bench.json (every timed run, one JSON line each with its step), $OUT/kernels.csv (per
kernel: class, calls and microseconds per draft, share, the class's bytes and floor),
$OUT/logs.tar.gz (every step's log and output).

Environment:
  OUT=dir        where the results go (default build-gpu/gpu-check)
  BUILD=dir      build directory (default build-gpu)
  CUDA_ARCH=NN   CUDA architecture (default 90, the H100/H200 one)
  CTX=N          context rows of the headline draft (default 4096)
  CKPT_DIR=dir   where the random checkpoint is written and reused (default $BUILD/gpu-check-ckpt)
  PYTHON=path    the Python with torch (default python3)
  CXX=compiler   host C++ compiler (default c++)
  GPU_CHECK_DEADLINE=S          the whole run's limit in seconds (default 330)
  GPU_CHECK_ATTENTION_SWITCH=X  how to pick the attention kernel (see the script's ATTENTION_SWITCH)
  GPU_CHECK_STUB=1              a dry run: every step's command is replaced by a stub that
                                succeeds, or hangs (GPU_CHECK_STUB_HANG="step ..." or "all",
                                for GPU_CHECK_STUB_SECONDS), or fails (GPU_CHECK_STUB_FAIL="step
                                ..."); GPU_CHECK_STUB_LIMIT=S caps every limit (tests/scripts/)

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
DEADLINE=${GPU_CHECK_DEADLINE:-330}
CTX=${CTX:-4096}
CKPT=${CKPT_DIR:-$BUILD/gpu-check-ckpt}
PY=${PYTHON:-python3}
STUB=${GPU_CHECK_STUB:-}
export TPDRAFT_NCCL_TIMEOUT_S=${TPDRAFT_NCCL_TIMEOUT_S:-20}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
jobs=$(nproc 2>/dev/null || echo 4)
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }
say() { echo "gpu-check [$(elapsed)s]: $*" >&2; }

# ---- steps under the deadline, and the summary ------------------------------------------------
declare -A state=()  # step -> ok | FAILED | CUT | skipped
declare -a summary=()
record() { summary+=("$(printf '%-24s %s' "$1" "$2")"); }
mark() { state[$1]=$2; record "$1" "$3"; }  # NAME STATE LINE: a step's state and its summary line

write_summary() {  # the probe and the steps so far; finish() adds the tables
  {
    echo "== tpdraft gpu-check: $(elapsed) s of $DEADLINE =="
    [ -s "$LOGS/probe.out" ] && sed 's/^/GPU  /' "$LOGS/probe.out"
    printf '%s\n' "${summary[@]}"
  } >"$OUT/summary.txt"
}

skip() { mark "$1" skipped "skipped ($2)"; write_summary; }  # NAME WHY

in_list() {  # NAME LIST: whether LIST (words, or "all") holds NAME
  [ "$2" = all ] && return 0
  [[ " ${2//,/ } " == *" $1 "* ]]
}

# The stub that replaces a step's command in a dry run.
stub_command() {  # NAME
  if in_list "$1" "${GPU_CHECK_STUB_HANG:-}"; then
    echo sleep "${GPU_CHECK_STUB_SECONDS:-1000}"
  elif in_list "$1" "${GPU_CHECK_STUB_FAIL:-}"; then
    echo false
  else
    echo true
  fi
}

# run_step NAME COMMAND...: the step of PLAN named NAME, with its limit and needs.
run_step() {
  local name=$1 line n limit needs rest
  shift
  for line in "${PLAN[@]}"; do
    read -r n limit needs rest <<<"$line"
    [ "$n" = "$name" ] && { run_limited "$name" "$limit" "$needs" "$@"; return; }
  done
  echo "gpu-check.sh: no step '$name' in PLAN" >&2
  exit 2
}

# run_limited NAME LIMIT NEEDS COMMAND...: runs COMMAND (stdout to $LOGS/NAME.out, stderr to
# $LOGS/NAME.log) within LIMIT seconds and what is left of the deadline, when every step in
# NEEDS (comma separated, "-" for none) succeeded; records ok, FAILED, CUT or skipped. Returns 0
# only when the command succeeded.
run_limited() {
  local name=$1 limit=$2 needs=$3 need
  shift 3
  for need in ${needs//,/ }; do
    if [ "$need" != - ] && [ "${state[$need]:-}" != ok ]; then
      skip "$name" "needs $need: ${state[$need]:-not run}"
      return 1
    fi
  done
  local left=$((DEADLINE - $(elapsed)))
  if ((left <= 5)); then
    skip "$name" "the deadline is spent"
    return 1
  fi
  if [ -n "$STUB" ]; then
    # shellcheck disable=SC2046
    set -- $(stub_command "$name")
    limit=$((limit < ${GPU_CHECK_STUB_LIMIT:-$limit} ? limit : ${GPU_CHECK_STUB_LIMIT:-$limit}))
  fi
  ((limit > left)) && limit=$left
  say "$name (limit ${limit} s)"
  local t0 rc=0
  t0=$(elapsed)
  step --timeout "$limit" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.log" || rc=$?
  if ((rc == 0)); then
    mark "$name" ok "ok ($(($(elapsed) - t0)) s)"
  elif ((rc == 124 || rc == 137)); then
    mark "$name" CUT "CUT after $(($(elapsed) - t0)) s (limit $limit s; see $name.log)"
    tail -20 "$LOGS/$name.log" >&2 || true
  else
    mark "$name" FAILED "FAILED (exit $rc; see $name.log)"
    tail -30 "$LOGS/$name.log" "$LOGS/$name.out" >&2 || true
  fi
  write_summary
  if [ "${state[$name]}" = CUT ] && [ "$name" != gpu-alive ] && [ "${state[gpu]:-}" = ok ]; then
    # A cut GPU step may have left the device hung: ask again before spending limits on it.
    run_limited gpu-alive 10 - "$PY" scripts/lib/gpu-probe.py "$toolkit" 0 || true
    state[gpu]=${state[gpu-alive]:-}
  fi
  [ "${state[$name]}" = ok ]
}

# The summary, the timed runs and the logs: written whatever happened before (set -e is off here,
# so that no failing line can keep the rest from being written).
finish() {
  local rc=$?
  trap - EXIT
  set +e
  write_summary
  tables >>"$OUT/summary.txt"
  cat "$OUT/summary.txt"
  "$PY" - "$LOGS" >"$OUT/bench.json" 2>/dev/null <<'EOF'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.out"))):
    for line in open(path, errors="replace"):
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            d["step"] = os.path.basename(path)[:-4]
            print(json.dumps(d))
EOF
  [ -s "$OUT/bench.json" ] || rm -f "$OUT/bench.json"
  [ -s "$LOGS/kernels.csv" ] && cp "$LOGS/kernels.csv" "$OUT/kernels.csv"
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
  rm -rf "$LOGS"
  exit "$rc"
}
trap finish EXIT

# The tables under the step lines (each only from the steps that ran).
table() { python3 scripts/lib/gpu-table.py "$1" "$LOGS" "${@:2}"; }  # MODE STEP...: gpu-table.py's lines
tables() {
  [ -s "$LOGS/bench-graph.out" ] || return 0
  echo "-- drafts (bench-graph, bench-op, torch)"
  python3 scripts/lib/gpu-table.py "$LOGS"
  echo "draft ms bf16 q8 q4 q4+head  $(table --draft-ms bench-graph=bf16 bench-q8=q8 bench-q4=q4 bench-q4+head=q4+head)"
  echo "draft ms int8 activations   $(table --draft-ms bench-graph=bf16 bench-q8a8=q8a8 bench-q4a8+head=q4a8+head)"
  echo "draft ms greedy, sampled $(table --draft-ms bench-graph=greedy bench-sampled=sampled)"
  echo "draft ms by context      $(table --by-context bench-graph bench-context)"
  echo "draft ms tp 2, DFlash 2  $(table --draft-ms bench-graph=tp1 bench-tp2=tp2 bench-dflash2=dflash2-2048)"
  if [ -s "$LOGS/kernels.top" ]; then
    echo "-- per kernel, per draft (kernels.csv)"
    cat "$LOGS/kernels.top"
  fi
  if [ -s "$LOGS/attention.out" ]; then
    echo "-- attention kernels, draft ms by context"
    table --by-context attention
  fi
  grep -h "TPDRAFT_NCCL_SYMMETRIC=" "$LOGS/gpu-tests.out" 2>/dev/null | sort -u | sed 's/^/all-reduce path: /'
}

# ---- the steps' commands -------------------------------------------------------------------------
# The program's bench on the checkpoint, on the GPU, one JSON line per context.
bench=("$BUILD/tpdraft" bench --backend cuda --drafter "$CKPT/drafter" --target "$CKPT/target" --json)

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
toolkit=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1)
toolkit=${toolkit:-0.0}

run_step probe "$PY" scripts/lib/gpu-probe.py "$toolkit" || true
state[gpu]=${state[probe]:-}
run_step prerequisites scripts/lib/gpu-prereqs.sh "$LOGS/prereqs.env" || true
prefix_flag=() mpi_flag=() nccl_flag=()
# shellcheck disable=SC1091
[ -f "$LOGS/prereqs.env" ] && . "$LOGS/prereqs.env"  # the flags, and the compiler's paths

run_step configure cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTPDRAFT_CUDA=ON \
  -DTPDRAFT_PYTHON=OFF -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" "${mpi_flag[@]}" "${nccl_flag[@]}" "${prefix_flag[@]}" || true
run_step build-cli cmake --build "$BUILD" -j "$jobs" --target tpdraft_cli || true
if [ -f "$CKPT/drafter/config.json" ] && [ -z "$STUB" ]; then
  mark checkpoint ok "ok (reused $CKPT)"
else
  run_step checkpoint sh -c "rm -rf \"$CKPT\" && \"$BUILD/tpdraft\" init --config configs/qwen3-8b-dflash-b16.json \
    --out \"$CKPT\" --seed 1 --dtype bf16" || true
fi

run_step bench-graph "${bench[@]}" --graphs on --ctx "$CTX" --repeat 30 --warmup 3 || true
# Per-kernel time: the same graph draft twice, 5 and 25 timed drafts; the difference is 20 drafts.
run_step kernels scripts/lib/gpu-kernels.sh "$LOGS" 5 25 "${bench[@]}" --graphs on --ctx "$CTX" \
  --warmup 3 || true
run_step bench-op "${bench[@]}" --graphs off --ctx "$CTX" --repeat 30 --warmup 3 || true
run_step bench-sampled "${bench[@]}" --graphs on --ctx "$CTX" --temperature 0.8 --top-k 50 --top-p 0.95 \
  --repeat 20 --warmup 3 || true
run_step bench-context "${bench[@]}" --graphs on --ctx 256,32768 --repeat 20 --warmup 3 || true

run_step build-tests cmake --build "$BUILD" -j "$jobs" --target test_cuda_ops test_cuda_drafter \
  test_cuda_qmatmul test_lazy_libs || true
run_step gpu-tests ctest --test-dir "$BUILD" -L gpu -V --timeout 100 || true
skipped=$(grep -c "\[  SKIPPED \] .*(" "$LOGS/gpu-tests.out" 2>/dev/null || true)
[ "${state[gpu-tests]:-}" = ok ] && record "skipped GPU cases" "${skipped:-0} (a case needing 2 GPUs skips on one)"

for quant in q8 q4 q4+head q8a8 q4a8+head; do
  run_step "bench-$quant" "${bench[@]}" --graphs on --quant "$quant" --ctx "$CTX" --repeat 20 \
    --warmup 3 || true
done
run_step bench-tp2 "${bench[@]}" --tp 2 --ctx "$CTX" --repeat 20 --warmup 3 || true
run_step bench-dflash2 "$BUILD/tpdraft" bench --backend cuda --config configs/bench-dflash2-2048.json \
  --dtype bf16 --ctx "$CTX" --repeat 20 --warmup 3 --json || true
# Both attention kernels at 4096 and 32768 context rows (JSON lines labelled by kernel); with one
# kernel, bench-graph and bench-context have timed it already.
if [ -n "$ATTENTION_SWITCH" ] || [ -n "$STUB" ]; then
  run_step attention scripts/lib/gpu-attention.sh "$ATTENTION_SWITCH" "${bench[@]}" --graphs on \
    --ctx 4096,32768 --repeat 20 --warmup 3 || true
else
  record attention "skipped (one attention kernel, no ATTENTION_SWITCH: see draft ms by context)"
fi

if [ -n "$STUB" ] || "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  run_step torch "$PY" bench/torch_draft.py --drafter "$CKPT/drafter" --target "$CKPT/target" \
    --ctx "$CTX" --anchor 17 --device cuda --dtype bf16 --repeat 30 --warmup 3 --threads "$jobs" --json || true
else
  record torch "skipped: $PY has no torch with CUDA"
fi

# Success: the headline, the tests and the per-kernel table.
[ "${state[bench-graph]:-}" = ok ] && [ "${state[gpu-tests]:-}" = ok ] && [ "${state[kernels]:-}" = ok ]
