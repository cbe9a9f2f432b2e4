#!/usr/bin/env bash
# The main job on a built-in default: builds the program and drafts one block with the trained
# pair (pair/: a target trained on the Python standard library, and its DFlash 2 drafter) on a
# held-out file, printing the drafted text beside the target's own and how many were accepted.
# With --config, a random checkpoint of that geometry instead (the draft printed as JSON).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/demo.sh [--arch dflash2|dflash] [--file FILE] | [--config FILE | FILE]

  (no option)    the trained pair: tpdraft info, then one block drafted by `tpdraft draft` after a
                 prompt cut from the longest held-out file of the pair's corpus
  --arch A       the pair's DFlash 2 (default) or DFlash drafter
  --file FILE    cut the prompt from FILE instead
  --config FILE  a random checkpoint of this drafter geometry instead (tpdraft init, seeded), its
                 draft printed as JSON; a plain FILE argument means the same
  -h, --help     this text

Installs what is missing and builds the tpdraft program in build/ first (scripts/setup.sh; the
build scripts/test.sh uses too); temporary files go to a directory removed at the end.
USAGE
}

config="" pair_args=()
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --arch|--file) [ $# -ge 2 ] || { echo "demo.sh: $1 needs a value (see --help)" >&2; exit 2; }
              value=$2
              [ "$1" = --file ] && { [ -f "$2" ] || { echo "demo.sh: file '$2' not found" >&2; exit 2; }
                                     value=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); }
              pair_args+=("$1" "$value"); shift 2 ;;
    --config) [ $# -ge 2 ] || { echo "demo.sh: --config needs a file (see --help)" >&2; exit 2; }
              config=$2; shift 2 ;;
    --config=*) config=${1#--config=}; shift ;;
    -*) echo "demo.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$config" ] || { echo "demo.sh: one config only (see --help)" >&2; exit 2; }
       config=$1; shift ;;
  esac
done
if [ -n "$config" ]; then  # relative to where the script was started from
  [ -f "$config" ] || { echo "demo.sh: config '$config' not found" >&2; exit 2; }
  config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
fi
if [ -n "$config" ] && ((${#pair_args[@]})); then
  echo "demo.sh: --config drafts a random checkpoint; --arch and --file are for the trained pair" >&2; exit 2
fi
cd "$(dirname "$0")/.."
. scripts/lib/steps.bash
step scripts/setup.sh --target tpdraft_cli

if [ -z "$config" ]; then
  arch=dflash2
  for ((i = 0; i < ${#pair_args[@]}; i += 2)); do [ "${pair_args[i]}" = --arch ] && arch=${pair_args[i+1]}; done
  echo "demo: the trained pair (pair/target and pair/$arch)" >&2
  build/tpdraft info --drafter "pair/$arch" --target pair/target >&2
  exec /usr/bin/python3 examples/pair_demo.py "${pair_args[@]}"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "demo: tpdraft init / info / draft with $config" >&2
build/tpdraft init --config "$config" --out "$work/ck" --seed 1 --taps 64 >&2
build/tpdraft info --drafter "$work/ck/drafter" --target "$work/ck/target" >&2
build/tpdraft draft --drafter "$work/ck/drafter" --target "$work/ck/target" --taps "$work/ck/taps.safetensors" --anchor 1
