#!/usr/bin/env bash
# Every test this machine can run: installs what is missing, builds build/ (warnings as errors;
# the build scripts/demo.sh uses too) and runs CTest (labels cpu, mpi, gpu, fuzz, slow; GPU tests
# without a device show as skipped). --sanitize: the same with the sanitizer build, build-sanitize/.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/test.sh [--sanitize] [CTEST ARGS...]

  (no option)   builds build/ (Release, warnings as errors) and runs every test in it
  --sanitize    builds build-sanitize/ (clang, AddressSanitizer + UndefinedBehaviorSanitizer,
                CUDA off) and runs its tests: the CPU, MPI and Python tests and a short run of
                each fuzz harness (docs/testing.md)
  CTEST ARGS    passed on to ctest, e.g. -L mpi, -R test_config, -E python_module
  -h, --help    this text

Missing Debian packages are installed first (scripts/setup.sh). Tests run in parallel, as many
as there are cores (ctest -j). CI runs both: scripts/test.sh && scripts/test.sh --sanitize.
USAGE
}

sanitize=0 ctest_args=()
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --sanitize) sanitize=1; shift ;;
    *) ctest_args+=("$1"); shift ;;
  esac
done

cd "$(dirname "$0")/.."
. scripts/lib/steps.bash

build=build setup=()
((sanitize)) && build=build-sanitize setup=(--sanitize)
step scripts/setup.sh "${setup[@]}"
echo "test: running ctest in $build/" >&2
step ctest --test-dir "$build" --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "${ctest_args[@]}"
