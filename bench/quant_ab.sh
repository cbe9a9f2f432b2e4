#!/usr/bin/env bash
# Quantized drafts against bf16, A/B in one run: `tpdraft bench` on the same random weights at
# bf16 and each --quant preset, taking turns for several rounds (so that a machine whose speed
# drifts affects them all alike), at each batch size; then the median of each one's per-round
# medians, its speed relative to bf16 and its time against its own roofline.

usage() {
  cat <<'USAGE'
Usage: bench/quant_ab.sh [--config FILE] [--ctx N] [--batch LIST] [--threads N] [--rounds N] [--repeat N] [--variants LIST] [--bin PATH]

  --config FILE   drafter config of the random weights (default configs/bench-dflash2-2048.json)
  --ctx N         context rows settled per session (default 1024)
  --batch LIST    sessions drafted together, a comma list (default 1,8)
  --threads N     CPU threads (default 2)
  --rounds N      turns of bf16 and the variants (default 3)
  --repeat N      timed drafts per bench run (default 10)
  --variants LIST --quant presets against bf16 (default q8a8,q4a8,q8a16,q8a8+head,q4a8+head)
  --bin PATH      the tpdraft program (default build/tpdraft)

Prints, per batch and variant: weight bytes one draft reads, the median draft time, its layers'
and head's parts, the speed relative to bf16 (draft and layers), the roofline the run reports
(FLOPs over our measured GEMM rates, those of int8 and int4 matrices at the quantized matmul's,
or bytes over the read rate, whichever is longer) and the
draft's time against it. Runs whose ceilings came out low are counted and named.
USAGE
}

. "$(dirname "$0")/lib/ab.sh"
config=$here/configs/bench-dflash2-2048.json ctx=1024 batch=1,8 threads=2 rounds=3 repeat=10 bin=$here/build/tpdraft
variants=q8a8,q4a8,q8a16,q8a8+head,q4a8+head
ab_options "config ctx batch threads rounds repeat variants bin" "$@"
ab_start "$bin"
IFS=, read -ra quants <<<"$variants"
IFS=, read -ra batches <<<"$batch"
for ((r = 0; r < rounds; ++r)); do
  for b in "${batches[@]}"; do
    for q in bf16 "${quants[@]}"; do
      extra=()
      [[ $q == bf16 ]] || extra=(--quant "$q")
      ab_bench "$out/b$b-${q/+/-}.jsonl" "$bin" --config "$config" --ctx "$ctx" --batch "$b" --threads "$threads" \
        --repeat "$repeat" "${extra[@]}"
    done
  done
done

"$py" - "$out" "$config" "$ctx" "$threads" "$rounds" "bf16,$variants" "$batch" <<'PY'
import json, statistics, sys
out, config, ctx, threads, rounds, names, batches = sys.argv[1:]
names = names.split(",")
for b in batches.split(","):
    runs = {q: [json.loads(l) for l in open(f"{out}/b{b}-{q.replace('+', '-')}.jsonl")] for q in names}
    med = lambda q, k: statistics.median(r[k] for r in runs[q])
    low = sorted({q for q in names for r in runs[q] if r.get("ceilings_low")})
    print(f"{config}, {ctx} context rows, batch {b}, {threads} threads, {rounds} rounds"
          f" (f32 GEMM {med('bf16', 'machine_gemm_gflops'):.0f} GFLOP/s, read {med('bf16', 'machine_read_gbps'):.1f} GB/s)")
    print(f"{'weights':10} {'GB/draft':>9} {'draft ms':>9} {'layers ms':>10} {'head ms':>8} {'draft x':>8} "
          f"{'layers x':>9} {'roof ms':>8} {'x roof':>7}")
    for q in names:
        print(f"{q:10} {med(q, 'draft_weight_gbytes'):9.3f} {med(q, 'draft_ms'):9.2f} {med(q, 'layers_ms'):10.2f} "
              f"{med(q, 'head_ms'):8.2f} {med('bf16', 'draft_ms') / med(q, 'draft_ms'):8.2f} "
              f"{med('bf16', 'layers_ms') / med(q, 'layers_ms'):9.2f} {med(q, 'roofline_ms'):8.2f} "
              f"{med(q, 'draft_ms') / med(q, 'roofline_ms'):7.2f}")
    if low:
        print(f"ceilings low in some runs of: {', '.join(low)} (their roofline ratios are flattered)")
    print()
PY
