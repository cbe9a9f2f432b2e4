#!/bin/sh
# Runs a command that must fail: passes when it exits non-zero and its stderr contains the
# given text. Usage: expect_failure.sh TEXT COMMAND [ARGS...]
text="$1"
shift
err_file="$(mktemp)"
trap 'rm -f "$err_file"' EXIT
"$@" 2>"$err_file"
rc=$?
cat "$err_file" >&2
if [ "$rc" -eq 0 ]; then
  echo "expected a non-zero exit status, got 0" >&2
  exit 1
fi
if ! grep -qF -- "$text" "$err_file"; then
  echo "exit status $rc as expected, but stderr does not contain: $text" >&2
  exit 1
fi
echo "ok: exit status $rc and stderr contains: $text"
