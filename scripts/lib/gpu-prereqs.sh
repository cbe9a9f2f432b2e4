#!/usr/bin/env bash
# Part of scripts/gpu-check.sh: says, before anything is built, what this machine lacks for a
# CUDA build of tpdraft and what must be carried with the tree. Unpacks .gpu-deps/*.deb (made
# by scripts/gpu-deps.sh) into a private prefix, checks the toolkit (nvcc, cuBLAS, NCCL), the
# compiler, CMake and the library headers, and writes the CMake flags to use as a bash file.
#
#   scripts/lib/gpu-prereqs.sh ENV_FILE
#
# ENV_FILE gets: prefix_flag=(...) (the unpacked prefix, for CMake), mpi_flag=(...) (the MPI
# communicator off where there is no mpicxx), nccl_flag=(...) (NCCL off where nccl.h is
# missing), nccl=yes|no, and the exports the compiler needs (PATH, CPATH, LIBRARY_PATH,
# LD_LIBRARY_PATH). Exit 0: a build can start; exit 3: something is missing (each item named,
# with what provides it, on stderr).
set -euo pipefail
env_file=${1:?usage: gpu-prereqs.sh ENV_FILE}
say() { echo "gpu-check prerequisites: $*" >&2; }

missing=()
prefix_flag=() mpi_flag=() nccl_flag=() exports=()

# The toolkit: nvcc on PATH or in its usual home.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
  exports+=("export PATH=/usr/local/cuda/bin:\$PATH")
fi
cuda_root=""
if command -v nvcc >/dev/null 2>&1; then
  cuda_root=$("$(dirname "${BASH_SOURCE[0]}")/cuda-root.sh")
  say "nvcc: $(nvcc --version | tail -1) ($cuda_root)"
else
  missing+=("nvcc [the CUDA toolkit, e.g. in /usr/local/cuda]")
fi
command -v cmake >/dev/null 2>&1 || missing+=("cmake [cmake]")
cxx=${CXX:-c++}
command -v "$cxx" >/dev/null 2>&1 || missing+=("a C++ compiler, $cxx [g++]")

# Build dependencies carried as .deb files, unpacked into a private prefix: CMake finds their
# package configs there, the compiler their headers. Nothing is installed system-wide.
carried="no"
if compgen -G ".gpu-deps/*.deb" >/dev/null; then
  carried="yes"
  deps_root=$(pwd)/.gpu-deps/root
  mkdir -p "$deps_root"
  for deb in .gpu-deps/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$deb" "$deps_root"
    else  # a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$OLDPWD/$deb" && tar -xf data.tar.* -C "$deps_root")
      rm -rf "$tmp"
    fi
  done
  lib=$deps_root/usr/lib/x86_64-linux-gnu
  export CPATH="$deps_root/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  exports+=("export CPATH=\"$CPATH\"" "export LIBRARY_PATH=\"$LIBRARY_PATH\"" "export LD_LIBRARY_PATH=\"$LD_LIBRARY_PATH\"")
  prefix_flag=("-DCMAKE_PREFIX_PATH=$deps_root/usr")
  say "using .gpu-deps/ ($(ls .gpu-deps/*.deb | wc -l) packages) unpacked into .gpu-deps/root"
fi

# The headers tpdraft builds against, with the Debian package that has each.
if command -v "$cxx" >/dev/null 2>&1; then
  headers_missing=()
  for pair in fmt/format.h=libfmt-dev spdlog/spdlog.h=libspdlog-dev nlohmann/json.hpp=nlohmann-json3-dev \
              CLI/CLI.hpp=libcli11-dev gtest/gtest.h=libgtest-dev; do  # HEADER=PACKAGE
    header=${pair%=*}
    echo "#include <$header>" | "$cxx" -std=c++17 -E -x c++ - >/dev/null 2>&1 || headers_missing+=("$header [${pair#*=}]")
  done
  if ((${#headers_missing[@]})); then
    missing+=("${headers_missing[@]}")
    [ "$carried" = yes ] || say "carry .gpu-deps/ with the tree: make it here with scripts/gpu-deps.sh"
  fi
fi

# cuBLAS (required by the CUDA backend) and NCCL (optional: without it the NCCL tests skip).
find_in_toolkit() {  # NAME...: prints the first match under the toolkit or the system's dirs
  local d n
  for d in "$cuda_root/include" "$cuda_root/lib64" "$cuda_root"/targets/*/include "$cuda_root"/targets/*/lib \
           /usr/include /usr/lib/x86_64-linux-gnu /usr/local/include /usr/local/lib; do
    for n in "$@"; do
      compgen -G "$d/$n" >/dev/null 2>&1 && { compgen -G "$d/$n" | head -1; return 0; }
    done
  done
  return 1
}
nccl="no"
if [ -n "$cuda_root" ]; then
  if ! find_in_toolkit cublas_v2.h >/dev/null || ! find_in_toolkit "libcublas.so*" >/dev/null; then
    missing+=("cuBLAS (cublas_v2.h and libcublas.so) [the toolkit's cuBLAS, e.g. libcublas-dev-13-0]")
  fi
  if find_in_toolkit nccl.h >/dev/null && find_in_toolkit "libnccl.so*" >/dev/null; then
    nccl="yes"
  else
    nccl_flag=(-DTPDRAFT_NCCL=OFF)
    say "no NCCL (nccl.h and libnccl.so): building without it; the NCCL tests will be skipped"
  fi
fi

# No MPI is needed: every single-GPU check runs in one process.
command -v mpicxx >/dev/null 2>&1 || mpi_flag=(-DTPDRAFT_MPI=OFF)

if ((${#missing[@]})); then
  say "cannot build here; missing:"
  printf '  %s\n' "${missing[@]}" >&2
  exit 3
fi
{
  printf 'prefix_flag=(%s)\n' "${prefix_flag[*]@Q}"
  printf 'mpi_flag=(%s)\n' "${mpi_flag[*]@Q}"
  printf 'nccl_flag=(%s)\n' "${nccl_flag[*]@Q}"
  printf 'nccl=%s\n' "$nccl"
  ((${#exports[@]} == 0)) || printf '%s\n' "${exports[@]}"
} >"$env_file"
