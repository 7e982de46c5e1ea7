#!/usr/bin/env bash
# Fails when this machine has nvcc (on PATH or at /usr/local/cuda/bin) but the build in
# directory $1 (default build) ended up without CUDA (cmake/cuda.cmake): CI must compile and
# link the CUDA path wherever it can, never skip it silently. Prints which it is.
set -euo pipefail
build=${1:-build}
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if grep -q '^BRAID_WITH_CUDA:INTERNAL=ON$' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "cuda: on ($nvcc)"
elif [ -n "$nvcc" ]; then
  echo "cuda: FAILED: $nvcc is here but $build has CUDA off (see cmake's 'braid: CUDA' line)" >&2
  exit 1
else
  echo "cuda: off (no nvcc on this machine)"
fi
