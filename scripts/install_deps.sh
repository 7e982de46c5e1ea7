#!/usr/bin/env bash
# Installs the Debian 12 packages braid needs.
#
#   scripts/install_deps.sh            the library, its tools and examples (scripts/build.sh)
#   scripts/install_deps.sh --tests    the same, and what the tests and benchmarks need
#                                      (scripts/test.sh): Slurm, munge, an OpenSSH server,
#                                      Open MPI, Bazel, clang, GoogleTest, ...
#   scripts/install_deps.sh --list [--tests]   prints the package names, installs nothing
#
# The library's set starts no daemon; the test set does (sshd and munged come with their
# packages), which is why it is kept apart. Idempotent: when everything is present it prints
# nothing and touches nothing.
set -euo pipefail

# The library, braidrun/braidctl/braid-coordinator, the Python package and both examples.
LIBRARY_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git procps
  # lld links about twice as fast as GNU ld (CMakeLists.txt uses it when present).
  lld
  libucx-dev ucx-utils
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libgflags-dev
  libcli11-dev nlohmann-json3-dev
  libopenblas-dev
  # Job secrets and the data plane's keyed tags (libcrypto); openssl makes a secret
  # (`openssl rand -hex 32`, as braidrun's refusal of a weak one advises).
  libssl-dev openssl
  python3 python3-dev pybind11-dev python3-numpy python3-torch python3-tqdm python3-sklearn
  # PyTorch's C++ headers and libraries: the `braid` torch.distributed backend (a C++
  # extension against c10d's ProcessGroup) builds against them.
  libtorch-dev
  dataset-fashion-mnist
  # The language-model example's corpus: the King James Bible and its reader, `bible`.
  bible-kjv
  # braidrun starts the ranks of other hosts over ssh (the client only).
  openssh-client
  # The Debian package (cmake --build build --target package): CPack's DEB generator runs
  # dpkg-shlibdeps (dpkg-dev) and file.
  dpkg-dev file
)

# The tests, the sanitizer and fuzzing builds, the Bazel build and the benchmarks.
TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev python3-pytest python3-matplotlib
  libopenmpi-dev openmpi-bin
  # Test hosts (network namespaces), jobs across them over ssh, and under Slurm.
  iproute2 openssh-server slurm-wlm munge
  bazel-bootstrap bazel-rules-java
  # The tests' outsider user.
  passwd
  # The sanitizer and fuzzing builds (scripts/sanitize_test.sh): clang and its runtimes.
  clang libclang-rt-14-dev
)

tests=0 list=0
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "install_deps: unknown argument '$arg' (--tests, --list)" >&2; exit 2 ;;
  esac
done
PACKAGES=("${LIBRARY_PACKAGES[@]}")
[ "$tests" -eq 1 ] && PACKAGES+=("${TEST_PACKAGES[@]}")
if [ "$list" -eq 1 ]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi

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
