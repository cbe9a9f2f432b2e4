#!/usr/bin/env bash
# Runs tpdraft under mpirun with what every rank needs: N ranks on this node (one per GPU, or one
# per group of cores on a CPU node, bound to cores), or N on each node of an MPI hostfile (tensor
# parallelism inside each node, independent replicas across nodes).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: launch/run-node.sh -n RANKS [--tp TP] [--hostfile FILE] [--iface NET] [--bin PATH] -- COMMAND [ARGS...]

Runs `tpdraft COMMAND ARGS...` under mpirun with RANKS ranks on this node, or on each node of FILE.
  -n RANKS         ranks (processes) per node (usually its GPUs)
  --tp TP          ranks per tensor-parallel group (default: RANKS); RANKS/TP replicas serve
                   different sessions. Groups are consecutive ranks, so with TP <= RANKS a group
                   never spans nodes
  --hostfile FILE  OpenMPI hostfile, one line per node: "host slots=RANKS"
  --iface NET      the network the ranks and Open MPI's daemons talk over, on every node: an
                   interface name (eth0; the same on every node) or a subnet (10.1.0.0/16), passed as
                   btl_tcp_if_include and oob_tcp_if_include (default: Open MPI picks)
  --bin PATH       the tpdraft binary, at the same path on every node (default: build/tpdraft of this repo)
  -h, --help       this text

On this node each rank gets cores/RANKS CPU threads unless --threads is passed to tpdraft; ranks
are bound to cores (--bind-to core) so that their threads do not migrate, or with more ranks than
cores run unbound with --oversubscribe. As root, mpirun's --allow-run-as-root is added.
Environment passed to every rank: TPDRAFT_LOG_LEVEL (default info). Across nodes the binary and
the checkpoint paths must exist on every node (shared file system or copies), and every node
needs a host name of its own (Open MPI tells nodes apart by it); docs/scaling.md has the rest
(Slurm, interfaces, what must match on every node).

Examples: launch/run-node.sh -n 2 -- bench --config configs/bench-dflash2-2048.json --ctx 1024 --threads 1
          launch/run-node.sh --hostfile hosts -n 8 -- bench --config configs/qwen3-8b-dflash-b16.json
USAGE
}

here=$(cd "$(dirname "$0")/.." && pwd)
ranks="" tp="" hostfile="" iface="" bin="$here/build/tpdraft"
while (($#)); do
  case "$1" in
    -n) ranks=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --hostfile) hostfile=$2; shift 2 ;;
    --iface) iface=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "run-node.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$ranks" ] || { echo "run-node.sh: -n RANKS is required (see --help)" >&2; exit 2; }
(($#)) || { echo "run-node.sh: no tpdraft command given after -- (see --help)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "run-node.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
flags=(-x "TPDRAFT_LOG_LEVEL=${TPDRAFT_LOG_LEVEL:-info}")
if [ -n "$hostfile" ]; then
  [ -f "$hostfile" ] || { echo "run-node.sh: hostfile '$hostfile' not found" >&2; exit 2; }
  nodes=$(grep -cvE '^\s*(#|$)' "$hostfile")
  flags+=(--hostfile "$hostfile" -np $((nodes * ranks)) --map-by "ppr:${ranks}:node" --bind-to core)
  tp=${tp:-$ranks}
else
  [ -x "$bin" ] || { echo "run-node.sh: $bin is not built; run scripts/setup.sh" >&2; exit 2; }
  flags+=(-np "$ranks")
  if [ "$ranks" -le "$(nproc)" ]; then
    flags+=(--bind-to core --map-by core)
  else
    flags+=(--oversubscribe --bind-to none)  # more ranks than cores: binding would stack them
  fi
fi
[ -z "$iface" ] || flags+=(--mca btl_tcp_if_include "$iface" --mca oob_tcp_if_include "$iface")
[ "$(id -u)" -ne 0 ] || flags+=(--allow-run-as-root)
exec mpirun "${flags[@]}" "$bin" "$1" ${tp:+--tp "$tp"} "${@:2}"
