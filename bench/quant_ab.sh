#!/usr/bin/env bash
# Quantized drafts against bf16, A/B in one run: `tpdraft bench` on the same random weights at
# bf16, --quant q8, q4, q8+head and q4+head, taking turns for several rounds (so that a machine whose speed
# drifts affects them all alike), then the median of each one's per-round medians.

usage() {
  cat <<'USAGE'
Usage: bench/quant_ab.sh [--config FILE] [--ctx N] [--threads N] [--rounds N] [--repeat N] [--variants LIST] [--bin PATH]

  --config FILE   drafter config of the random weights (default configs/bench-dflash2-2048.json)
  --ctx N         context rows settled per session (default 1024)
  --threads N     CPU threads (default 2)
  --rounds N      turns of bf16 and the variants (default 3)
  --repeat N      timed drafts per bench run (default 10)
  --variants LIST --quant presets against bf16 (default q8,q4,q8+head,q4+head)
  --bin PATH      the tpdraft program (default build/tpdraft)

Prints, per variant: weight bytes one draft reads, the median draft time, its layers' and head's
parts, and the speed relative to bf16 (draft and layers).
USAGE
}

. "$(dirname "$0")/lib/ab.sh"
config=$here/configs/bench-dflash2-2048.json ctx=1024 threads=2 rounds=3 repeat=10 bin=$here/build/tpdraft
variants=q8,q4,q8+head,q4+head
ab_options "config ctx threads rounds repeat variants bin" "$@"
ab_start "$bin"
IFS=, read -ra quants <<<"$variants"
for ((r = 0; r < rounds; ++r)); do
  for q in bf16 "${quants[@]}"; do
    extra=()
    [[ $q == bf16 ]] || extra=(--quant "$q")
    ab_bench "$out/${q/+/-}.jsonl" "$bin" --config "$config" --ctx "$ctx" --threads "$threads" --repeat "$repeat" \
      "${extra[@]}"
  done
done

python3 - "$out" "$config" "$ctx" "$threads" "$rounds" "bf16,$variants" <<'PY'
import json, statistics, sys
out, config, ctx, threads, rounds, names = sys.argv[1:]
names = names.split(",")
runs = {q: [json.loads(l) for l in open(f"{out}/{q.replace('+', '-')}.jsonl")] for q in names}
med = lambda q, k: statistics.median(r[k] for r in runs[q])
print(f"{config}, {ctx} context rows, 1 session, {threads} threads, {rounds} rounds")
print(f"{'weights':8} {'GB/draft':>9} {'draft ms':>9} {'layers ms':>10} {'head ms':>8} {'draft x':>8} {'layers x':>9}")
for q in names:
    print(f"{q:8} {med(q, 'draft_weight_gbytes'):9.3f} {med(q, 'draft_ms'):9.2f} {med(q, 'layers_ms'):10.2f} "
          f"{med(q, 'head_ms'):8.2f} {med('bf16', 'draft_ms') / med(q, 'draft_ms'):8.2f} "
          f"{med('bf16', 'layers_ms') / med(q, 'layers_ms'):9.2f}")
PY
