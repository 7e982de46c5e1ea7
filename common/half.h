// Scalar float16 / bfloat16 <-> float32 conversions, round to nearest even, NaN preserving.
// Reference implementations: the vector kernels in transport/reduce.cc must agree bit for bit.
// BRAID_HD (__host__ __device__ under nvcc): the CUDA kernels convert with the same code, so
// the GPU's bits are the CPU's.
#ifndef BRAID_COMMON_HALF_H_
#define BRAID_COMMON_HALF_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BRAID_HD __host__ __device__
#else
#define BRAID_HD
#endif

namespace braid {

BRAID_HD inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#elif defined(__GNUC__)
  return __builtin_bit_cast(uint32_t, f);  // a memcpy would keep GCC from vectorizing loops
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
BRAID_HD inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#elif defined(__GNUC__)
  return __builtin_bit_cast(float, u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

BRAID_HD inline float BFloat16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

BRAID_HD inline uint16_t FloatToBFloat16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// IEEE binary16 -> float32 (exact).
BRAID_HD inline float Float16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return BitsToFloat(bits);
}

// float32 -> IEEE binary16, round to nearest even, overflow to infinity.
BRAID_HD inline uint16_t FloatToFloat16(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  // NaN: quieted, its payload's top 9 bits kept, as F16C's vcvtps2ph does (so the scalar
  // path, the vector paths and the GPU give the same bits for every NaN).
  if (abs > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {                                // below 2^-14: subnormal or zero
    if (abs < 0x33000000u) return sign;                   // below 2^-25 rounds to zero
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp-150) and the subnormal unit is 2^-24: result = mant >> (126 - exp).
    uint32_t shift = 126 - exp;
    uint32_t result = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);   // round mantissa to 10 bits
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

}  // namespace braid

#endif  // BRAID_COMMON_HALF_H_
