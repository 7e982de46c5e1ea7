#!/usr/bin/env bash
# Installs the Debian packages braid needs (if missing) and builds it with CMake + Ninja
# into build/. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
# ccache hits across checkouts in different folders (CI clones afresh each time).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
cmake -S . -B build -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 "$@" >/dev/null
cmake --build build
