#!/usr/bin/env bash
# Scaling sweep: the same draft at tp = 1, 2, 4, ... (MPI ranks on CPU cores, or one rank per GPU),
# for each config, context length and session count, one JSON record per run in OUT/records.jsonl;
# then the scaling tables (each row with its roofline ratio; a context sweep when --ctx lists several)
# and plots, the multi-GPU projection (long contexts to 131072 included) and the large-vocabulary
# study (whose tp >= 2 points also run with the full logits all-gathered, to measure that exchange).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: launch/scale.sh --out DIR [options]

Runs `tpdraft bench` at every tp (MPI ranks, one per core or per GPU), appends one JSON line per
run to DIR/records.jsonl (the bench result plus the run's parameters and the machine), then
writes DIR/scaling.md (+ PNG plots: measured beside projected), DIR/projection.md/.json (with
the long-context table: contexts to 131072 on one H200 and at tp 2, 4, 8) and DIR/vocab.md/.json. Each record also holds the machine's load around its run; runs on a machine
that was not idle are marked in the reports. The reports take bytes, work and collectives from
`tpdraft info --json`, so --report-only needs the binary too.

  --out DIR          output directory (created; records are appended, see --fresh)
  --configs LIST     comma list of drafter configs (default: configs/bench-dflash2-2048.json)
  --tp LIST          tensor-parallel sizes (default: 1, 2, 4, ... up to the cores, or the GPUs);
                     a size the geometry cannot shard is skipped with a message
  --ctx LIST         context rows per session (default: 1024), e.g. 1024,8192,32768,131072; with two
                     or more, scaling.md adds the context sweep (every table has each run's roofline
                     ratio: its draft time over the roofline it measured)
  --batch LIST       sessions per draft for strong scaling (default: 1)
  --no-weak          skip the weak-scaling runs (by default each batch b also runs b*tp sessions at tp)
  --threads N        CPU threads per rank (default: 1)
  --repeat N         timed drafts per run (default: 10; --quick: 5)
  --warmup N         untimed drafts first (default: 2; --quick: 1)
  --quick            few repeats, for a first look
  --backend B        cpu, cuda or auto (default: auto = cuda when a GPU is visible, else cpu)
  --vocab LIST       vocabulary sizes of the head study (default: 151936,202048,248320; "none" skips it)
  --vocab-base FILE  config the vocabulary study varies (default: configs/bench-dflash2-2048.json)
  --vocab-tp LIST    tp sizes of the vocabulary study (default: the --tp list); each tp >= 2 also
                     runs with --gather-logits (the full logits all-gathered every draft)
  --params FILE      communication model for the projection (default: bench/scaling/comm-model.json)
  --layouts LIST     projected layouts NODESxGPUS (default: 1x1,1x2,1x4,1x8,2x8)
  --quant LIST       --quant presets projected beside the float weights (default:
                     q8,q4,q8+head,q4+head; "none" skips them)
  --draft-vocab LIST draft vocabulary sizes projected beside the full head (default: 32000; "none"
                     skips them; sizes not below a config's vocab_size are left out)
  --span-nodes       project one tp group across the nodes of a layout (default: replicas per node)
  --hostfile FILE    run the MPI ranks across the nodes of this Open MPI hostfile, the same number on
                     each (tp / nodes, rounded up; docs/scaling.md: what every node needs)
  --note TEXT        a remark every record of this sweep carries; the reports mark its runs with it
                     and leave them out of the compute fits (e.g. "2 hosts, one machine")
  --bin PATH         the tpdraft binary (default: build/tpdraft of this repository)
  --timeout S        give up on one run after S seconds (default: 1800)
  --fresh            start DIR/records.jsonl anew instead of appending
  --report-only      run nothing; rebuild the reports from DIR/records.jsonl
  --no-plots         tables only: no PNG plots, and gnuplot is not installed
  -h, --help         this text

CPU ranks: mpirun binds one rank per core (threads per rank: --map-by slot:PE=N); with more
rank-threads than cores it adds --oversubscribe and no binding (such runs are marked
"oversubscribed" and never used as compute measurements). As root it adds --allow-run-as-root.
Example:  launch/scale.sh --out scaling --tp 1,2 --ctx 1024 --batch 1,4 --quick
USAGE
}

here=$(cd "$(dirname "$0")/.." && pwd)
out="" configs="$here/configs/bench-dflash2-2048.json" tps="" ctxs=1024 batches=1 weak=1 threads=1
repeat="" warmup="" quick=0 backend=auto vocab="151936,202048,248320" vocab_base="$here/configs/bench-dflash2-2048.json"
vocab_tps="" params="" layouts="" quants="" draft_vocab="" span=0 bin="$here/build/tpdraft" timeout_s=1800 fresh=0 report_only=0 hostfile="" run_note="" plots=1
# The options that take a value, and the variable each sets.
declare -A value_of=([--out]=out [--configs]=configs [--tp]=tps [--ctx]=ctxs [--batch]=batches
  [--threads]=threads [--repeat]=repeat [--warmup]=warmup [--backend]=backend [--vocab]=vocab
  [--vocab-base]=vocab_base [--vocab-tp]=vocab_tps [--params]=params [--layouts]=layouts
  [--quant]=quants [--draft-vocab]=draft_vocab [--bin]=bin [--timeout]=timeout_s [--hostfile]=hostfile [--note]=run_note)
while (($#)); do
  case "$1" in
    --no-weak) weak=0 ;;
    --quick) quick=1 ;;
    --span-nodes) span=1 ;;
    --fresh) fresh=1 ;;
    --report-only) report_only=1 ;;
    --no-plots) plots=0 ;;
    -h|--help) usage; exit 0 ;;
    *) [ -n "$1" ] && [ -n "${value_of[$1]:-}" ] || { echo "scale.sh: unknown option '$1' (see --help)" >&2; exit 2; }
       printf -v "${value_of[$1]}" %s "$2"
       shift ;;
  esac
  shift
done
[ -n "$out" ] || { echo "scale.sh: --out DIR is required (see --help)" >&2; exit 2; }
# Each run in a process group of its own, stopped with the script on an interrupt.
. "$here/scripts/lib/steps.bash"
[ -n "$repeat" ] || repeat=$((quick ? 5 : 10))
[ -n "$warmup" ] || warmup=$((quick ? 1 : 2))
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
command -v "$py" >/dev/null || { echo "scale.sh: python3 not found (apt-get install python3)" >&2; exit 2; }
tools="$here/bench/scaling"
mkdir -p "$out/logs"
records="$out/records.jsonl"

# gnuplot draws the PNG plots; install it when missing (the tables do not need it).
ensure_gnuplot() {
  command -v gnuplot >/dev/null && return 0
  local sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "scale.sh: installing gnuplot-nox for the plots" >&2
  { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq gnuplot-nox; } >/dev/null 2>&1 \
    || echo "scale.sh: could not install gnuplot-nox; the report will have tables only" >&2
}

run_sweep() {
  [ -x "$bin" ] || { echo "scale.sh: $bin is not built; run scripts/setup.sh (or pass --bin)" >&2; exit 2; }
  local cores gpus=0 gpu_name="" nodes=1
  if [ -n "$hostfile" ]; then
    [ -f "$hostfile" ] || { echo "scale.sh: --hostfile '$hostfile' not found" >&2; exit 2; }
    nodes=$(grep -cvE '^\s*(#|$)' "$hostfile" || true)
    ((nodes > 0)) || { echo "scale.sh: --hostfile '$hostfile' lists no node" >&2; exit 2; }
  fi
  cores=$(nproc)
  if command -v nvidia-smi >/dev/null; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
  if [ "$backend" = auto ]; then
    backend=cpu
    if ((gpus > 0)); then backend=cuda; fi
  fi
  case "$backend" in
    cpu) ;;
    cuda) ((gpus > 0)) || { echo "scale.sh: --backend cuda, but nvidia-smi lists no GPU" >&2; exit 2; } ;;
    *) echo "scale.sh: --backend must be cpu, cuda or auto, got '$backend'" >&2; exit 2 ;;
  esac
  local limit=$cores
  [ "$backend" = cpu ] || limit=$gpus
  if [ -z "$tps" ]; then
    tps=1
    local t=2
    while ((t <= limit || t == 2)); do tps="$tps,$t"; t=$((t * 2)); done
  fi
  [ -n "$vocab_tps" ] || vocab_tps=$tps
  if grep -qvE '^(1,?)*$' <<<"$tps,$vocab_tps"; then
    command -v mpirun >/dev/null || { echo "scale.sh: mpirun not found (apt-get install openmpi-bin, or scripts/setup.sh)" >&2; exit 2; }
  fi
  ((fresh)) && : >"$records"
  [ "$backend" = cpu ] || gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  echo "scale.sh: backend $backend, tp {$tps}, ctx {$ctxs}, batch {$batches}, $threads thread(s) per rank, repeat $repeat, $cores core(s)${gpu_name:+, $gpus x $gpu_name}" >&2

  declare -A done_runs=()
  local n=0 failed=0 skipped=0
  # run_one CONFIG TP SESSIONS CTX STUDY GATHER [KEY=VALUE...]; GATHER 1 adds --gather-logits
  run_one() {
    local config=$1 tp=$2 b=$3 ctx=$4 study=$5 gather=$6 why
    shift 6
    local key="$config|$tp|$b|$ctx|$gather"
    [ -z "${done_runs[$key]:-}" ] || return 0
    done_runs[$key]=1
    if ! why=$("$py" "$tools/record.py" valid-tp --bin "$bin" "$config" "$tp"); then
      echo "scale.sh: skip $(basename "$config") tp=$tp: $why" >&2; skipped=$((skipped + 1)); return 0
    fi
    if [ "$backend" != cpu ] && ((tp > gpus)); then
      echo "scale.sh: skip tp=$tp: only $gpus GPU(s)" >&2; skipped=$((skipped + 1)); return 0
    fi
    local args=(bench --config "$config" --ctx "$ctx" --batch "$b" --threads "$threads" --repeat "$repeat"
                --warmup "$warmup" --backend "$backend" --json)
    ((gather)) && args+=(--gather-logits)
    local cmd launcher=single over=0
    if ((tp == 1)); then
      cmd=("$bin" "${args[@]}")
    else
      launcher=mpirun
      local flags=(-np "$tp" -x "TPDRAFT_LOG_LEVEL=${TPDRAFT_LOG_LEVEL:-warn}") here=$tp spread=""
      if [ -n "$hostfile" ]; then  # the same number of ranks on every node, consecutive ranks together
        here=$(((tp + nodes - 1) / nodes))
        spread="ppr:$here:node"
        flags+=(--hostfile "$hostfile")
      fi
      if [ "$backend" != cpu ]; then
        flags+=(--bind-to none ${spread:+--map-by "$spread"})
      elif ((here * threads <= cores)); then
        if ((threads == 1)); then flags+=(--bind-to core --map-by "${spread:-core}"); else flags+=(--bind-to core --map-by "${spread:-slot}:PE=$threads"); fi
      else
        flags+=(--oversubscribe --bind-to none ${spread:+--map-by "$spread"})  # time-sliced: binding would stack ranks on one core
        over=1
      fi
      [ "$(id -u)" -ne 0 ] || flags+=(--allow-run-as-root)
      cmd=(mpirun "${flags[@]}" "$bin" "${args[@]}" --tp "$tp")
    fi
    n=$((n + 1))
    local tag log result load note=""
    tag=$(printf '%03d-%s-tp%d-b%d-c%d%s' "$n" "$(basename "$config" .json)" "$tp" "$b" "$ctx" "$( ((gather)) && echo -gather)")
    log="$out/logs/$tag.log"
    result=$(mktemp)
    load=$(mktemp)
    ((over)) && note=", oversubscribed"
    ((gather)) && note="$note, full-logits gather"
    echo "scale.sh: [$tag] $study$note" >&2
    # record.py measure notes the machine's load around the run (other processes, stolen time).
    # The limit covers it and the run; both sit in the step's process group (steps.bash).
    if ! { step --timeout "$timeout_s" "$py" "$tools/record.py" measure --load "$load" -- "${cmd[@]}" >"$result" 2>"$log" \
       && "$py" "$tools/record.py" append --out "$records" --config "$config" --load "$load" --set "study=$study" \
            --set "launcher=$launcher" --set "ranks=$tp" --set "repeat=$repeat" --set "warmup=$warmup" \
            ${hostfile:+--set "hosts=$nodes"} ${run_note:+--set "note=$run_note"} \
            ${gpu_name:+--set "gpu_name=$gpu_name"} "${@/#/--set=}" <"$result"; }; then
      echo "scale.sh: run $tag failed; see $log" >&2
      failed=$((failed + 1))
    fi
    rm -f "$result" "$load"
  }

  local config ctx b tp
  for config in ${configs//,/ }; do
    [ -f "$config" ] || { echo "scale.sh: config '$config' not found" >&2; exit 2; }
    for ctx in ${ctxs//,/ }; do
      for b in ${batches//,/ }; do
        for tp in ${tps//,/ }; do run_one "$config" "$tp" "$b" "$ctx" strong 0; done
        if ((weak)); then
          for tp in ${tps//,/ }; do run_one "$config" "$tp" $((b * tp)) "$ctx" weak 0; done
        fi
      done
    done
  done

  if [ "$vocab" != none ]; then
    [ -f "$vocab_base" ] || { echo "scale.sh: --vocab-base '$vocab_base' not found" >&2; exit 2; }
    local vcfg v vctx=${ctxs%%,*} vb=${batches%%,*}  # the study runs at the first context and batch
    for vcfg in $("$py" "$tools/record.py" vocab-configs --base "$vocab_base" --vocab "$vocab" --dir "$out/vocab-configs"); do
      v=${vcfg##*-v}
      v=${v%.json}
      for tp in ${vocab_tps//,/ }; do
        run_one "$vcfg" "$tp" "$vb" "$vctx" vocab 0 "vocab_size=$v"
        # The same point with the full logits all-gathered: that exchange measured, not only projected.
        if ((tp >= 2)); then run_one "$vcfg" "$tp" "$vb" "$vctx" vocab 1 "vocab_size=$v"; fi
      done
    done
  fi
  echo "scale.sh: $n run(s), $failed failed, $skipped skipped; records in $records" >&2
  ((n > failed)) || { echo "scale.sh: no run succeeded" >&2; exit 1; }
}

((report_only)) || run_sweep
[ -s "$records" ] || { echo "scale.sh: $records is empty: nothing to report" >&2; exit 1; }
((plots)) && ensure_gnuplot
[ -x "$bin" ] || { echo "scale.sh: $bin is not built: the reports ask it for the cost model (tpdraft info --json)" >&2; exit 2; }
popts=(--bin "$bin" ${params:+--params "$params"})
# The projection first: the report plots it beside the measurements.
proj=(--records "$records" --out "$out" "${popts[@]}" ${layouts:+--layouts "$layouts"}
      ${quants:+--quant "$quants"} ${draft_vocab:+--draft-vocab "$draft_vocab"})
((span)) && proj+=(--span-nodes)
"$py" "$tools/project.py" "${proj[@]}" >/dev/null
"$py" "$tools/report.py" --records "$records" --out "$out" --projection "$out/projection.json" \
  $( ((plots)) || echo --no-plots) >/dev/null
if [ "$vocab" != none ]; then
  "$py" "$tools/vocab.py" --records "$records" --out "$out" --base "$vocab_base" --vocab "$vocab" "${popts[@]}" >/dev/null
fi
echo "scale.sh: wrote $out/scaling.md, $out/projection.md$([ "$vocab" != none ] && echo ", $out/vocab.md")" >&2
