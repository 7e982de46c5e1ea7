// 4-bit codecs of the compression stage: radix-4 FP4 with per-chunk GradScale, and INT4.
//
// After Sun et al., "Ultra-Low Precision 4-bit Training of Deep Neural Networks" (NeurIPS
// 2020): gradients survive a radix-4 FP4 format (1 sign bit, 3 exponent bits, no mantissa)
// when each group of values is scaled adaptively (GradScale). Here the format is used on the
// wire, one scale per chunk of `chunk` elements (default 128).
//
// FP4 code c (4 bits): bit 3 = sign, bits 0-2 = m. m = 0 is zero (always encoded with sign 0);
// m = 1..7 is the level s·4^(m-7), i.e. s·4^-6 ... s·4^0, where s is the chunk's scale.
// Scale rule (GradScale): s = 2^ceil(log2(max|x|)), the smallest power of two >= the chunk's
// largest magnitude, so max|x| lies in (s/2, s] — inside the top interval (s/4, s]. A chunk
// of zeros has s = 0; a chunk holding a NaN or an infinity has s = NaN and decodes to NaN
// (a broken gradient stays visibly broken, never silently finite), and so does a chunk whose
// largest magnitude exceeds 2^127, for which no power-of-two scale exists in float32.
//
// INT4 code c: the two's complement nibble of q in -7..7 (code 8 = -8 is never produced); the
// value is q·s with s = max|x| / 7 (float32), the same non-finite rule.
//
// Rounding is stochastic and unbiased: x between adjacent levels lo <= |x| <= hi rounds to hi
// with probability (|x| - lo) / (hi - lo), so E[decode(encode(x))] = x, and the result is
// always lo or hi. The uniform draw for element i is a counter-based hash of (seed, i), so a
// given (seed, data) always encodes to the same bytes on any machine.
//
// Error bound of one quantization, element-wise: |q(x) - x| < hi - lo, the spacing of the
// grid around x. FP4: hi - lo = 3·lo <= 3·|x| when |x| >= s·4^-6, else s·4^-6; in every case
// at most (3/4)·s <= (3/2)·max|chunk|. INT4: at most s = max|chunk| / 7.
//
// Packing: two codes per byte, element 2i in the low nibble and element 2i+1 in the high
// nibble; a chunk of odd length leaves its last high nibble zero.
#ifndef BRAID_COMPRESSION_QUANTIZE_H_
#define BRAID_COMPRESSION_QUANTIZE_H_

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

namespace braid::compression {

enum class FourBitFormat { kFp4, kInt4 };

// Number of bytes `count` packed 4-bit codes occupy: ceil(count / 2).
inline size_t PackedBytes(size_t count) { return (count + 1) / 2; }

// The per-chunk scale rule above, for the chunk x[0..count).
float ChunkScale(FourBitFormat format, const float* x, size_t count);

// The 16 values codes 0..15 decode to under `scale` (NaN scale: all NaN).
void DecodeTable(FourBitFormat format, float scale, float table[16]);

// Encodes x[0..count) under `scale` (normally ChunkScale(x)) into PackedBytes(count) bytes at
// `packed`. Element i draws its uniform from (seed, index0 + i).
void Encode(FourBitFormat format, const float* x, size_t count, float scale, uint32_t seed,
            uint64_t index0, uint8_t* packed);

// out[i] = value of code i of `packed` under `scale`, for i < count.
void Decode(FourBitFormat format, const uint8_t* packed, size_t count, float scale, float* out);
// out[i] += value of code i (the decode-and-sum step of the 4-bit all-reduce).
void DecodeAdd(FourBitFormat format, const uint8_t* packed, size_t count, float scale,
               float* out);

// Splits and joins nibbles: codes[i] (0..15) <-> packed bytes as described above.
void PackCodes(const uint8_t* codes, size_t count, uint8_t* packed);
void UnpackCodes(const uint8_t* packed, size_t count, uint8_t* codes);

// false: only the portable kernels (tests compare them with the AVX2 ones, which must give the
// same bytes and values). Not thread-safe; default true.
void UseVectorKernels(bool enabled);

// The uniform in [0, 1) element `index` draws under `seed` (24 bits of a murmur3 finaliser).
float UniformDraw(uint32_t seed, uint64_t index);

// Stable 64-bit mix used to derive seeds (splitmix64's finaliser). Hand-rolled because the
// seeds must be identical across processes and runs; absl::Hash is salted per process.
uint64_t Mix64(uint64_t x);
// FNV-1a of a tensor name, for the same reason.
uint64_t NameHash(absl::string_view name);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_QUANTIZE_H_
