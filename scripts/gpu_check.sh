#!/usr/bin/env bash
# braid's GPU check: every CUDA kernel against its CPU implementation (bit-identical where the
# arithmetic is shared), the CUDA device interface, and the kernels' throughputs against a
# device-to-device copy timed in the same run (tests/gpu/gpu_check.cc); then the data planes
# of GPU tensors through the runtime, ranks as threads (tests/gpu/gpu_planes_check.cc): a
# one-rank NCCL all-reduce of every dtype (and 2-4 ranks, one GPU each, where there are
# several GPUs), 2 and 4 ranks on the one GPU over the host-staged
# plane for every compressed method against the host pipeline, and their timings. Two steps:
#
#   scripts/gpu_check.sh --pack   on the build machine: builds the checks (CMake, CUDA on) and
#                                 packs them with the shared libraries they need that a bare
#                                 GPU machine lacks (Abseil, glog; for the planes' check the
#                                 runtime's gRPC, protobuf, UCX) into build/gpu_check/
#   scripts/gpu_check.sh          on the GPU machine, with build/gpu_check/ carried there:
#                                 prints nvidia-smi, the glibc and NCCL versions it finds,
#                                 then runs the checks (a few minutes on an H200)
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
  cmake --build build --target braid-gpu-check braid-gpu-planes-check
  rm -rf "$pack" && mkdir -p "$pack/lib"
  cp build/tests/gpu/braid-gpu-check build/tests/gpu/braid-gpu-planes-check "$pack/"
  # Every library they load but the C and C++ runtimes every Linux machine has.
  ldd "$pack/braid-gpu-check" "$pack/braid-gpu-planes-check" | awk '$3 ~ /^\// {print $3}' |
    sort -u |
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
commit=$(git rev-parse --short HEAD 2>/dev/null || echo 'no git')
echo "== braid-gpu-check ($commit)"
status=0
"$pack/braid-gpu-check" || status=$?
[ "$status" = 77 ] && exit 77  # no GPU: the planes' check would skip too
if [ -x "$pack/braid-gpu-planes-check" ]; then
  echo "== braid-gpu-planes-check ($commit)"
  planes=0
  "$pack/braid-gpu-planes-check" || planes=$?
  [ "$status" = 0 ] && status=$planes
else
  echo "gpu_check: no $pack/braid-gpu-planes-check (packed by an older braid)" >&2
fi
exit "$status"
