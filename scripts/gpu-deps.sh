#!/usr/bin/env bash
# Run on a machine with Debian's apt (this project's development machines): downloads the .deb
# files of the build dependencies a bare GPU machine may lack (fmt, spdlog, nlohmann-json, CLI11,
# GoogleTest) into .gpu-deps/ (ignored by git, ~1.2 MB). Copy or carry that folder to the GPU
# machine; scripts/gpu-check.sh unpacks it into a private prefix there (nothing is installed
# system-wide and nothing is fetched).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-deps
mkdir -p "$dest"
grep -qxF "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >>.git/info/exclude
packages=(libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 nlohmann-json3-dev libcli11-dev libgtest-dev)
(cd "$dest" && apt-get download "${packages[@]}" 2>/dev/null) || {
  echo "gpu-deps: apt-get download failed (run 'apt-get update' first?)" >&2
  exit 1
}
ls -1 "$dest"/*.deb
