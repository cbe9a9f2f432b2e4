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

# The last line of a program's stdout that is a JSON object ("" when there is none: the caller
# says so, where under pipefail grep's status would end the script without a word).
last_json() { grep -E '^\{' "$1" | tail -n 1 || true; }

# A field of a JSON line: the draft's median is "draft_ms" for tpdraft, "draft_ms_median" for
# torch_draft.py.
json_field() {
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
obj, key = json.loads(sys.argv[1]), sys.argv[2]
if key == "median":
    v = obj.get("draft_ms_median", obj.get("draft_ms"))
    if v is None:
        sys.exit("no draft_ms / draft_ms_median in: " + sys.argv[1])
    print(v)
else:
    print(json.dumps(obj.get(key)))
EOF
}

TP_MS=() TORCH_MS=()
for run in $(seq 1 "$RUNS"); do
  log "run $run/$RUNS: tpdraft"
  "$TPDRAFT_BIN" bench --drafter "$CKPT/drafter" --target "$CKPT/target" --ctx "$CTX" --threads "$THREADS" \
    --warmup 2 --repeat 7 --json >"$TMP/tp.out" || die "tpdraft bench failed"
  TP_JSON="$(last_json "$TMP/tp.out")"
  [ -n "$TP_JSON" ] || die "tpdraft bench printed no JSON line"
  TP_MS+=("$(json_field "$TP_JSON" median)")

  log "run $run/$RUNS: torch"
  "$PY" "$TORCH_DRAFT" --drafter "$CKPT/drafter" --target "$CKPT/target" --ctx "$CTX" --anchor "$ANCHOR" \
    --threads "$THREADS" --warmup 2 --repeat 7 --json >"$TMP/torch.out" || die "torch_draft.py failed"
  TORCH_JSON="$(last_json "$TMP/torch.out")"
  [ -n "$TORCH_JSON" ] || die "torch_draft.py printed no JSON line"
  TORCH_MS+=("$(json_field "$TORCH_JSON" median)")
  echo "tpdraft run $run: $TP_JSON"
  echo "torch   run $run: $TORCH_JSON"
done

# Token cross-check on the checkpoint's own taps (informational: fp32 sums in another order can
# flip a near-tie on random weights).
TOKENS_NOTE="skipped (tpdraft draft gave no JSON)"
if "$TPDRAFT_BIN" draft --drafter "$CKPT/drafter" --target "$CKPT/target" --taps "$CKPT/taps.safetensors" \
     --anchor "$ANCHOR" --threads "$THREADS" >"$TMP/tp_draft.out" 2>"$TMP/tp_draft.err"; then
  TP_DRAFT_JSON="$(last_json "$TMP/tp_draft.out")"
  if [ -n "$TP_DRAFT_JSON" ]; then
    "$PY" "$TORCH_DRAFT" --drafter "$CKPT/drafter" --target "$CKPT/target" --taps "$CKPT/taps.safetensors" \
      --anchor "$ANCHOR" --threads "$THREADS" --warmup 0 --repeat 1 --json >"$TMP/torch_draft.out" \
      || die "torch_draft.py failed on the checkpoint's taps"
    TORCH_DRAFT_JSON="$(last_json "$TMP/torch_draft.out")"
    [ -n "$TORCH_DRAFT_JSON" ] || die "torch_draft.py printed no JSON line for the checkpoint's taps"
    A="$(json_field "$TP_DRAFT_JSON" tokens)"
    B="$(json_field "$TORCH_DRAFT_JSON" tokens)"
    if [ "$A" = "$B" ]; then TOKENS_NOTE="agree $A"; else TOKENS_NOTE="differ: tpdraft $A, torch $B"; fi
  fi
fi

"$PY" - "$THREADS" "$CTX" "$(basename "$CONFIG")" "${TP_MS[*]}" "${TORCH_MS[*]}" "$TOKENS_NOTE" <<'EOF'
import statistics, sys
threads, ctx, config = sys.argv[1], sys.argv[2], sys.argv[3]
tp = [float(x) for x in sys.argv[4].split()]
th = [float(x) for x in sys.argv[5].split()]
m_tp, m_th = statistics.median(tp), statistics.median(th)
print(f"config {config}, context {ctx} rows, {threads} threads, {len(tp)} A/B runs")
print(f"tpdraft draft median {m_tp:9.2f} ms   runs: " + " ".join(f"{x:.2f}" for x in tp))
print(f"torch   draft median {m_th:9.2f} ms   runs: " + " ".join(f"{x:.2f}" for x in th))
print(f"ratio torch / tpdraft: {m_th / m_tp:.2f}x")
print(f"tokens on the checkpoint's taps: {sys.argv[6]}")
EOF
