#!/usr/bin/env bash
# Builds every Bazel target and runs every Bazel test (the Bazel mirror of the CMake build),
# offline, with the repository's .bazelrc (--test_output=errors, fixed output root under
# ~/.cache/braid-bazel and disk cache under ~/.cache/braid-bazel-disk, so later runs on the
# same machine are warm). Always shuts the Bazel server down on exit: it would otherwise
# linger for hours. Exits non-zero when the build or any test fails.
#
# Tests really run every time (--nocache_test_results): the disk cache would otherwise replay
# results recorded by an earlier run; compiled outputs still come from the cache.
#
# Usage: scripts/bazel_test.sh [bazel test flags] [targets; default //...]
#   e.g. scripts/bazel_test.sh //tests/unit/...      scripts/bazel_test.sh --cache_test_results=auto
set -uo pipefail

cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}
command -v "$BAZEL" >/dev/null || { echo "bazel_test: '$BAZEL' not found (apt install bazel-bootstrap bazel-rules-java)" >&2; exit 2; }

log=$(mktemp -t braid-bazel-test.XXXXXX)
cleanup() {
  "$BAZEL" shutdown >/dev/null 2>&1 || true
  rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

flags=(); targets=()
for a in "$@"; do
  case "$a" in -//*) targets+=("$a") ;; -*) flags+=("$a") ;; *) targets+=("$a") ;; esac
done
[ ${#targets[@]} -eq 0 ] && targets=(//...)

start=$(date +%s)
"$BAZEL" test --color=no --curses=no --nocache_test_results ${flags[@]+"${flags[@]}"} -- "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
elapsed=$(( $(date +%s) - start ))

# Per-test result lines look like "//tests/unit:dtype_test   PASSED in 0.1s".
count() { grep -cE "^//[^ ]+ +(\(cached\) )?$1" "$log" || true; }
passed=$(count PASSED); failed=$(count FAILED); flaky=$(count FLAKY)
timeout=$(count TIMEOUT); nostatus=$(count 'NO STATUS'); incomplete=$(count INCOMPLETE)

echo
echo "==== bazel_test summary (${elapsed}s, bazel exit ${rc}) ===="
echo "passed: ${passed}  failed: ${failed}  timed out: ${timeout}  flaky: ${flaky}  not run: $((nostatus + incomplete))"
grep -E "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)" "$log" | sed 's/^/  /' || true
case "$rc" in
  0) echo "bazel_test: OK" ;;
  1) echo "bazel_test: BUILD FAILED (see errors above)" ;;
  3) echo "bazel_test: TESTS FAILED" ;;
  4) echo "bazel_test: built, but no test targets were found" ;;
  8) echo "bazel_test: interrupted" ;;
  *) echo "bazel_test: bazel exited with ${rc}" ;;
esac
exit "$rc"
