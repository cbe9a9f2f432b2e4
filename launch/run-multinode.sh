#!/usr/bin/env bash
# Runs tpdraft across several nodes listed in an MPI hostfile: tensor parallelism inside each
# node (TP ranks per node), independent replicas across nodes.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: launch/run-multinode.sh --hostfile FILE --per-node P [--tp TP] [--iface NET] [--bin PATH] -- COMMAND [ARGS...]

  --hostfile FILE  OpenMPI hostfile, one line per node: "host slots=P"
  --per-node P     ranks per node (usually the GPUs per node)
  --tp TP          ranks per tensor-parallel group (default: P, one group per node); groups are
                   consecutive ranks, so with TP <= P a group never spans nodes
  --iface NET      the network the ranks and Open MPI's daemons talk over, on every node: an
                   interface name (eth0; the same on every node) or a subnet (10.1.0.0/16), passed as
                   btl_tcp_if_include and oob_tcp_if_include (default: Open MPI picks)
  --bin PATH       tpdraft on every node (same path; default: build/tpdraft of this repo)
  -h, --help       this text

The binary and the checkpoint paths must exist on every node (shared file system or copies), and
every node needs a host name of its own (Open MPI tells nodes apart by it). docs/scaling.md has
the rest (Slurm, interfaces, what must match on every node).
Example:  launch/run-multinode.sh --hostfile hosts --per-node 8 -- bench --config configs/qwen3-8b-dflash-b16.json
USAGE
}

here=$(cd "$(dirname "$0")/.." && pwd)
hostfile="" per_node="" tp="" iface="" bin="$here/build/tpdraft"
while (($#)); do
  case "$1" in
    --hostfile) hostfile=$2; shift 2 ;;
    --per-node) per_node=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --iface) iface=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "run-multinode.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -f "$hostfile" ] || { echo "run-multinode.sh: --hostfile FILE is required and must exist (see --help)" >&2; exit 2; }
[ -n "$per_node" ] || { echo "run-multinode.sh: --per-node P is required (see --help)" >&2; exit 2; }
(($#)) || { echo "run-multinode.sh: no tpdraft command given after -- (see --help)" >&2; exit 2; }
nodes=$(grep -cvE '^\s*(#|$)' "$hostfile")
flags=(--hostfile "$hostfile" -np $((nodes * per_node)) --map-by "ppr:${per_node}:node" --bind-to core
       -x "TPDRAFT_LOG_LEVEL=${TPDRAFT_LOG_LEVEL:-info}")
[ -z "$iface" ] || flags+=(--mca btl_tcp_if_include "$iface" --mca oob_tcp_if_include "$iface")
[ "$(id -u)" -ne 0 ] || flags+=(--allow-run-as-root)
exec mpirun "${flags[@]}" "$bin" "$1" --tp "${tp:-$per_node}" "${@:2}"
