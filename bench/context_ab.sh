#!/usr/bin/env bash
# Long-context drafts of two tpdraft programs (e.g. before and after an attention change), A/B in
# one run: `tpdraft bench --ctx LIST --json` with each, taking turns for several rounds (a machine
# whose speed drifts affects both alike); then per program and context the median of the
# per-round medians of the draft, its layers and head, the roofline bench prints and the ratio.

usage() {
  cat <<'USAGE'
Usage: bench/context_ab.sh --before PATH [--after PATH] [--config FILE] [--ctx LIST] [--threads N]
                           [--rounds N] [--repeat N] [-- EXTRA BENCH OPTIONS]

  --before PATH  the first tpdraft program (required)
  --after PATH   the second (default build/tpdraft)
  --config FILE  drafter config (default configs/bench-dflash2-2048.json)
  --ctx LIST     contexts swept by each bench run (default 1024,8192,32768,131072)
  --threads N    CPU threads (default 2)
  --rounds N     turns of the two programs (default 3)
  --repeat N     timed drafts per context per run (default 10)
  -- ...         passed to both bench runs (e.g. -- --kv-dtype bf16: both must know the option)

Prints one row per program and context: draft, layers and head medians (ms), the roofline
(max of draft_gflop / machine_gemm_gflops and draft_gbytes / machine_read_gbps, ms), the ratio of
the draft to it, and whether the machine was idle (other processes' CPU time around each run,
bench/scaling/record.py).
USAGE
}

. "$(dirname "$0")/lib/ab.sh"
before="" after=$here/build/tpdraft config=$here/configs/bench-dflash2-2048.json
ctx=1024,8192,32768,131072 threads=2 rounds=3 repeat=10
ab_options "before after config ctx threads rounds repeat --" "$@"
[[ -n $before ]] || { echo "context_ab.sh: give --before PATH" >&2; usage >&2; exit 2; }
[[ -f $config ]] || { echo "context_ab.sh: config '$config' not found" >&2; exit 2; }
ab_start "$before" "$after"
for ((r = 0; r < rounds; ++r)); do
  for side in before after; do
    bin=$before
    [[ $side == before ]] || bin=$after
    echo "context_ab.sh: round $((r + 1))/$rounds, $side ($bin)" >&2
    ab_bench "$out/$side.jsonl" "$bin" --config "$config" --ctx "$ctx" --threads "$threads" --repeat "$repeat" \
      "${extra[@]}"
  done
done

"$py" - "$out" "$rounds" "$threads" <<'PY'
import json, statistics, sys
out, rounds, threads = sys.argv[1:]
import timing  # the machine's load, judged as every benchmark judges it
med_of = lambda rows, f: statistics.median(f(r) for r in rows)
runs = {side: [json.loads(l) for l in open(f"{out}/{side}.jsonl")] for side in ("before", "after")}
print(f"{rounds} rounds of both programs taking turns, {threads} threads, 1 session; medians of the per-round medians")
print(f"{'program':8} {'context':>8} {'draft ms':>9} {'layers ms':>10} {'head ms':>8} {'roofline ms':>12} {'ratio':>6}")
for side, rs in runs.items():
    for ctx in sorted({r["context"] for r in rs}):
        at = [r for r in rs if r["context"] == ctx]
        med = lambda k: statistics.median(r[k] for r in at)
        # bench's roofline_ms, from the fields it is made of (a program older than the field has them too)
        roof = med_of(at, lambda r: 1e3 * max(r["draft_gflop"] / r["machine_gemm_gflops"],
                                               r["draft_gbytes"] / r["machine_read_gbps"]))
        print(f"{side:8} {ctx:>8} {med('draft_ms'):>9.2f} {med('layers_ms'):>10.2f} {med('head_ms'):>8.2f} "
              f"{roof:>12.2f} {med('draft_ms') / roof:>6.2f}")
loads = [r["load"] for rs in runs.values() for r in rs]
avg = [l["loadavg_before"][0] for l in loads] + [l["loadavg_after"][0] for l in loads]
print("machine, the busiest run: " + timing.describe(max(loads, key=lambda l: l["other_cores"]))
      + f"; 1-minute load average {min(avg):.2f}..{max(avg):.2f} around the runs")
r0 = runs["after"][0]
print(f"ceilings: GEMM {r0['machine_gemm_gflops']:.0f} GFLOP/s, read {r0['machine_read_gbps']:.1f} GB/s")
PY
