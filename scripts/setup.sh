#!/usr/bin/env bash
# Installs what tpdraft builds against (Debian 12 packages) when it is missing, then configures
# and builds build/: Release, warnings as errors, the one build scripts/demo.sh and
# scripts/test.sh share. --sanitize makes the sanitizer build, build-sanitize/, instead.
# Safe to run again: it installs and rebuilds only what is missing or changed.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/setup.sh [--sanitize] [--target T]... [-DOPTION=VALUE...]

  (no option)   build/: Release, warnings as errors (the build demo.sh and test.sh use)
  --sanitize    build-sanitize/: clang with AddressSanitizer + UndefinedBehaviorSanitizer
                (-DTPDRAFT_SANITIZE=address,undefined), -O1, CUDA off, and the fuzz harnesses;
                installs clang and its sanitizer / libFuzzer runtime too
  --target T    build only target T (repeatable), e.g. tpdraft_cli; default: everything
  -D...         extra CMake options, kept in the build folder's cache
  -h, --help    this text

Missing Debian packages are installed with apt-get (as root, or through sudo). Build progress
goes to stderr. BUILD_JOBS sets the parallel build jobs (default: the number of cores).
USAGE
}

sanitize=0 targets=() cmake_opts=()
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --sanitize) sanitize=1; shift ;;
    --target) [ $# -ge 2 ] || { echo "setup.sh: --target needs a target name" >&2; exit 2; }
              targets+=(--target "$2"); shift 2 ;;
    -D*) cmake_opts+=("$1"); shift ;;
    *) echo "setup.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
. scripts/lib/steps.bash

packages=(build-essential cmake libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libgtest-dev
          openmpi-bin libopenmpi-dev python3 python3-dev python3-pybind11 python3-numpy python3-pytest
          python3-torch python3-zmq pkg-config libzmq3-dev iproute2 python3-sentencepiece python3-matplotlib libopenblas0-openmp)
sanitize_packages=()  # clang and its runtimes, without the recommended LLVM development files
((sanitize)) && sanitize_packages=(clang libclang-rt-14-dev)
not_installed() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(not_installed "${packages[@]}")
mapfile -t missing_sanitize < <(not_installed "${sanitize_packages[@]}")
if ((${#missing[@]} + ${#missing_sanitize[@]})); then
  echo "setup: installing ${missing[*]} ${missing_sanitize[*]}" >&2
  # In the foreground, not as a step: sudo may have to ask for a password on the terminal.
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
  [ "$(id -u)" -eq 0 ] || apt=(sudo "${apt[@]}")
  "${apt[@]}" update -qq >&2
  ((${#missing[@]} == 0)) || "${apt[@]}" install -y -qq "${missing[@]}" >&2
  ((${#missing_sanitize[@]} == 0)) || "${apt[@]}" install -y -qq --no-install-recommends "${missing_sanitize[@]}" >&2
fi

if ((sanitize)); then
  build="build-sanitize"
  config=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1
          -DTPDRAFT_CUDA=OFF "-DTPDRAFT_SANITIZE=address,undefined")
  what="clang, -O1, AddressSanitizer + UndefinedBehaviorSanitizer, CUDA off"
else
  build=build
  config=(-DCMAKE_BUILD_TYPE=Release -DTPDRAFT_WERROR=ON)
  what="Release, warnings as errors"
fi
jobs=${BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
log=$build/configure.log
mkdir -p "$build"
echo "setup: configuring $build/ ($what)" >&2
step cmake -S . -B "$build" "${config[@]}" "${cmake_opts[@]}" >"$log" 2>&1 || {
  tail -30 "$log" >&2
  echo "setup: configuring $build/ failed (whole log: $log)" >&2
  exit 1
}
grep -E "^-- tpdraft:" "$log" | sed 's/^-- /setup: /' >&2 || true
echo "setup: building $build/ with $jobs job(s)" >&2
step cmake --build "$build" -j "$jobs" "${targets[@]}" >&2
