// common/half.h against independent references: exact decoding by ldexp, GCC's _Float16
// conversions (round to nearest even, done by libgcc or constant folding), the F16C
// instructions where the CPU has them, and a bfloat16 rounding derived in double.
#include "common/half.h"

#include <gtest/gtest.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace braid {
namespace {

bool IsHalfNaN(uint16_t h) { return (h & 0x7fff) > 0x7c00; }
bool IsBFloat16NaN(uint16_t h) { return (h & 0x7fff) > 0x7f80; }

uint16_t CompilerFloatToHalf(float f) {
  volatile float v = f;  // keep the conversion out of constant folding
  _Float16 h = static_cast<_Float16>(v);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float CompilerHalfToFloat(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  volatile _Float16 v = h;
  return static_cast<float>(v);
}

__attribute__((target("f16c"))) uint16_t F16cFloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float F16cHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
bool HaveF16c() { return __builtin_cpu_supports("f16c"); }

// binary16 decoded from its definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
double DecodeHalf(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    mag = mant == 0 ? std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::quiet_NaN();
  } else {
    mag = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return sign ? -mag : mag;
}

// Compares half.h's FloatToFloat16 with every reference available; NaN only has to stay NaN
// with its sign.
void ExpectFloatToHalf(float f) {
  const uint16_t got = FloatToFloat16(f);
  if (std::isnan(f)) {
    EXPECT_TRUE(IsHalfNaN(got)) << std::hex << FloatBits(f) << " -> " << got;
    EXPECT_EQ(got >> 15, FloatBits(f) >> 31);
    return;
  }
  ASSERT_EQ(got, CompilerFloatToHalf(f)) << std::hexfloat << f << " bits " << std::hex
                                         << FloatBits(f);
  if (HaveF16c()) {
    ASSERT_EQ(got, F16cFloatToHalf(f)) << std::hexfloat << f;
  }
}

TEST(Float16, DecodesEveryPatternExactly) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = Float16ToFloat(h);
    if (IsHalfNaN(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h >> 15) != 0) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), DecodeHalf(h)) << std::hex << h;
    ASSERT_EQ(FloatBits(f), FloatBits(CompilerHalfToFloat(h))) << std::hex << h;
    if (HaveF16c()) {
      ASSERT_EQ(FloatBits(f), FloatBits(F16cHalfToFloat(h))) << std::hex << h;
    }
    // -0 keeps its sign.
    if (h == 0x8000) {
      EXPECT_TRUE(std::signbit(f));
    }
  }
}

TEST(Float16, EveryPatternRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t back = FloatToFloat16(Float16ToFloat(h));
    if (IsHalfNaN(h)) {
      EXPECT_TRUE(IsHalfNaN(back)) << std::hex << h << " -> " << back;
    } else {
      ASSERT_EQ(back, h);
    }
  }
}

TEST(Float16, EdgeValues) {
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFloat16(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // 65519.996
  EXPECT_EQ(FloatToFloat16(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00);  // tie, 0x7bff is odd: rounds to infinity
  EXPECT_EQ(FloatToFloat16(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToFloat16(65536.0f), 0x7c00);
  EXPECT_EQ(FloatToFloat16(1e30f), 0x7c00);
  EXPECT_EQ(FloatToFloat16(INFINITY), 0x7c00);
  EXPECT_EQ(FloatToFloat16(-INFINITY), 0xfc00);
  EXPECT_EQ(FloatToFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(FloatToFloat16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(FloatToFloat16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToFloat16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie, to even 2
  EXPECT_EQ(FloatToFloat16(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 ulp: tie, to even 2
  EXPECT_EQ(FloatToFloat16(std::ldexp(1023.5f, -24)), 0x0400);  // tie into the smallest normal
  EXPECT_EQ(FloatToFloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, to even
  EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, to even
  EXPECT_TRUE(IsHalfNaN(FloatToFloat16(NAN)));
  for (float f : {65504.0f, 65519.99f, 65520.0f, std::nextafter(65520.0f, 0.0f), 65536.0f,
                  std::ldexp(1.0f, -14), std::ldexp(1.0f, -25), std::ldexp(1.0f, -26)}) {
    ExpectFloatToHalf(f);
    ExpectFloatToHalf(-f);
  }
}

// Rounding decisions in detail: around every half value, floats just below, at and just above
// the tie with the next half, and a quarter of the way.
TEST(Float16, TiesAroundEveryHalf) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = Float16ToFloat(static_cast<uint16_t>(h));
    const float hi = h + 1 == 0x7c00 ? 65536.0f : Float16ToFloat(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: a float has more precision
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                    lo + (hi - lo) / 4, hi - (hi - lo) / 4}) {
      ExpectFloatToHalf(f);
      ExpectFloatToHalf(-f);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Float16, MillionsOfRandomFloats) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 4'000'000; ++i) {
    uint32_t bits = rng();
    if (i % 2 == 0) {
      // Exponents from 2^-27 to 2^17: subnormal halves, all normals, overflow.
      const uint32_t exp = 100 + bits % 45;
      bits = (bits & 0x807fffffu) | (exp << 23);
    }
    ExpectFloatToHalf(BitsToFloat(bits));
    if (HasFatalFailure()) return;
  }
}

// ---- bfloat16 ----

// Round to nearest even to 8 significant bits, derived in double from the two neighbouring
// bfloat16 values (the value above the largest finite one is 2^128, which means infinity).
uint16_t ReferenceBFloat16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint16_t lo = static_cast<uint16_t>((u >> 16) & 0x7fff);  // truncated magnitude
  const double x = std::fabs(static_cast<double>(f));
  const double dlo = std::fabs(static_cast<double>(BFloat16ToFloat(lo)));
  const double dhi = lo == 0x7f7f ? std::ldexp(1.0, 128)
                                  : static_cast<double>(BFloat16ToFloat(lo + 1));
  if (x == dlo) return sign | lo;
  const double below = x - dlo, above = dhi - x;
  const bool up = above < below || (above == below && (lo & 1));
  return sign | static_cast<uint16_t>(up ? lo + 1 : lo);  // 0x7f7f + 1 is infinity
}

void ExpectFloatToBFloat16(float f) {
  const uint16_t got = FloatToBFloat16(f);
  if (std::isnan(f)) {
    EXPECT_TRUE(IsBFloat16NaN(got)) << std::hex << FloatBits(f) << " -> " << got;
    EXPECT_EQ(got >> 15, FloatBits(f) >> 31);
    return;
  }
  ASSERT_EQ(got, ReferenceBFloat16(f)) << std::hexfloat << f << " bits " << std::hex
                                       << FloatBits(f);
}

TEST(BFloat16, EveryPatternDecodesAndRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = BFloat16ToFloat(h);
    EXPECT_EQ(FloatBits(f), i << 16);
    const uint16_t back = FloatToBFloat16(f);
    if (IsBFloat16NaN(h)) {
      EXPECT_TRUE(IsBFloat16NaN(back)) << std::hex << h << " -> " << back;
    } else {
      ASSERT_EQ(back, h);
    }
  }
}

TEST(BFloat16, EdgeValues) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);       // tie, to even
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);       // tie, to even
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(FloatToBFloat16(BitsToFloat(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(FloatToBFloat16(BitsToFloat(0x7f7f8000u)), 0x7f80);  // tie, 0x7f7f odd: inf
  EXPECT_EQ(FloatToBFloat16(-INFINITY), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBFloat16(BitsToFloat(0x00018000u)), 0x0002);  // subnormal tie, to even
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(BitsToFloat(0x7f800001u))));  // NaN not inf
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(BitsToFloat(0xff80ffffu))));
}

// Every upper half with the rounding-relevant lower halves, then random floats.
TEST(BFloat16, AgainstDoubleReference) {
  for (uint32_t upper = 0; upper < 65536; ++upper) {
    for (uint32_t lower : {0x0000u, 0x0001u, 0x3fffu, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      ExpectFloatToBFloat16(BitsToFloat(upper << 16 | lower));
    }
    if (HasFatalFailure()) return;
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 2'000'000; ++i) {
    ExpectFloatToBFloat16(BitsToFloat(rng()));
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace braid
