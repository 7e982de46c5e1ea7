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
        cmd = (NVCC + " -std=c++17 -O2 --fmad=false -arch=sm_90 -Xcompiler -fPIC " +
               "-I. -c $(location " + src + ") -o $@"),
        tags = ["manual"],
    )
