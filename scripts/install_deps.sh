#!/usr/bin/env bash
# Installs every Debian 12 package braid needs to build, test and benchmark.
# Idempotent: when everything is present it prints nothing and touches nothing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git procps
  # lld links about twice as fast as GNU ld (CMakeLists.txt uses it when present).
  lld
  libucx-dev ucx-utils
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libgflags-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  libopenblas-dev
  python3 python3-dev pybind11-dev python3-numpy python3-pytest python3-sklearn python3-torch
  python3-tqdm dataset-fashion-mnist
  libopenmpi-dev openmpi-bin
  iproute2 openssh-client openssh-server slurm-wlm munge python3-matplotlib dpkg-dev
  bazel-bootstrap bazel-rules-java
  # Job secrets and keyed tags (libcrypto), the tests' TLS certificates, their outsider user.
  libssl-dev openssl passwd
  # The sanitizer and fuzzing builds (scripts/sanitize_test.sh): clang and its runtimes.
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
