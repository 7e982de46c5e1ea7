#!/usr/bin/env bash
# The Debian package (CPack's DEB generator, cmake/packaging.cmake) builds from BUILD_DIR,
# holds what `cmake --install` installs (under /usr), declares the Debian packages braid
# needs at run time, and its braidrun runs a job once unpacked.
# Usage: deb_test.sh BUILD_DIR
set -euo pipefail
build=$(realpath "$1")
for tool in cpack dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || { echo "deb_test: '$tool' not found (apt install cmake dpkg-dev)" >&2; exit 1; }
done
tmp=$(mktemp -d -t braid-deb-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }

(cd "$tmp" && cpack -G DEB --config "$build/CPackConfig.cmake" >cpack.log 2>&1) \
  || { cat "$tmp/cpack.log" >&2; fail "cpack failed"; }
deb=$(ls "$tmp"/braid_*_amd64.deb 2>/dev/null) || fail "no braid_*_amd64.deb: $(cat "$tmp/cpack.log")"
echo "deb_test: built $(basename "$deb") ($(stat -c %s "$deb") bytes)"

files=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/braidrun ./usr/bin/braidctl ./usr/bin/braid-coordinator ./usr/bin/braid-bench \
         ./usr/include/braid/c_api.h ./usr/lib/libbraid_c.so.1 ./usr/lib/cmake/braid/braidConfig.cmake \
         ./usr/lib/pkgconfig/braid.pc ./usr/lib/python3.11/dist-packages/braid/__init__.py \
         ./usr/lib/python3.11/dist-packages/braid/torch/optimizer.py \
         ./usr/share/doc/braid/README.md ./usr/share/doc/braid/docs/configuration.md; do
  grep -qxF "$f" <<<"$files" || fail "the package lacks $f"
done
depends=$(dpkg-deb -f "$deb" Depends)
for d in libucx0 libgrpc++1.51 python3-numpy openssh-client libopenblas0; do
  grep -q "$d" <<<"$depends" || fail "Depends lacks $d: $depends"
done
echo "deb_test: Depends: $depends"

dpkg-deb -x "$deb" "$tmp/root"
out=$(env -u PYTHONPATH "$tmp/root/usr/bin/braidrun" -np 2 /bin/sh -c 'echo rank $BRAID_RANK') \
  || fail "the packaged braidrun failed: $out"
[ "$(grep -c '^\[[01]\] rank [01]$' <<<"$out")" = 2 ] || fail "the packaged braidrun: $out"
echo "deb_test: OK"
