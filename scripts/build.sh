#!/usr/bin/env bash
# Installs the Debian packages braid needs (if missing) and builds it with CMake + Ninja
# into build/. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
# ccache hits across checkouts in different folders (CI clones afresh each time).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
configured=$(cmake -S . -B build -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 "$@")
# Of the configure step's output, the one line a user needs: whether CUDA is on, and why.
grep -m1 "braid: CUDA is" <<<"$configured" || true
cmake --build build
