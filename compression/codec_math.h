// The per-element arithmetic of the 4-bit codecs (compression/quantize.h), written once for
// the CPU and the GPU (BRAID_HD: __host__ __device__ under nvcc), so the CUDA kernels encode
// and decode the same bits as the CPU for the same (seed, data). The CPU's vector kernels
// (AVX2) repeat it lane for lane and are tested against it. Exactness: every operation here
// is exact or correctly rounded (IEEE division, no fused multiply-add: the CUDA sources are
// compiled with --fmad=false), so both sides agree bit for bit.
#ifndef BRAID_COMPRESSION_CODEC_MATH_H_
#define BRAID_COMPRESSION_CODEC_MATH_H_

#include <cmath>
#include <cstdint>

#include "common/half.h"  // BRAID_HD, FloatBits, BitsToFloat

namespace braid::codec {

// murmur3's 32-bit finaliser.
BRAID_HD inline uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// The uniform in [0, 1) element `index` draws under `seed`: 24 bits of Fmix32 of
// index·golden + seed (mod 2^32).
BRAID_HD inline float Uniform(uint32_t seed, uint32_t index) {
  return static_cast<float>(Fmix32(index * 0x9E3779B9u + seed) >> 8) * (1.0f / 16777216.0f);
}

// The FP4 code of v under a power-of-two scale s in [2^-125, 2^125] (inv_s = 1 / s, exact),
// rounding up with probability r when the draw u < r (quantize.h). Branch-free integer and
// select arithmetic on the float bits, so GCC vectorizes the loops that call it.
BRAID_HD inline uint8_t Fp4Code(float v, float inv_s, float u) {
  const float t = std::fabs(v) * inv_s;  // in [0, 1]
  const uint32_t tb = FloatBits(t);
  const int32_t e = static_cast<int32_t>(tb >> 23) - 127;  // floor(log2 t)
  const int32_t k = e >> 1;                                // floor(log4 t), lo = 4^k
  // t / lo = 1.mantissa * 2^(e - 2k), in [1, 4): set t's exponent to e - 2k = e & 1.
  const float y =
      BitsToFloat((tb & 0x007fffffu) | (static_cast<uint32_t>(127 + (e & 1)) << 23));
  const bool small = e < -12;  // t < 4^-6: between 0 and the smallest level
  // Where t lies between its neighbouring levels lo and hi = 4·lo, in [0, 1).
  const float r_small = t * 4096.0f;
  const float r_big = (y - 1.0f) * (1.0f / 3.0f);
  const float r = small ? r_small : r_big;
  const int32_t m_lo = small ? 0 : 7 + k;
  int32_t m = m_lo + (u < r ? 1 : 0);
  m = m > 7 ? 7 : m;
  const int32_t sign = v < 0.0f ? 8 : 0;
  return static_cast<uint8_t>(m == 0 ? 0 : (sign | m));
}

// The INT4 code of v under a finite scale s > 0.
BRAID_HD inline uint8_t Int4Code(float v, float s, float u) {
  float t = v / s;
  t = t > 7.0f ? 7.0f : (t < -7.0f ? -7.0f : t);
  const float lo = std::floor(t);
  const float r = t - lo;
  int32_t q = static_cast<int32_t>(lo) + (u < r ? 1 : 0);
  q = q > 7 ? 7 : q;
  return static_cast<uint8_t>(static_cast<uint32_t>(q) & 0xfu);
}

// The code element `index` of a chunk gets under `scale` (the chunk's ChunkScale) and
// `seed`, as quantize.h's Encode writes it: 0 for a zero or non-finite scale; a tiny FP4
// scale (below 2^-100, whose inverse would overflow) scales the value and the scale up by
// 2^100 first, which is exact and changes no code.
BRAID_HD inline uint8_t EncodeElement(bool int4, float x, float scale, uint32_t seed,
                                      uint32_t index) {
  if (!(scale > 0.0f) || FloatBits(scale) == 0x7f800000u) return 0;
  const float u = Uniform(seed, index);
  if (int4) return Int4Code(x, scale, u);
  if (scale < 0x1p-100f) return Fp4Code(x * 0x1p100f, 1.0f / (scale * 0x1p100f), u);
  return Fp4Code(x, 1.0f / scale, u);
}

// The value code c (0..15) decodes to under `scale` (quantize.h; a NaN scale gives NaN).
BRAID_HD inline float Fp4Value(float scale, uint32_t c) {
  // 4^(m-7) for m = 1..7 as exponent bits (m = 0: zero); a power of two times the scale
  // rounds exactly like ldexp.
  const uint32_t m = c & 7u;
  const float level = m == 0 ? 0.0f : BitsToFloat((127u - 14u + 2u * m) << 23);
  const float v = scale * level;
  return (c & 8u) && m != 0 ? -v : v;  // code 8 (negative zero) decodes as zero
}
BRAID_HD inline float Int4Value(float scale, uint32_t c) {
  return static_cast<float>(static_cast<int32_t>(c ^ 8u) - 8) * scale;
}

// The smallest power of two >= m, for finite m > 0 (what frexp + ldexp give).
BRAID_HD inline float PowerOfTwoCeil(float m) {
  const uint32_t b = FloatBits(m);
  if (b < 0x00800000u) {  // subnormal: rare, left to the library
    int e = 0;
    const float f = std::frexp(m, &e);
    return f == 0.5f ? m : std::ldexp(1.0f, e);
  }
  if ((b & 0x007fffffu) == 0) return m;                  // a power of two already
  return BitsToFloat((b & 0x7f800000u) + 0x00800000u);  // next exponent, mantissa 0 (or +inf)
}

// A chunk's scale from the bits of its largest magnitude, max_bits = max(bits(|x|))
// (quantize.h's rule): NaN for a NaN or infinity (max_bits >= 0x7f800000) or for a chunk no
// float32 power of two holds; 0 for zeros; max/7 for INT4.
BRAID_HD inline float ScaleFromMaxBits(bool int4, uint32_t max_bits) {
  const float nan = BitsToFloat(0x7fc00000u);
  if (max_bits >= 0x7f800000u) return nan;
  const float m = BitsToFloat(max_bits);
  if (m == 0.0f) return 0.0f;
  if (int4) return m / 7.0f;
  const float s = PowerOfTwoCeil(m);
  return FloatBits(s) == 0x7f800000u ? nan : s;
}

}  // namespace braid::codec

#endif  // BRAID_COMPRESSION_CODEC_MATH_H_
