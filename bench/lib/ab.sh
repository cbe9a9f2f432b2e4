# The A/B benchmarks' shared part, sourced by bench/context_ab.sh, quant_ab.sh and vocab_ab.sh:
# their options, their scratch folder, and one `tpdraft bench --json` run whose JSON lines go to a
# file with the machine's load around the run (bench/scaling/record.py measure) as key "load".
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
me=$(basename "$0")
py=$(command -v python3)
# The summaries import bench/timing.py, leaving no byte code in the tree.
export PYTHONPATH="$here/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1

# ab_options "NAME..." ARGS...: --NAME VALUE sets $NAME (a dash in the option, _ in the name);
# -h / --help prints usage. With "--" among the names, what follows a lone -- goes to extra=().
ab_options() {
  local names=" $1 " name
  shift
  extra=()
  while (($#)); do
    name=${1#--}
    name=${name//-/_}
    if [[ $1 == -h || $1 == --help ]]; then usage; exit 0
    elif [[ $1 == -- && $names == *" -- "* ]]; then shift; extra=("$@"); break
    elif [[ $1 == --* && $names == *" $name "* && $# -ge 2 ]]; then printf -v "$name" %s "$2"; shift 2
    else echo "$me: unknown argument '$1'" >&2; usage >&2; exit 2
    fi
  done
}

# ab_start BIN...: each must be a tpdraft program; makes the scratch folder $out (gone on exit).
ab_start() {
  local bin
  for bin in "$@"; do
    [[ -x $bin ]] || { echo "$me: no tpdraft program at $bin (build it, or give its path)" >&2; exit 2; }
  done
  out=$(mktemp -d "${TMPDIR:-/tmp}/tpdraft-${me%.sh}.XXXXXX")
  trap 'rm -rf "$out"' EXIT
}

# ab_bench FILE BIN ARGS...: `BIN bench --backend cpu --warmup 2 --json ARGS` on CPU; appends
# each JSON line it prints, with the load around the run, to FILE.
ab_bench() {
  local file=$1 bin=$2
  shift 2
  "$py" "$here/bench/scaling/record.py" measure --load "$out/load" -- \
    env TPDRAFT_LOG_LEVEL=warn "$bin" bench --backend cpu --warmup 2 --json "$@" >"$out/run.json"
  "$py" -c 'import json, sys
load = json.load(open(sys.argv[2]))
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line); r["load"] = load; print(json.dumps(r))' "$out/run.json" "$out/load" >>"$file"
}
