#!/usr/bin/env bash
# braid installed into a temporary prefix P (`cmake --install BUILD --prefix P`):
#   - nothing is installed outside P; README.md and the user guide (docs/) are in P's doc dir;
#   - a C program built with find_package(braid), and one built with pkg-config, run a
#     2-rank job under P's braidrun, with every element right;
#   - the Python package is imported from P (P's braidrun puts it on the ranks' PYTHONPATH)
#     and runs a 2-rank all-reduce.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
for tool in cmake ninja cc pkg-config ldd; do
  command -v "$tool" >/dev/null || { echo "install_test: '$tool' not found (scripts/install_deps.sh)" >&2; exit 1; }
done
tmp=$(mktemp -d -t braid-install-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log"
outside=$(grep -E '^-- (Installing|Up-to-date): ' "$tmp/install.log" | grep -v -- ": $prefix/" || true)
[ -z "$outside" ] || fail "installed outside the prefix: $outside"
for f in bin/braidrun bin/braidctl bin/braid-coordinator include/braid/c_api.h \
         lib/libbraid_c.so.1 lib/cmake/braid/braidConfig.cmake lib/pkgconfig/braid.pc \
         lib/python3.11/dist-packages/braid/__init__.py lib/python3.11/dist-packages/braid/torch/__init__.py \
         share/doc/braid/README.md share/doc/braid/docs/configuration.md; do
  [ -e "$prefix/$f" ] || fail "missing $prefix/$f"
done

# Jobs run with the installed braidrun only: no build tree on PYTHONPATH, no braid on PATH.
run_job() { env -u PYTHONPATH UCX_TLS=sm "$prefix/bin/braidrun" -np 2 --timeout 60 "$@"; }

# find_package(braid)
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DBRAID_EXAMPLE="$src/examples/c/allreduce_blocking.c" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
libs=$(ldd "$tmp/consumer/allreduce_blocking")
grep -q "libbraid_c.so.1 => $prefix/lib/libbraid_c.so.1" <<<"$libs" \
  || fail "the find_package program does not load the installed libbraid_c: $libs"
out=$(run_job "$tmp/consumer/allreduce_blocking")
[ "$(grep -c '; 0 wrong$' <<<"$out")" = 2 ] || fail "find_package program: $out"
echo "find_package(braid): $out"

# pkg-config
PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --exists braid || fail "pkg-config does not find braid"
# shellcheck disable=SC2046
cc -std=c11 -o "$tmp/pc_example" "$src/examples/c/allreduce_blocking.c" \
  $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs braid) -lm
out=$(run_job "$tmp/pc_example")
[ "$(grep -c '; 0 wrong$' <<<"$out")" = 2 ] || fail "pkg-config program: $out"
echo "pkg-config: $out"

# The Python package, from the prefix.
out=$(run_job /usr/bin/python3 -c "
import numpy as np, braid
assert braid.__file__.startswith('$prefix/'), braid.__file__
braid.init()
x = braid.allreduce(np.full(1000, braid.rank() + 1, np.float32), name='x', op=braid.Sum)
assert (x == 3).all(), x[:4]
print('python ok', braid.__file__)
braid.shutdown()")
[ "$(grep -c 'python ok' <<<"$out")" = 2 ] || fail "python: $out"
echo "python: $out"
echo "install_test: OK"
