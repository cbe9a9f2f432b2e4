#!/usr/bin/env bash
# The main job on a built-in default: build, write a random DFlash 2 checkpoint (tiny geometry,
# seeded), settle its 64 tap rows and draft one block; prints the draft as JSON.
# Usage: scripts/demo.sh [config.json]   (default configs/tiny-dflash2.json)
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/tiny-dflash2.json}
scripts/setup.sh >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/tpdraft init --config "$config" --out "$work/ck" --seed 1 --taps 64
build/tpdraft info --drafter "$work/ck/drafter" --target "$work/ck/target"
build/tpdraft draft --drafter "$work/ck/drafter" --target "$work/ck/target" --taps "$work/ck/taps.safetensors" --anchor 1
