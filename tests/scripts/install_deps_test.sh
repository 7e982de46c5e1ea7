#!/usr/bin/env bash
# scripts/install_deps.sh: the library's set (scripts/build.sh) installs no daemon and none of
# the test machinery; --tests adds it; the package build's tools are in the library's set.
# Usage: install_deps_test.sh SOURCE_DIR
set -uo pipefail
deps="$1/scripts/install_deps.sh"
fail() { echo "install_deps_test: $*" >&2; exit 1; }
lib=$("$deps" --list) || fail "--list failed"
all=$("$deps" --list --tests) || fail "--list --tests failed"
has() { grep -qx "$2" <<<"$1"; }
for p in openssh-server slurm-wlm slurmd munge bazel-bootstrap clang openmpi-bin \
         libgtest-dev python3-pytest; do
  has "$lib" "$p" && fail "the library's set installs $p"
  [ "$p" = slurmd ] || has "$all" "$p" || fail "--tests does not install $p"
done
# What the main job, the language-model example and the package build need.
for p in python3-torch dataset-fashion-mnist bible-kjv libucx-dev libgrpc++-dev dpkg-dev file \
         openssh-client; do
  has "$lib" "$p" || fail "the library's set lacks $p"
done
# --tests is a superset.
while read -r p; do has "$all" "$p" || fail "--tests drops $p"; done <<<"$lib"
"$deps" --bogus >/dev/null 2>&1 && fail "an unknown argument was accepted"
# Every name is a Debian package (a typo would fail a fresh machine's install only).
if command -v apt-cache >/dev/null; then
  # shellcheck disable=SC2086  (one name a word)
  missing=$(apt-cache show $all 2>&1 >/dev/null | grep -E "^[EN]:") && fail "$missing"
fi
echo "install_deps_test: passed"
