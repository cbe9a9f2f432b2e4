#!/usr/bin/env bash
# On a Debian machine with apt: downloads the .deb files of the build dependencies a bare GPU
# machine may lack into .gpu-deps/, which scripts/gpu-check.sh unpacks into a private prefix there.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/gpu-deps.sh

Run on a machine with Debian's apt (this project's development machines): downloads the .deb
files of fmt, spdlog, nlohmann-json, CLI11 and GoogleTest into .gpu-deps/ (ignored by git,
~1.2 MB). Copy or carry that folder to the GPU machine; scripts/gpu-check.sh unpacks it into a
private prefix there (nothing is installed system-wide and nothing is fetched).
USAGE
}
case "${1:-}" in
  "") ;;
  -h|--help) usage; exit 0 ;;
  *) echo "gpu-deps.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
dest=.gpu-deps
mkdir -p "$dest"
packages=(libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 nlohmann-json3-dev libcli11-dev libgtest-dev)
(cd "$dest" && apt-get download "${packages[@]}" 2>/dev/null) || {
  echo "gpu-deps: apt-get download failed (run 'apt-get update' first?)" >&2
  exit 1
}
ls -1 "$dest"/*.deb
