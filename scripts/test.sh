#!/usr/bin/env bash
# The test command: install, build (CMake and Bazel: every target), run every test once under
# CTest, then the sanitizer and fuzzing suites.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# The Bazel build (every target; nothing it builds runs) goes on alongside ctest, at the
# lowest CPU and I/O priority: ctest's multi-process tests run one at a time and leave the
# cores idle about a third of the time (waiting on peers, timeouts, processes starting), which
# the compiler takes, while a test's own processes always come first. Its output is printed
# once ctest ends. A Bazel server left by an earlier run would not have that priority: it is
# stopped first, so the build starts its own.
command -v bazel >/dev/null && bazel shutdown >/dev/null 2>&1 || true
bazel_log=build/bazel_build.log
nice -n 19 ionice -c 3 scripts/bazel_build.sh >"$bazel_log" 2>&1 &
bazel_pid=$!
trap 'kill "$bazel_pid" 2>/dev/null || true' EXIT  # never outlives this script
# Multi-process tests hold a shared lock (RESOURCE_LOCK ranks) so they run one at a time.
ctest_rc=0
ctest --test-dir build --output-on-failure -j2 --timeout 900 || ctest_rc=$?
bazel_rc=0
wait "$bazel_pid" || bazel_rc=$?
cat "$bazel_log"
if [ "$ctest_rc" -ne 0 ] || [ "$bazel_rc" -ne 0 ]; then
  echo "test: ctest exit $ctest_rc, Bazel build exit $bazel_rc" >&2
  exit 1
fi
# AddressSanitizer + UBSan, ThreadSanitizer and libFuzzer, each in its own build directory.
scripts/sanitize_test.sh
