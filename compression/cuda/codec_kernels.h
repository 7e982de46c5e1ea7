// The compression codecs' CUDA kernels: fp16/bf16 casts and the 4-bit codecs (quantize.h),
// whose per-element arithmetic is the CPU's own (common/half.h, compression/codec_math.h,
// compiled for both), so a GPU encodes the same bits as the CPU for the same (seed, data).
// Plain declarations (no CUDA types); each launches on `stream` (a cudaStream_t; null: the
// default stream) and returns the launch's cudaError_t as an int (0: launched).
//
// A tensor's 4-bit layout here: x[0..n) in chunks of `chunk` elements (the last one shorter),
// chunk c's scale at scales[c] and its PackedBytes codes at packed + c·PackedBytes(chunk)
// (quantize.h's packing: element 2i in the low nibble). Element i draws its uniform from
// (seed, index0 + i), as the CPU's Encode of each chunk with index0 + the chunk's start.
#ifndef BRAID_COMPRESSION_CUDA_CODEC_KERNELS_H_
#define BRAID_COMPRESSION_CUDA_CODEC_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace braid::compression::cuda {

// out[i] = half(in[i] / divisor): bfloat16 when `bf16`, else float16 (ToHalf's bits).
int LaunchToHalf(const float* in, size_t n, float divisor, bool bf16, uint16_t* out,
                 void* stream);
// out[i] = float(in[i]) (exact; FromHalf's bits).
int LaunchFromHalf(const uint16_t* in, size_t n, bool bf16, float* out, void* stream);
// scales[c] = ChunkScale of chunk c (quantize.h's rule), for every chunk of x[0..n).
int LaunchChunkScales(bool int4, const float* x, size_t n, size_t chunk, float* scales,
                      void* stream);
// The codes of every chunk under its scale: Encode's bytes.
int LaunchEncode4(bool int4, const float* x, size_t n, size_t chunk, const float* scales,
                  uint32_t seed, uint64_t index0, uint8_t* packed, void* stream);
// out[i] = the value of element i's code, or out[i] + that value when `add`: Decode's and
// DecodeAdd's values.
int LaunchDecode4(bool int4, const uint8_t* packed, size_t n, size_t chunk,
                  const float* scales, bool add, float* out, void* stream);

}  // namespace braid::compression::cuda

#endif  // BRAID_COMPRESSION_CUDA_CODEC_KERNELS_H_
