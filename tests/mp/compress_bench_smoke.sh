#!/bin/sh
# Smoke run of braid-compress-bench (tools/bench/compress_bench.cc): tiny sizes, every method
# (the sparsifiers too), both parts, 2 ranks over UCX tcp on lo. Passes when the bench exits 0, its footer reports no
# element out of its error bound and no ranks disagreeing, and the JSON file was written.
# Then the checks themselves are tested: with every checked result doubled (--corrupt 2, a
# sum returned for a mean) the bench must exit 1 and report results out of bound, a biased
# fp4 row and wrong scalecomp rows. Times are not checked (BENCHMARKS.md: tests never gate on a time).
#   compress_bench_smoke.sh PATH/TO/braid-compress-bench
set -u
bench=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/compress-bench-smoke-XXXXXX") || exit 2
trap 'rm -rf "$dir"' EXIT
out=$("$bench" --parts codec,allreduce \
  --methods none,fp4,int4,fp16,bf16,fp4:chunk=64,scalecomp:ratio=10,topk:ratio=10,randomk:ratio=10 \
  --codec-bytes 256K -b 4 -e 256K -f 16 -n 2 -w 1 --repeat 2 --ranks 2 --tls tcp \
  --timeout 60 --deadline 240 --json "$dir/out.json" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: braid-compress-bench exited $rc"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -q '^# out of bound: 0 (codec 0, all-reduce 0); rows with ranks disagreeing: 0; biased rows: 0$'; then
  echo "FAIL: the footer does not report 0 results out of bound"
  exit 1
fi
if [ ! -s "$dir/out.json" ]; then
  echo "FAIL: no JSON written"
  exit 1
fi

out=$("$bench" --parts codec,allreduce --methods none,fp4,scalecomp:ratio=10 --codec-bytes 256K -b 1M -e 1M \
  -n 1 -w 0 --repeat 1 --ranks 2 --tls tcp --timeout 60 --deadline 240 --corrupt 2 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 1 ]; then
  echo "FAIL: with --corrupt 2 braid-compress-bench exited $rc, not 1"
  exit 1
fi
if printf '%s\n' "$out" | grep -q '^# out of bound: 0 '; then
  echo "FAIL: with --corrupt 2 no result was out of bound"
  exit 1
fi
if printf '%s\n' "$out" | grep -q 'biased rows: 0$'; then
  echo "FAIL: with --corrupt 2 the fp4 row was not flagged as biased"
  exit 1
fi
# The sparsifier's rows are checked too: elements not the mean, in the codec and the all-reduce.
codec_wrong=$(printf '%s\n' "$out" | awk '$1 == "scalecomp:ratio=10" && NF == 7 {print $6}')
reduce_wrong=$(printf '%s\n' "$out" | awk '$3 == "scalecomp:ratio=10" {print $16}')
if [ "${codec_wrong:-0}" -eq 0 ] || [ "${reduce_wrong:-0}" -eq 0 ]; then
  echo "FAIL: with --corrupt 2 the scalecomp rows were not flagged (codec '$codec_wrong', all-reduce '$reduce_wrong')"
  exit 1
fi
echo PASS
