#!/usr/bin/env bash
# braid's GPU check: every CUDA kernel against its CPU implementation (bit-identical where the
# arithmetic is shared), the CUDA device interface, and the kernels' throughputs against a
# device-to-device copy timed in the same run (tests/gpu/gpu_check.cc). Two steps:
#
#   scripts/gpu_check.sh --pack   on the build machine: builds the check (CMake, CUDA on) and
#                                 packs it with the shared libraries it needs that a bare
#                                 GPU machine lacks (Abseil, glog) into build/gpu_check/
#   scripts/gpu_check.sh          on the GPU machine, with build/gpu_check/ carried there:
#                                 prints nvidia-smi, the glibc and NCCL versions it finds,
#                                 then runs the check (under a minute on an H200)
#
# The check needs only the NVIDIA driver there: the CUDA runtime is linked statically, and
# cuBLAS and NCCL, when a check uses them, come from that machine's Python packages
# (nvidia-cublas, nvidia-nccl-cu13), whose lib/ folders this script finds. Exit status: the
# check's (0 passed, 1 a check failed, 77 no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
pack=build/gpu_check

if [ "${1:-}" = "--pack" ]; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
  cmake -S . -B build -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 -DBRAID_CUDA=ON >/dev/null
  cmake --build build --target braid-gpu-check
  rm -rf "$pack" && mkdir -p "$pack/lib"
  cp build/tests/gpu/braid-gpu-check "$pack/"
  # Every library it loads but the C and C++ runtimes every Linux machine has.
  ldd "$pack/braid-gpu-check" | awk '$3 ~ /^\// {print $3}' |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    xargs -r cp -L -t "$pack/lib/"
  echo "gpu_check: packed $(du -sh "$pack" | cut -f1) into $pack (carry it to the GPU machine)"
  exit 0
fi

[ -x "$pack/braid-gpu-check" ] || {
  echo "gpu_check: no $pack/braid-gpu-check: run scripts/gpu_check.sh --pack first" >&2
  exit 2
}
echo "== nvidia-smi"
nvidia-smi 2>&1 || echo "(nvidia-smi failed)"
echo "== glibc: $(ldd --version 2>&1 | head -1)"
# The Python packages' library folders (nvidia/<name>/lib), when they are installed.
python=$(command -v python3 || true)
libs=""
find_lib='import importlib, os, sys
m = importlib.import_module("nvidia." + sys.argv[1])
print(os.path.join((list(getattr(m, "__path__", [])) or [os.path.dirname(m.__file__)])[0], "lib"))'
for name in cublas nccl cuda_runtime; do
  dir=""
  if [ -n "$python" ]; then dir=$("$python" -c "$find_lib" "$name" 2>/dev/null || true); fi
  if [ -n "$dir" ] && [ -d "$dir" ]; then libs="$libs:$dir"; fi
done
nccl=$(ls ${libs//:/ } 2>/dev/null | grep -m1 -o 'libnccl.so[.0-9]*' || true)
torch_nccl=""
if [ -n "$python" ]; then
  torch_nccl=$("$python" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' \
               2>/dev/null || true)
fi
echo "== NCCL: ${nccl:-no library found}${torch_nccl:+ (torch reports $torch_nccl)}"
echo "== library path: $pack/lib$libs"
export LD_LIBRARY_PATH="$PWD/$pack/lib$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== braid-gpu-check ($(git rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
exec "$pack/braid-gpu-check"
