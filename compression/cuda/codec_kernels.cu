// The codecs' kernels (codec_kernels.h). Compiled with --fmad=false: the shared arithmetic
// must round as the CPU's does.
#include <cuda_runtime.h>

#include "common/half.h"
#include "compression/codec_math.h"
#include "compression/cuda/codec_kernels.h"
#include "device/cuda/launch.cuh"

namespace braid::compression::cuda {
namespace {

using cuda_launch::Blocks;
using cuda_launch::kThreads;

__global__ void ToHalfKernel(const float* in, size_t n, float divisor, bool bf16,
                             uint16_t* out) {
  BRAID_GRID_STRIDE(i, n) {
    const float v = in[i] / divisor;
    out[i] = bf16 ? FloatToBFloat16(v) : FloatToFloat16(v);
  }
}

__global__ void FromHalfKernel(const uint16_t* in, size_t n, bool bf16, float* out) {
  BRAID_GRID_STRIDE(i, n) { out[i] = bf16 ? BFloat16ToFloat(in[i]) : Float16ToFloat(in[i]); }
}

// One block per chunk: the largest magnitude's bits (an integer max: NaN and infinities
// order above every finite value, as the CPU's MaxAbs reads them), then the scale rule.
__global__ void ChunkScalesKernel(bool int4, const float* x, size_t n, size_t chunk,
                                  float* scales) {
  const size_t c = blockIdx.x;
  const size_t begin = c * chunk;
  const size_t end = begin + chunk < n ? begin + chunk : n;
  uint32_t m = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const uint32_t a = FloatBits(x[i]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint32_t other = __shfl_down_sync(0xffffffffu, m, offset);
    m = other > m ? other : m;
  }
  __shared__ uint32_t warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) m = warp_max[w] > m ? warp_max[w] : m;
    scales[c] = codec::ScaleFromMaxBits(int4, m);
  }
}

// One thread per packed byte: the codes of elements 2j and 2j + 1 of its chunk.
__global__ void Encode4Kernel(bool int4, const float* x, size_t n, size_t chunk,
                              size_t chunk_bytes, size_t bytes, const float* scales,
                              uint32_t seed, uint64_t index0, uint8_t* packed) {
  BRAID_GRID_STRIDE(b, bytes) {
    const size_t c = b / chunk_bytes;
    const size_t e = c * chunk + 2 * (b % chunk_bytes);  // the byte's first element
    const size_t end = c * chunk + chunk < n ? c * chunk + chunk : n;
    const float s = scales[c];
    const uint8_t lo =
        codec::EncodeElement(int4, x[e], s, seed, static_cast<uint32_t>(index0 + e));
    const uint8_t hi = e + 1 < end ? codec::EncodeElement(int4, x[e + 1], s, seed,
                                                          static_cast<uint32_t>(index0 + e + 1))
                                   : 0;
    packed[b] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

__global__ void Decode4Kernel(bool int4, const uint8_t* packed, size_t n, size_t chunk,
                              size_t chunk_bytes, const float* scales, bool add, float* out) {
  BRAID_GRID_STRIDE(e, n) {
    const size_t c = e / chunk;
    const size_t local = e % chunk;
    const uint8_t byte = packed[c * chunk_bytes + local / 2];
    const uint32_t code = local % 2 ? byte >> 4 : byte & 0xfu;
    const float v = int4 ? codec::Int4Value(scales[c], code) : codec::Fp4Value(scales[c], code);
    out[e] = add ? out[e] + v : v;
  }
}

int Launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int LaunchToHalf(const float* in, size_t n, float divisor, bool bf16, uint16_t* out,
                 void* stream) {
  if (n == 0) return 0;
  ToHalfKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, n, divisor,
                                                                              bf16, out);
  return Launched();
}

int LaunchFromHalf(const uint16_t* in, size_t n, bool bf16, float* out, void* stream) {
  if (n == 0) return 0;
  FromHalfKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, n, bf16,
                                                                                out);
  return Launched();
}

int LaunchChunkScales(bool int4, const float* x, size_t n, size_t chunk, float* scales,
                      void* stream) {
  if (n == 0) return 0;
  if (chunk == 0) return static_cast<int>(cudaErrorInvalidValue);
  const size_t chunks = (n + chunk - 1) / chunk;
  if (chunks > 0x7fffffffu) return static_cast<int>(cudaErrorInvalidValue);
  ChunkScalesKernel<<<static_cast<unsigned>(chunks), kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(int4, x, n, chunk, scales);
  return Launched();
}

int LaunchEncode4(bool int4, const float* x, size_t n, size_t chunk, const float* scales,
                  uint32_t seed, uint64_t index0, uint8_t* packed, void* stream) {
  if (n == 0) return 0;
  if (chunk == 0) return static_cast<int>(cudaErrorInvalidValue);
  const size_t chunk_bytes = (chunk + 1) / 2;
  const size_t full = n / chunk, rest = n % chunk;
  const size_t bytes = full * chunk_bytes + (rest + 1) / 2;
  Encode4Kernel<<<Blocks(bytes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      int4, x, n, chunk, chunk_bytes, bytes, scales, seed, index0, packed);
  return Launched();
}

int LaunchDecode4(bool int4, const uint8_t* packed, size_t n, size_t chunk,
                  const float* scales, bool add, float* out, void* stream) {
  if (n == 0) return 0;
  if (chunk == 0) return static_cast<int>(cudaErrorInvalidValue);
  Decode4Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      int4, packed, n, chunk, (chunk + 1) / 2, scales, add, out);
  return Launched();
}

}  // namespace braid::compression::cuda
