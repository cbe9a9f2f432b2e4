#!/usr/bin/env bash
# A draft vocabulary against the full head, A/B in one run: `tpdraft bench` on the same random
# weights with the full head and with --token-map-size N, taking turns for several rounds (a
# machine whose speed drifts affects both alike), per config; then the median of each one's
# per-round medians, the head's time against N / V, and the draft's speed-up with its spread.

usage() {
  cat <<'USAGE'
Usage: bench/vocab_ab.sh [--configs LIST] [--size N] [--ctx N] [--threads N] [--rounds N] [--repeat N]
                         [--bin PATH]

  --configs LIST  comma list of drafter configs (default: configs/bench-dflash2-2048.json,
                  configs/minimax-m2.7-dflash.json: vocabularies of 151936 and 200064)
  --size N        ids in the draft vocabulary (default 32000)
  --ctx N         context rows settled (default 1024)
  --threads N     CPU threads (default 2)
  --rounds N      turns of the full head and the draft vocabulary (default 3)
  --repeat N      timed drafts per bench run (default 10)
  --bin PATH      the tpdraft program (default build/tpdraft)

Prints, per config: V, N, the head's median time with each head and their ratio against N / V
(the bound: 1.2 N / V), the draft's median time with each and the speed-up, the spread of the
per-round medians (min..max), the head's bytes and FLOPs per draft (from the bench's counts), and
whether the machine was idle (other processes' CPU time around each run, bench/scaling/record.py).
USAGE
}

. "$(dirname "$0")/lib/ab.sh"
configs=$here/configs/bench-dflash2-2048.json,$here/configs/minimax-m2.7-dflash.json
size=32000 ctx=1024 threads=2 rounds=3 repeat=10 bin=$here/build/tpdraft
ab_options "configs size ctx threads rounds repeat bin" "$@"
ab_start "$bin"
IFS=, read -ra list <<<"$configs"
for config in "${list[@]}"; do
  [[ -f $config ]] || { echo "vocab_ab.sh: config '$config' not found" >&2; exit 2; }
  name=$(basename "$config" .json)
  for ((r = 0; r < rounds; ++r)); do
    for variant in full mapped; do
      extra=()
      [[ $variant == full ]] || extra=(--token-map-size "$size")
      echo "vocab_ab.sh: $name round $((r + 1))/$rounds, $variant head" >&2
      ab_bench "$out/$name-$variant.jsonl" "$bin" --config "$config" --ctx "$ctx" --threads "$threads" \
        --repeat "$repeat" "${extra[@]}"
    done
  done
done

"$py" - "$out" "$ctx" "$threads" "$rounds" "$configs" <<'PY'
import json, os, statistics, sys
out, ctx, threads, rounds, configs = sys.argv[1:]
import timing  # the machine's load, judged as every benchmark judges it
print(f"{ctx} context rows, 1 session, {threads} threads, {rounds} rounds of full and mapped heads taking turns")
print(f"{'config':26} {'V':>7} {'N':>6} {'N/V':>6} {'head full':>10} {'head N':>8} {'ratio':>6} {'<=1.2N/V':>8} "
      f"{'draft full':>15} {'draft N':>15} {'speed-up':>8} {'head GB':>8} {'head GFLOP':>10}  machine")
for path in configs.split(","):
    name = os.path.basename(path)[:-5]
    runs = {v: [json.loads(l) for l in open(f"{out}/{name}-{v}.jsonl")] for v in ("full", "mapped")}
    med = lambda v, k: statistics.median(r[k] for r in runs[v])
    spread = lambda v, k: f"{min(r[k] for r in runs[v]):.1f}..{max(r[k] for r in runs[v]):.1f}"
    V, N = runs["mapped"][0]["vocab"], runs["mapped"][0]["draft_vocab"]
    ratio = med("mapped", "head_ms") / med("full", "head_ms")
    ok = "yes" if ratio <= 1.2 * N / V else "NO"
    # The head's share of the counted work: the full draft's minus the mapped one's is (V - N) rows.
    rows = (V - N) / V
    head_gb = (med("full", "draft_weight_gbytes") - med("mapped", "draft_weight_gbytes")) / rows
    head_gflop = (med("full", "draft_gflop") - med("mapped", "draft_gflop")) / rows
    others = max(r["load"]["other_cores"] for v in runs for r in runs[v])
    machine = "idle" if others <= timing.OTHER_CORES_LIMIT else f"NOT idle (other processes up to {others:.2f} cores)"
    print(f"{name:26} {V:>7} {N:>6} {N / V:>6.3f} {med('full', 'head_ms'):>8.2f}ms {med('mapped', 'head_ms'):>6.2f}ms "
          f"{ratio:>6.3f} {ok:>8} {med('full', 'draft_ms'):>6.1f} ({spread('full', 'draft_ms'):>8}) "
          f"{med('mapped', 'draft_ms'):>6.1f} ({spread('mapped', 'draft_ms'):>8}) "
          f"{med('full', 'draft_ms') / med('mapped', 'draft_ms'):>7.2f}x {head_gb:>8.3f} {head_gflop:>10.2f}  {machine}")
print("draft: median ms (min..max of the per-round medians); head GB / GFLOP: the full head's per draft")
PY
