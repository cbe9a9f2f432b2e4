#!/usr/bin/env bash
# Makes the trained pair of pair/ from the seeds, every stage in order: the corpus manifest, the
# tokenizer, the target, the target's continuations (the drafters' data), the DFlash and DFlash 2
# drafters (side by side, one core each), then pair/MANIFEST. Each training stage resumes from
# its saved state, so running this again after an interruption continues where it stopped.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: train/make_pair.sh [--from STAGE]

  --from STAGE  start at STAGE: manifest, tokenizer, target, distill, drafters, pack
                (default: manifest; a stage whose output is complete is redone only from --from on)
  -h, --help    this text

Missing Debian packages (PyTorch, OpenBLAS, sentencepiece, matplotlib) are installed first.
Work files go to build/train/ (several GB of taps); the shipped files to pair/. About 2 hours
on 2 cores: the target 50 CPU minutes, the data 50 (on both cores), each drafter 30.
USAGE
}

stages=(manifest tokenizer target distill drafters pack)
from=manifest
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --from) [ $# -ge 2 ] || { echo "make_pair.sh: --from needs a stage (see --help)" >&2; exit 2; }
            from=$2; shift 2 ;;
    *) echo "make_pair.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ " ${stages[*]} " == *" $from "* ]] || { echo "make_pair.sh: unknown stage '$from' (one of: ${stages[*]})" >&2; exit 2; }

cd "$(dirname "$0")/.."
. scripts/lib/steps.bash
missing=()
for p in python3-torch python3-numpy python3-sentencepiece python3-matplotlib libopenblas0-openmp; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "make_pair: installing ${missing[*]}" >&2
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
  [ "$(id -u)" -eq 0 ] || apt=(sudo "${apt[@]}")
  "${apt[@]}" update -qq >&2
  "${apt[@]}" install -y -qq "${missing[@]}" >&2
fi

py=/usr/bin/python3
started=0
for stage in "${stages[@]}"; do
  [ "$stage" = "$from" ] && started=1
  ((started)) || continue
  echo "make_pair: $stage" >&2
  case "$stage" in
    manifest)  step $py train/corpus.py manifest --seed 0 ;;
    tokenizer) step $py train/corpus.py tokenizer --vocab-size 16384 --seed 0 ;;
    target)    step $py train/target.py --steps 420 --seed 0 --threads 1 ;;
    distill)   step $py train/distill.py --seed 0 --threads 2 ;;
    drafters)
      mkdir -p build/train
      step $py train/drafter.py --arch dflash --steps 1000 --seed 0 --threads 1 2>build/train/dflash.log &
      one=$!
      step $py train/drafter.py --arch dflash2 --steps 1000 --seed 0 --threads 1 2>build/train/dflash2.log &
      two=$!
      status=0
      wait $one || status=$?
      wait $two || status=$?
      tail -n 2 build/train/dflash.log build/train/dflash2.log >&2
      ((status == 0)) || { echo "make_pair: a drafter failed (build/train/dflash*.log)" >&2; exit "$status"; }
      ;;
    pack)      step $py train/manifest.py ;;
  esac
done
