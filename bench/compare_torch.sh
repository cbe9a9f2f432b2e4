#!/usr/bin/env bash
# tpdraft against the PyTorch fp32 eager baseline (bench/torch_draft.py) on the SAME random bf16
# checkpoint: A/B runs alternate so that machine drift hits both sides alike; prints both medians,
# the ratio torch / tpdraft and the raw JSON lines. Everything it writes goes to a temp directory.
#
# Environment (all optional):
#   TPDRAFT_BIN   the tpdraft program (default: build/tpdraft, built there first when missing)
#   CONFIG        drafter geometry (default: configs/bench-dflash2-2048.json)
#   CTX           context rows settled before the draft (default 1024)
#   THREADS       threads for both sides (default 2)
#   RUNS          A/B pairs (default 3)
#   ANCHOR        anchor token of the token cross-check (default 17)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG="${CONFIG:-$ROOT/configs/bench-dflash2-2048.json}"
CTX="${CTX:-1024}"
THREADS="${THREADS:-2}"
RUNS="${RUNS:-3}"
ANCHOR="${ANCHOR:-17}"
PY=/usr/bin/python3
TORCH_DRAFT="$ROOT/bench/torch_draft.py"

log() { echo "compare_torch: $*" >&2; }
die() { log "error: $*"; exit 1; }

# --- the baseline's Python side (Debian's torch links the system BLAS: OpenBLAS, pthreads) ---
if ! "$PY" -c "import torch, numpy" >/dev/null 2>&1; then
  log "installing python3-torch, python3-numpy and OpenBLAS (apt)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq python3-torch python3-numpy libopenblas0-pthread >/dev/null
  "$PY" -c "import torch, numpy" || die "$PY still cannot import torch"
fi

# --- the tpdraft program ---
if [ -z "${TPDRAFT_BIN:-}" ]; then
  TPDRAFT_BIN="$ROOT/build/tpdraft"
  if [ ! -x "$TPDRAFT_BIN" ]; then
    log "building tpdraft in $ROOT/build (Release)"
    cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$ROOT/build" -j "$(nproc)" --target tpdraft_cli >/dev/null
  fi
fi
[ -x "$TPDRAFT_BIN" ] || die "tpdraft program not found or not executable: $TPDRAFT_BIN"
[ -f "$CONFIG" ] || die "config not found: $CONFIG"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/compare_torch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
CKPT="$TMP/ckpt"

log "writing a random bf16 checkpoint for $(basename "$CONFIG") with $CTX tap rows"
"$TPDRAFT_BIN" init --config "$CONFIG" --out "$CKPT" --seed 1 --dtype bf16 --taps "$CTX" >/dev/null \
  || die "tpdraft init failed"

# The last JSON line a program printed; a failed run or one without a JSON line ends the script.
last_json() { "$@" | grep -E '^\{' | tail -n 1; }

for run in $(seq 1 "$RUNS"); do
  log "run $run/$RUNS: tpdraft"
  last_json "$TPDRAFT_BIN" bench --drafter "$CKPT/drafter" --target "$CKPT/target" --ctx "$CTX" --threads "$THREADS" \
    --warmup 2 --repeat 7 --json >>"$TMP/tp.jsonl" || die "tpdraft bench failed or printed no JSON line"
  log "run $run/$RUNS: torch"
  last_json "$PY" "$TORCH_DRAFT" --drafter "$CKPT/drafter" --target "$CKPT/target" --ctx "$CTX" --anchor "$ANCHOR" \
    --threads "$THREADS" --warmup 2 --repeat 7 --json >>"$TMP/torch.jsonl" || die "torch_draft.py failed or printed no JSON line"
  echo "tpdraft run $run: $(tail -n 1 "$TMP/tp.jsonl")"
  echo "torch   run $run: $(tail -n 1 "$TMP/torch.jsonl")"
done

# Token cross-check on the checkpoint's own taps (informational: fp32 sums in another order can
# flip a near-tie on random weights).
if last_json "$TPDRAFT_BIN" draft --drafter "$CKPT/drafter" --target "$CKPT/target" --taps "$CKPT/taps.safetensors" \
     --anchor "$ANCHOR" --threads "$THREADS" >"$TMP/tp_draft.json" 2>"$TMP/tp_draft.err"; then
  last_json "$PY" "$TORCH_DRAFT" --drafter "$CKPT/drafter" --target "$CKPT/target" --taps "$CKPT/taps.safetensors" \
    --anchor "$ANCHOR" --threads "$THREADS" --warmup 0 --repeat 1 --json >"$TMP/torch_draft.json" \
    || die "torch_draft.py failed on the checkpoint's taps or printed no JSON line"
fi

"$PY" - "$THREADS" "$CTX" "$(basename "$CONFIG")" "$TMP" <<'EOF'
import json, os, statistics, sys
threads, ctx, config, tmp = sys.argv[1:]
rows = lambda name: [json.loads(line) for line in open(os.path.join(tmp, name))]
# The draft's median is "draft_ms" for tpdraft, "draft_ms_median" for torch_draft.py.
tp = [r["draft_ms"] for r in rows("tp.jsonl")]
th = [r["draft_ms_median"] for r in rows("torch.jsonl")]
m_tp, m_th = statistics.median(tp), statistics.median(th)
tokens = "skipped (tpdraft draft gave no JSON)"
if os.path.exists(os.path.join(tmp, "torch_draft.json")):
    a, b = (json.dumps(rows(f)[0]["tokens"]) for f in ("tp_draft.json", "torch_draft.json"))
    tokens = f"agree {a}" if a == b else f"differ: tpdraft {a}, torch {b}"
print(f"config {config}, context {ctx} rows, {threads} threads, {len(tp)} A/B runs")
print(f"tpdraft draft median {m_tp:9.2f} ms   runs: " + " ".join(f"{x:.2f}" for x in tp))
print(f"torch   draft median {m_th:9.2f} ms   runs: " + " ".join(f"{x:.2f}" for x in th))
print(f"ratio torch / tpdraft: {m_th / m_tp:.2f}x")
print(f"tokens on the checkpoint's taps: {tokens}")
EOF
