#!/bin/sh
# Installs the built tree into a temp prefix and builds examples/c against it as an outside
# program would: with CMake (find_package(tpdraft), tpdraft::tpdraft) and with pkg-config; runs
# both on a checkpoint made by the installed `tpdraft init` and checks what they print.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR [CMAKE]
# TPDRAFT_EXAMPLE_CFLAGS adds C flags to both builds (the sanitizer build's library needs its
# programs built with the same sanitizers, by the same compiler: CC).
set -eu
build=$1
source=$2
cmake=${3:-cmake}
work=$(mktemp -d "${TMPDIR:-/tmp}/tpdraft-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() {
  echo "install_test: $*" >&2
  exit 1
}

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" ||
  fail "cmake --install failed: $(cat "$work/install.log")"
"$prefix/bin/tpdraft" init --config "$source/configs/tiny-dflash2.json" --out "$work/ckpt" >"$work/init.log" 2>&1 ||
  fail "tpdraft init failed: $(cat "$work/init.log")"

# CMake: the package config and its exported target, from the install tree only.
"$cmake" -S "$source/examples/c" -B "$work/example" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="-Werror ${TPDRAFT_EXAMPLE_CFLAGS:-}" \
  >"$work/configure.log" 2>&1 || fail "configuring examples/c failed: $(cat "$work/configure.log")"
"$cmake" --build "$work/example" >"$work/build.log" 2>&1 || fail "building examples/c failed: $(cat "$work/build.log")"
# The program finds libtpdraft.so through the run path CMake gave it, without LD_LIBRARY_PATH.
env -u LD_LIBRARY_PATH "$work/example/draft" "$work/ckpt/drafter" "$work/ckpt/target" 5 >"$work/cmake.out" \
  2>"$work/cmake.err" || fail "the CMake-built example failed: $(cat "$work/cmake.out" "$work/cmake.err")"
cat "$work/cmake.out"

# What it prints: the caps line, five steps of 7 tokens in [0, 257), and the end.
grep -q "^tpdraft [0-9.]*: DFlash2DraftModel, block 8, vocab 257, 3 tap layers of 64, backend cpu$" "$work/cmake.out" ||
  fail "no caps line"
[ "$(grep -c '^step [1-5]: length [0-9]* anchor [0-9]* tokens:\( [0-9]\{1,3\}\)\{7\}$' "$work/cmake.out")" = 5 ] ||
  fail "expected 5 step lines of 7 tokens"
grep -q "^step 1: length 12 anchor 1 " "$work/cmake.out" || fail "step 1 should settle the 12 prompt rows"
grep -q "^step 2: length 14 " "$work/cmake.out" || fail "step 2 should settle 2 more rows"
awk '/^step/ { for (i = 8; i <= NF; ++i) if ($i >= 257) exit 1 }' "$work/cmake.out" ||
  fail "a token outside the vocabulary"
tail -n 1 "$work/cmake.out" | grep -qx done || fail "the program did not finish"

# pkg-config: the same program compiled by hand from the installed tpdraft.pc.
command -v pkg-config >/dev/null || fail "pkg-config not found (scripts/setup.sh installs it)"
pc=$(find "$prefix" -name tpdraft.pc | head -n 1)
[ -n "$pc" ] || fail "tpdraft.pc was not installed under $prefix"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs tpdraft) || fail "pkg-config knows no tpdraft under $PKG_CONFIG_PATH"
# shellcheck disable=SC2086 # the flags are words
"${CC:-cc}" -std=c99 -Wall -Wextra -Wpedantic -Werror ${TPDRAFT_EXAMPLE_CFLAGS:-} -o "$work/draft-pc" \
  "$source/examples/c/draft.c" $flags ||
  fail "compiling with pkg-config's flags ($flags) failed"
LD_LIBRARY_PATH=$(pkg-config --variable=libdir tpdraft) "$work/draft-pc" "$work/ckpt/drafter" "$work/ckpt/target" 5 \
  >"$work/pc.out" 2>"$work/pc.err" || fail "the pkg-config build failed: $(cat "$work/pc.out" "$work/pc.err")"
cmp -s "$work/cmake.out" "$work/pc.out" || fail "the two builds printed different drafts"

# A checkpoint that is not there: a non-zero exit and a message naming the path.
if "$work/example/draft" "$work/missing" "$work/ckpt/target" >"$work/missing.out" 2>&1; then
  fail "a missing checkpoint did not fail"
fi
grep -q "tpdraft_open failed (input): .*$work/missing" "$work/missing.out" ||
  fail "no message naming the path: $(cat "$work/missing.out")"
echo "install_test: ok"
