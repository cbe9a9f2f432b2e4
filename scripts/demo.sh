#!/usr/bin/env bash
# The main job on a built-in default: builds the program, writes a random DFlash 2 checkpoint
# (tiny geometry, seeded), settles its 64 tap rows and drafts one block; prints the draft as
# JSON on stdout (build progress and the checkpoint summary go to stderr).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/demo.sh [--config FILE | FILE]

  --config FILE  drafter geometry to draft with (default: configs/tiny-dflash2.json); a plain
                 FILE argument means the same
  -h, --help     this text

Installs what is missing and builds the tpdraft program in build/ first (scripts/setup.sh; the
build scripts/test.sh uses too), then runs tpdraft init, info and draft in a temporary
directory, which is removed at the end.
USAGE
}

config=""
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
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
cd "$(dirname "$0")/.."
config=${config:-configs/tiny-dflash2.json}
. scripts/lib/steps.bash
step scripts/setup.sh --target tpdraft_cli

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "demo: tpdraft init / info / draft with $config" >&2
build/tpdraft init --config "$config" --out "$work/ck" --seed 1 --taps 64 >&2
build/tpdraft info --drafter "$work/ck/drafter" --target "$work/ck/target" >&2
build/tpdraft draft --drafter "$work/ck/drafter" --target "$work/ck/target" --taps "$work/ck/taps.safetensors" --anchor 1
