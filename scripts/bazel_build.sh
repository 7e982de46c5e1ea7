#!/usr/bin/env bash
# Builds every Bazel target, tests included (the Bazel mirror of the CMake build), offline,
# with the repository's .bazelrc (fixed output root under ~/.cache/braid-bazel and disk cache
# under ~/.cache/braid-bazel-disk, so later runs on the same machine are warm). The tests
# themselves run once, under CTest (scripts/test.sh): running them again under Bazel took a
# few minutes of every CI run and checked nothing CTest does not. scripts/bazel_test.sh runs
# them under Bazel when wanted. Nothing built here runs, so it compiles without optimization
# (--compilation_mode=fastbuild; .bazelrc's opt stays for bazel_test.sh, whose tests run):
# the same sources, flags of warnings and dependency graph, in less time. Always shuts the
# Bazel server down on exit: it would otherwise linger for hours. Exits non-zero when any
# target fails to build.
#
# Usage: scripts/bazel_build.sh [bazel build flags] [targets; default //...]
set -uo pipefail

cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}
command -v "$BAZEL" >/dev/null || { echo "bazel_build: '$BAZEL' not found (apt install bazel-bootstrap bazel-rules-java)" >&2; exit 2; }
trap '"$BAZEL" shutdown >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM

flags=(); targets=()
for a in "$@"; do
  case "$a" in -//*) targets+=("$a") ;; -*) flags+=("$a") ;; *) targets+=("$a") ;; esac
done
[ ${#targets[@]} -eq 0 ] && targets=(//...)

start=$(date +%s)
"$BAZEL" build --color=no --curses=no --compilation_mode=fastbuild ${flags[@]+"${flags[@]}"} \
  -- "${targets[@]}"
rc=$?
echo "==== bazel_build: $([ "$rc" -eq 0 ] && echo OK || echo "FAILED (bazel exit $rc)") in $(( $(date +%s) - start ))s ===="
exit "$rc"
