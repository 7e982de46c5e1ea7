#!/usr/bin/env bash
# The sanitizer and fuzzing suites, each in a build directory of its own (the main build/ is
# untouched), through ccache, sized to fit CI (at most 15 minutes, cold, on 2 cores):
#   build-asan  AddressSanitizer + UndefinedBehaviorSanitizer (gcc, as the main build: the
#               data plane's multiversioned kernels are written for gcc): the unit and
#               in-process tests of the coordinator, compression, the transport and the
#               runtime's in-process worlds (BRAID_ASAN_TESTS in tests/CMakeLists.txt)
#   build-tsan  ThreadSanitizer (gcc): the in-process concurrency tests (BRAID_TSAN_TESTS in
#               tests/CMakeLists.txt says which, and why multi-process tests are out of its
#               reach)
#   build-fuzz  libFuzzer (Debian's clang, which alone has it) on the coordinator's request
#               validation (tests/fuzz), FUZZ_SECONDS (default 60) of fuzzing spread over
#               the cores, starting from the saved corpus
# Each test executable runs whole, in one process (the sanitizers' start-up is paid once per
# binary, not once per test case as under ctest). Every finding fails the run. UCX's memory
# hooks and its error handler clash with ASan: they are off here (UCX_MEM_MALLOC_HOOKS,
# UCX_MEM_MMAP_HOOK_MODE, UCX_HANDLE_ERRORS).
#
# Usage: scripts/sanitize_test.sh [asan] [tsan] [fuzz]   (default: all three, in that order)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --tests

suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(asan tsan fuzz)
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_HANDLE_ERRORS=none
export OMP_NUM_THREADS=1
# Leaks count as findings; gRPC's and protobuf's process-lifetime singletons are not leaks.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:strict_string_checks=1
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitize/tsan.supp"

configure() {  # DIR CMAKE_ARGS...
  local dir=$1
  shift
  # -O1: the sanitizers' usual level (RelWithDebInfo's -O2 compiles slower, Debug's -O0 runs
  # slower); the test code itself is -O0 (tests/CMakeLists.txt). -g1: line tables only, all a
  # sanitizer's report needs for file:line in every frame, in about 3/4 of -g's compile time.
  # Tests are listed at ctest time, not after each link (PRE_TEST): these trees never run
  # ctest, so listing them would only cost a sanitized start-up per executable.
  cmake -S . -B "$dir" -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" -DCMAKE_C_FLAGS_DEBUG="-g1 -O1" \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST "$@" >/dev/null
}

stamp() { echo "sanitize_test: $* ($(date +%T))"; }

# Runs every executable listed in FILE (one path a line, written by CMake), each whole, one
# after the other (two at a time made the timing of in-process worlds differ from ctest's and
# brought out a race in a test, since fixed; one at a time keeps these runs as they were).
run_listed() {  # FILE
  local t
  while read -r t; do
    [ -n "$t" ] || continue
    echo "== ${t#"$PWD"/}"
    "$t" --gtest_brief=1
  done < "$1"
}

for suite in "${suites[@]}"; do
  start=$(date +%s)
  case "$suite" in
    asan)
      configure build-asan -DBRAID_SANITIZE=address
      stamp "building the coordinator, compression, transport and runtime tests with ASan + UBSan"
      cmake --build build-asan --target braid_asan_tests
      stamp "running them"
      run_listed build-asan/tests/asan_tests.txt
      ;;
    tsan)
      configure build-tsan -DBRAID_SANITIZE=thread
      stamp "building the in-process concurrency tests with TSan"
      cmake --build build-tsan --target braid_tsan_tests
      stamp "running them"
      run_listed build-tsan/tests/tsan_tests.txt
      ;;
    fuzz)
      CC=clang CXX=clang++ configure build-fuzz -DBRAID_FUZZ=ON
      stamp "building the fuzz target"
      cmake --build build-fuzz --target coordinator_fuzz
      # New inputs go to a scratch corpus; the saved one (tests/fuzz/corpus) is only read.
      work=build-fuzz/corpus
      mkdir -p "$work"
      # FUZZ_SECONDS of fuzzing in all, spread over the cores (libFuzzer's -fork: one fuzzing
      # process a core, sharing the corpus; the first crash ends the run and fails it): as
      # much fuzzing as one process for FUZZ_SECONDS, in 1/cores of the wall time.
      cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it obeys OMP_NUM_THREADS
      seconds=$(( (${FUZZ_SECONDS:-60} + cores - 1) / cores ))
      stamp "fuzzing the coordinator on $cores cores for $seconds s"
      build-fuzz/tests/fuzz/coordinator_fuzz -fork="$cores" -max_total_time="$seconds" \
        -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ \
        "$work" tests/fuzz/corpus
      ;;
    *)
      echo "sanitize_test: unknown suite '$suite' (asan, tsan, fuzz)" >&2
      exit 2
      ;;
  esac
  stamp "$suite passed in $(( $(date +%s) - start )) s"
done
