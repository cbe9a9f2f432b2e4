#!/usr/bin/env bash
# Two hosts on one machine for the multi-host tests: each host is a network namespace with its own
# host name (UTS), mount namespace (its own /dev/shm and /etc/hosts) and one end of a veth pair; the
# pair's subnet exists only inside the two namespaces (no route leaves them, nothing else is
# addressed). Open MPI starts its daemons on a host through `agent` (plm_rsh_agent) instead of ssh.
#
#   hosts.sh run -- COMMAND [ARGS...]   make the hosts, run COMMAND on the first one, remove them
#   hosts.sh agent DIR [OPTS] HOST CMD  Open MPI's rsh agent: CMD (shell text) on HOST
#   hosts.sh enter DIR HOST COMMAND...  COMMAND on HOST
#   hosts.sh kill DIR HOST              SIGKILL to every process on HOST (the host stays)
#
# `run` gives COMMAND: TPDRAFT_HOSTS_DIR (DIR), TPDRAFT_HOSTS ("first second"), TPDRAFT_HOSTFILE (an
# Open MPI hostfile of both, 2 slots each), TPDRAFT_HOSTS_NET (the subnet) and the OMPI_MCA_*
# settings that launch through the agent and keep the daemons' and ranks' TCP on that subnet.
# Where namespaces cannot be made (not root, no iproute2, a container without the capability) it
# exits 77 with the reason. The hosts are removed however `run` ends: on its own exit or a signal by
# its trap, and when it is killed outright (CTest's timeout) by a watcher that sees its pipe close.
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

usage() { sed -n '2,17p' "$self" | sed 's/^# \{0,1\}//'; }

# The processes in HOST's network namespace but its holder (or with "all", the holder too).
host_pids() {
  local dir=$1 host=$2 keep=""
  [ "${3:-}" = all ] || keep=$(cat "$dir/$host.pid" 2>/dev/null || true)
  ip netns pids "$host" 2>/dev/null | grep -vx "${keep:-none}" || true
}

# Everything run made: the processes on both hosts, the namespaces (and with them the veth pair),
# DIR. Safe to run twice, and at once from the trap and the watcher.
remove_hosts() {
  local dir=$1 host pids
  for host in $(cat "$dir/names" 2>/dev/null); do
    pids=$(host_pids "$dir" "$host" all)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ip netns del "$host" 2>/dev/null || true
  done
  rm -rf "$dir"
}

# HOST's holder: a process that keeps its UTS and mount namespaces for `enter` to join.
start_holder() {
  local dir=$1 host=$2
  ip netns exec "$host" unshare --uts --mount --propagation private -- sh -c '
    hostname "$1" && mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm && mount --bind "$2/etc-hosts" /etc/hosts \
      && echo $$ >"$2/$1.pid.tmp" && mv "$2/$1.pid.tmp" "$2/$1.pid" && exec sleep infinity' sh "$host" "$dir" \
    </dev/null >/dev/null 2>"$dir/$host.holder.log" {watch}>&- &
  disown  # ended by remove_hosts, with no notice from this shell
  local waited=0
  until [ -s "$dir/$host.pid" ]; do
    kill -0 $! 2>/dev/null || { cat "$dir/$host.holder.log" >&2; return 1; }
    sleep 0.05
    waited=$((waited + 1))
    ((waited < 200)) || { echo "hosts.sh: host $host did not start" >&2; return 1; }
  done
}

enter() {
  local dir=$1 host=$2
  shift 2
  local pid
  pid=$(cat "$dir/$host.pid" 2>/dev/null) || { echo "hosts.sh: no host '$host' in $dir" >&2; exit 2; }
  exec nsenter -t "$pid" -n -u -m --wd="$PWD" -- "$@"
}

run() {
  [ "${1:-}" = -- ] && shift
  (($#)) || { echo "hosts.sh run: no command given (see --help)" >&2; exit 2; }
  local why=""
  [ "$(id -u)" -eq 0 ] || why="not root"
  [ -n "$why" ] || for tool in ip nsenter unshare; do
    command -v "$tool" >/dev/null || { why="$tool not found (apt-get install iproute2 util-linux)"; break; }
  done
  # Names and subnet from this process's id: unique among the runs going on at once. (The subnet
  # lives only inside the pair of namespaces, so a clash could do no harm outside them.)
  local tag=$$ dir
  local first="tpdraft-$tag-a" second="tpdraft-$tag-b" veth="tpd${tag}"
  local net="10.$(((tag >> 8) & 255)).$((tag & 255))"
  dir=$(mktemp -d "${TMPDIR:-/tmp}/tpdraft-hosts-XXXXXX")
  echo "$first $second" >"$dir/names"
  # The watcher: in a session of its own, it outlives a `run` killed with SIGKILL, sees the pipe
  # close and removes the hosts. COMMAND does not inherit the pipe.
  exec {watch}> >(exec setsid bash -c "cat >/dev/null; . '$self' source-only; remove_hosts '$dir'" \
                    >/dev/null 2>&1)
  trap 'remove_hosts "$dir"' EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  trap 'exit 129' HUP
  if [ -z "$why" ] && ! err=$(ip netns add "$first" 2>&1); then why="cannot make a network namespace: $err"; fi
  if [ -n "$why" ]; then
    echo "hosts.sh: skipped: two hosts of network namespaces cannot be made here: $why" >&2
    exit 77
  fi
  ip netns add "$second"
  ip link add "${veth}a" netns "$first" type veth peer name "${veth}b" netns "$second"
  printf '127.0.0.1 localhost\n%s.1 %s\n%s.2 %s\n' "$net" "$first" "$net" "$second" >"$dir/etc-hosts"
  local host end i
  for i in 1 2; do
    host=$first end=${veth}a
    [ "$i" = 1 ] || host=$second end=${veth}b
    ip -n "$host" link set lo up
    ip -n "$host" addr add "$net.$i/24" dev "$end"
    ip -n "$host" link set "$end" up
    start_holder "$dir" "$host"
    echo "$host slots=2" >>"$dir/hostfile"
  done
  echo "hosts.sh: hosts $first ($net.1) and $second ($net.2) on $net.0/24" >&2
  local status=0
  # Open MPI: daemons through the agent, straight from mpirun (no tree spawn), and every TCP
  # connection (daemons and ranks) on the pair's subnet.
  TPDRAFT_HOSTS_DIR=$dir TPDRAFT_HOSTS="$first $second" TPDRAFT_HOSTFILE=$dir/hostfile TPDRAFT_HOSTS_NET=$net.0/24 \
    OMPI_MCA_plm_rsh_agent="bash $self agent $dir" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
    OMPI_MCA_oob_tcp_if_include=$net.0/24 OMPI_MCA_btl_tcp_if_include=$net.0/24 \
    bash "$self" enter "$dir" "$first" "$@" {watch}>&- || status=$?
  exit "$status"
}

case "${1:-}" in
  -h|--help|"") usage; exit 0 ;;
  source-only) return 0 ;;
  run) shift; run "$@" ;;
  enter) shift; (($# >= 3)) || { echo "hosts.sh enter: DIR HOST COMMAND... (see --help)" >&2; exit 2; }; enter "$@" ;;
  agent)
    # Open MPI calls the agent as it would ssh: options (none by default), the host, then the
    # daemon's command line as shell text in one or more words.
    dir=$2
    shift 2
    while [ "${1:-}" != "${1#-}" ]; do shift; done
    host=$1
    shift
    enter "$dir" "$host" sh -c "$*" ;;
  kill)
    (($# == 3)) || { echo "hosts.sh kill: DIR HOST (see --help)" >&2; exit 2; }
    pids=$(host_pids "$2" "$3")
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true ;;
  *) echo "hosts.sh: unknown command '$1' (see --help)" >&2; exit 2 ;;
esac
