#!/usr/bin/env bash
# The test command: install, build (CMake and Bazel: every target), run every test once under
# CTest, then the sanitizer and fuzzing suites.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# Multi-process tests hold a shared lock (RESOURCE_LOCK ranks) so they run one at a time.
ctest --test-dir build --output-on-failure -j2 --timeout 900
scripts/bazel_build.sh
# AddressSanitizer + UBSan, ThreadSanitizer and libFuzzer, each in its own build directory.
scripts/sanitize_test.sh
