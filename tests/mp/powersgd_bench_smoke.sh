#!/bin/sh
# Smoke run of braid-powersgd-bench (tools/bench/powersgd_bench.cc): one timed call per method
# on ResNet-18's gradient set, 2 ranks over UCX tcp on lo. Passes when the bench exits 0 with
# every check passed and a row per method, and when --corrupt 2 (every checked result doubled)
# makes it exit 1. Times are not checked (BENCHMARKS.md: tests never gate on a time).
#   powersgd_bench_smoke.sh PATH/TO/braid-powersgd-bench
set -u
bench=$1
out=$("$bench" --methods none,powersgd:rank=2 --tls tcp -n 1 -w 0 --repeat 1 --ranks 2 \
  --timeout 60 --deadline 240 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: braid-powersgd-bench exited $rc"
  exit 1
fi
for row in '^  none ' '^  powersgd:rank=2 .* 329040 .* 0   yes$'; do
  if ! printf '%s\n' "$out" | grep -q "$row"; then
    echo "FAIL: no row matching '$row'"
    exit 1
  fi
done
if ! printf '%s\n' "$out" | grep -q '^# all checks passed$'; then
  echo "FAIL: the checks did not pass"
  exit 1
fi
out=$("$bench" --methods powersgd:rank=1 --tls tcp -n 1 -w 0 --repeat 1 --ranks 2 \
  --timeout 60 --deadline 240 --corrupt 2 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 1 ]; then
  echo "FAIL: with --corrupt 2 braid-powersgd-bench exited $rc, not 1"
  exit 1
fi
echo PASS
