#!/usr/bin/env bash
# The test command: install (the library's packages and the tests'), build (CMake and Bazel:
# every target), run every test once under CTest, then the sanitizer and fuzzing suites. Every
# stage runs even when an earlier one failed (except after a failed install or build), and
# the last line says what passed and what failed across them:
#   test: PASSED: install passed; build passed; ctest 816/816 passed; Bazel build passed; ...
# Cold on 2 cores: about 25 minutes and 5 GB of disk (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/stages.sh
stage install scripts/install_deps.sh --tests
if [ "$_stage_failed" -eq 0 ]; then
  stage build scripts/build.sh -DBRAID_BUILD_TESTS=ON
  # Where nvcc is, the CUDA path must have been compiled and linked (cmake/cuda.cmake).
  if [ "$_stage_failed" -eq 0 ]; then stage cuda scripts/lib/check_cuda.sh build; fi
fi
if [ "$_stage_failed" -ne 0 ]; then
  stage_skip tests "nothing to test without the packages and the build"
  stages_summary test
  exit 1
fi
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
ctest_log=build/ctest.log
ctest_rc=0
# The `long` label (soaks, elastic training's longer cases) runs outside CI: ctest -L long.
ctest --test-dir build --output-on-failure -j2 --timeout 900 -LE long 2>&1 | tee "$ctest_log" ||
  ctest_rc=${PIPESTATUS[0]}
counts=$(ctest_counts "$ctest_log")
if [ -n "$counts" ]; then
  stage_record ctest "$ctest_rc" "ctest $counts"
else  # ctest ran no test (none found, or it could not start): a failure whatever its exit
  stage_record ctest 1 "ctest FAILED (no test ran; exit $ctest_rc)"
fi
stage "Bazel build" wait "$bazel_pid"
cat "$bazel_log"
# AddressSanitizer + UBSan, ThreadSanitizer and libFuzzer, each in its own build directory.
for suite in asan tsan fuzz; do
  stage "$suite" scripts/sanitize_test.sh "$suite"
done
stages_summary test
