# Sourced by the scripts in scripts/ and launch/: each long step (a build, a test run, a timed
# run) runs in a process group of its own, and an interrupt of the script (Ctrl-C, SIGTERM, a
# `timeout` around it, a closed terminal) stops that whole group, compilers and ranks included.
#
#   step [--timeout S] COMMAND [ARGS...]
#       runs COMMAND in a new process group (stdin: /dev/null) and returns its exit status; with
#       --timeout, a run longer than S seconds is stopped and returns 124, as timeout(1) does.
#
# On INT, TERM or HUP the script stops the running step (TERM, then KILL after 10 s), runs its
# own EXIT trap and exits with 128 + the signal number. A script killed with SIGKILL cannot do
# this; nothing can.

_step_pid=""

_step_stop() {
  local pid=$_step_pid i
  [ -n "$pid" ] || return 0
  _step_pid=""
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  # Up to 10 s for the group to go (a nested script stops its own step first), then KILL.
  for ((i = 0; i < 100; i++)); do
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

_step_on_signal() {  # NAME STATUS
  trap - "$1"
  echo "$(basename "$0"): interrupted (SIG$1); stopping the running step" >&2
  _step_stop
  exit "$2"
}
trap '_step_on_signal INT 130' INT
trap '_step_on_signal TERM 143' TERM
trap '_step_on_signal HUP 129' HUP

step() {
  local _step_limit=()
  if [ "${1:-}" = --timeout ]; then
    _step_limit=(timeout --kill-after=10 "$2")
    shift 2
  fi
  # Without job control a background child is not a group leader, so setsid(1) makes the new
  # session in place: the child's pid is the new group's id.
  setsid "${_step_limit[@]}" "$@" </dev/null &
  _step_pid=$!
  local rc=0
  wait "$_step_pid" || rc=$?
  _step_pid=""
  return "$rc"
}
