#!/usr/bin/env bash
# Runs tpdraft on one node with N MPI ranks (one per GPU, or one per group of cores on a CPU node),
# bound to cores, with the environment every rank needs.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: launch/run-node.sh -n RANKS [--tp TP] [--bin PATH] -- COMMAND [ARGS...]

Runs `tpdraft COMMAND ARGS...` on this node under mpirun with RANKS ranks.
  -n RANKS     number of ranks (processes) on this node
  --tp TP      ranks per tensor-parallel group (default: RANKS); RANKS/TP replicas serve
               different sessions
  --bin PATH   the tpdraft binary (default: build/tpdraft next to this script's repo)
  -h, --help   this text

Each rank gets cores/RANKS CPU threads unless --threads is passed to tpdraft; ranks are bound
to cores (--bind-to core) so that their threads do not migrate. As root, mpirun's
--allow-run-as-root is added; with more ranks than cores, --oversubscribe.
Environment passed to every rank: TPDRAFT_LOG_LEVEL (default info).

Example:  launch/run-node.sh -n 2 -- bench --config configs/bench-dflash2-2048.json --ctx 1024 --threads 1
USAGE
}

here=$(cd "$(dirname "$0")/.." && pwd)
ranks="" tp="" bin="$here/build/tpdraft"
while (($#)); do
  case "$1" in
    -n) ranks=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "run-node.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$ranks" ] || { echo "run-node.sh: -n RANKS is required (see --help)" >&2; exit 2; }
(($#)) || { echo "run-node.sh: no tpdraft command given after -- (see --help)" >&2; exit 2; }
[ -x "$bin" ] || { echo "run-node.sh: $bin is not built; run scripts/setup.sh" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "run-node.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }

if [ "$ranks" -le "$(nproc)" ]; then
  placement=(--bind-to core --map-by core)
else
  placement=(--oversubscribe --bind-to none)  # more ranks than cores: binding would stack them
fi
flags=(-np "$ranks" "${placement[@]}" -x "TPDRAFT_LOG_LEVEL=${TPDRAFT_LOG_LEVEL:-info}")
[ "$(id -u)" -ne 0 ] || flags+=(--allow-run-as-root)
exec mpirun "${flags[@]}" "$bin" "$1" ${tp:+--tp "$tp"} "${@:2}"
