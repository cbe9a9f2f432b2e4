#!/usr/bin/env bash
# Writes a fresh tiny checkpoint with `tpdraft init` into a temporary directory of its own,
# replaces @CK@ in the remaining arguments by that directory, runs them and removes the directory
# again: tests that need a checkpoint can run at the same time without sharing a path.
set -euo pipefail
usage="Usage: with_checkpoint.sh TPDRAFT CONFIG COMMAND [ARGS...]   (ARGS may contain @CK@)"
if [ "${1:-}" = --help ]; then
  echo "$usage"
  exit 0
fi
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
tpdraft=$1 config=$2
shift 2
ck=$(mktemp -d "${TMPDIR:-/tmp}/tpdraft-ck-XXXXXX")
trap 'rm -rf "$ck"' EXIT
"$tpdraft" init --config "$config" --out "$ck" --taps 20 >/dev/null
args=()
for a in "$@"; do args+=("${a//@CK@/$ck}"); done
"${args[@]}"
