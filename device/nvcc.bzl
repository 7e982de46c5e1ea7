"""nvcc in a genrule: Bazel 4 has no CUDA rules (the CMake build is the primary one).

nvcc_object compiles one .cu file into a position-independent object for a cc_library's
srcs, for Hopper (sm_90), without fused multiply-add (braid's CUDA arithmetic must round as
the CPU's does: compression/codec_math.h). Built only where asked (--config=cuda): tagged
manual, so `bazel build //...` on a machine without nvcc never reaches it.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

def nvcc_object(name, src, hdrs = []):
    native.genrule(
        name = name,
        srcs = [src] + hdrs,
        outs = [name + ".o"],
        # A temporary folder of its own: nvcc names its temporary files by process id, and
        # every sandboxed nvcc is process 2 of its namespace while /tmp is shared, so
        # parallel nvcc runs would read each other's files.
        cmd = ("tmp=$$(mktemp -d) && TMPDIR=$$tmp " + NVCC +
               " -std=c++17 -O2 --fmad=false -arch=sm_90 -Xcompiler -fPIC " +
               "-I. -c $(location " + src + ") -o $@; rc=$$?; rm -rf $$tmp; exit $$rc"),
        tags = ["manual"],
    )
