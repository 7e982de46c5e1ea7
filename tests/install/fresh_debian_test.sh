#!/usr/bin/env bash
# The library's install on a fresh, minimal Debian 12: in a debootstrap --variant=minbase
# chroot, `scripts/build.sh` (the library's packages only) installs no SSH server, Slurm,
# munge or other test machinery and starts no daemon, builds, runs the main job (2 ranks,
# 1 epoch), and builds the Debian package. Not part of the test command (about 6-10 minutes
# on 2 cores, and a download of the packages): run it by hand, as root, when the package
# lists change (docs/testing.md).
#
# Usage: tests/install/fresh_debian_test.sh [MIRROR]   (default: the host's first Debian
#        mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list)
set -euo pipefail
src=$(realpath "$(dirname "$0")/../..")
[ "$(id -u)" -eq 0 ] || { echo "fresh_debian_test: needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null ||
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends debootstrap >/dev/null
mirror=${1:-$({ cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } |
              awk '$1 == "URIs:" && $2 ~ /debian\/?$/ { print $2; exit }
                   $1 == "deb" && $2 ~ /debian\/?$/ { print $2; exit }')}
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d -t braid-fresh-debian.XXXXXX)
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
  if ! mount | grep -q " $root"; then rm -rf "$root"; fi
}
trap cleanup EXIT
step() { echo "fresh_debian_test: $* ($(date +%T))"; }

step "debootstrap --variant=minbase bookworm from $mirror"
debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
# The host's apt sources (security updates included) replace debootstrap's one line.
if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
elif [ -f /etc/apt/sources.list ]; then
  cp /etc/apt/sources.list "$root/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q "$src" "$root/root/braid"
for m in /proc /sys /dev /dev/pts /dev/shm; do
  mount --bind "$m" "$root$m"
  mounts+=("$root$m")
done
in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin bash -c "$1"; }

step "scripts/build.sh"
in_root "cd /root/braid && scripts/build.sh"
step "no test machinery, no daemon"
for p in openssh-server slurm-wlm slurmd munge bazel-bootstrap clang openmpi-bin; do
  if in_root "dpkg-query -W -f='\${Status}' $p 2>/dev/null | grep -q 'install ok installed'"; then
    echo "fresh_debian_test: scripts/build.sh installed $p" >&2
    exit 1
  fi
done
if in_root "pgrep -x sshd || pgrep -x munged || pgrep -x slurmd"; then
  echo "fresh_debian_test: a daemon runs in the fresh system" >&2
  exit 1
fi
step "the main job, 2 ranks, 1 epoch"
in_root "cd /root/braid && build/tools/braidrun/braidrun -np 2 /usr/bin/python3 \
  examples/train_fashion_mnist.py --epochs 1 --no-progress" | tail -n 3
step "the Debian package"
in_root "cd /root/braid && cmake --build build --target package >/dev/null && ls build/*.deb"
step "passed"
