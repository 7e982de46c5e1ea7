#!/usr/bin/env bash
# scripts/lib/stages.sh: the test command's one summary line says what passed and failed.
# Usage: stages_test.sh SOURCE_DIR
set -uo pipefail
src=$1
tmp=$(mktemp -d -t braid-stages-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "stages_test: $*" >&2; exit 1; }

# Every stage passes: PASSED, the ctest counts, exit 0.
cat >"$tmp/pass.log" <<'LOG'
100% tests passed, 0 tests failed out of 808

Total Test time (real) = 423.10 sec
LOG
out=$(bash -c 'set -euo pipefail; source "$1/scripts/lib/stages.sh"
  stage build true
  stage_record ctest 0 "ctest $(ctest_counts "$2")"
  stage asan true
  stages_summary test' _ "$src" "$tmp/pass.log")
rc=$?
[ "$rc" -eq 0 ] || fail "all passed, exit $rc"
last=$(tail -n 1 <<<"$out")
[[ "$last" =~ ^"test: PASSED: build passed; ctest 808/808 passed; asan passed ("[0-9]+" min "[0-9]+" s)"$ ]] ||
  fail "all passed, last line: '$last'"

# A failed stage and failed tests: FAILED, every stage named, the failed tests by name, exit 1;
# the stages after a failure still run.
cat >"$tmp/fail.log" <<'LOG'
99% tests passed, 2 tests failed out of 808

Total Test time (real) = 423.10 sec

The following tests FAILED:
	 12 - RuntimeWorldTest.Shutdown (Failed)
	640 - multihost_tests (Timeout)
Errors while running CTest
LOG
out=$(bash -c 'set -euo pipefail; source "$1/scripts/lib/stages.sh"
  stage build true
  stage_record ctest 1 "ctest $(ctest_counts "$2")"
  stage tsan bash -c "exit 3"
  stage fuzz true
  stage_skip deb "no dpkg"
  stages_summary test' _ "$src" "$tmp/fail.log")
rc=$?
[ "$rc" -eq 1 ] || fail "failures, exit $rc"
last=$(tail -n 1 <<<"$out")
want="test: FAILED: build passed; ctest 806/808 passed, 2 failed: RuntimeWorldTest.Shutdown, multihost_tests; tsan FAILED (exit 3); fuzz passed; deb not run (no dpkg) ("
[[ "$last" == "$want"* ]] || fail "failures, last line: '$last'"

# A skipped test (the GPU check without a GPU) is reported skipped, by name, never passed.
cat >"$tmp/skip.log" <<'LOG'
100% tests passed, 0 tests failed out of 808

The following tests did not run:
	808 - gpu_check (Skipped)

Total Test time (real) =   1.00 sec
LOG
got=$(bash -c 'source "$1/scripts/lib/stages.sh"; ctest_counts "$2"' _ "$src" "$tmp/skip.log")
[ "$got" = "807/808 passed, 1 skipped: gpu_check" ] || fail "skipped: '$got'"

# A log without ctest's summary (ctest did not get to run its tests) gives no counts.
echo "No tests were found" >"$tmp/none.log"
[ -z "$(bash -c 'source "$1/scripts/lib/stages.sh"; ctest_counts "$2"' _ "$src" "$tmp/none.log")" ] ||
  fail "a log without counts gave counts"
echo "stages_test: passed"
