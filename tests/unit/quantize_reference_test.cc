// The 4-bit codecs (compression/quantize.h) against a plain scalar reference written from the
// format's definition with the library's frexp/ldexp/floor and no bit tricks: every packed
// byte value decodes as the reference says, under every kind of scale (normal, subnormal,
// huge, zero, NaN, infinite); encodes of edge inputs (signed zeros, subnormals, levels, ties,
// the largest floats, Inf and NaN chunks, odd and ragged lengths, tiny scales) give the
// reference's bytes, with the vector kernels on and off. The fast kernels must never change
// a single bit of what goes on the wire.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compression/quantize.h"
#include "gtest/gtest.h"

namespace braid::compression {
namespace {

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The bits of `f`, every NaN as one: IEEE 754 leaves the sign and payload of an arithmetic
// NaN unspecified, and the compiler may produce NaN * -7 as -(NaN * 7) at one optimisation
// level and not at another (the sanitizer builds' -O1 does). Every other value bit for bit.
uint32_t CanonicalBitsOf(float f) { return std::isnan(f) ? 0x7fc00000u : BitsOf(f); }
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- The reference ----

float RefScale(FourBitFormat format, const std::vector<float>& x) {
  float m = 0;
  for (float v : x) {
    if (!std::isfinite(v)) return std::numeric_limits<float>::quiet_NaN();
    m = std::max(m, std::fabs(v));
  }
  if (m == 0) return 0;
  if (format == FourBitFormat::kInt4) return m / 7.0f;
  int e = 0;
  const float f = std::frexp(m, &e);
  if (f == 0.5f) return m;
  // Above 2^127 no float32 power of two holds the chunk: it is broken like a non-finite one.
  return e > 127 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, e);
}

float RefValue(FourBitFormat format, float scale, int code) {
  if (format == FourBitFormat::kInt4) return static_cast<float>((code ^ 8) - 8) * scale;
  const int m = code & 7;
  const float magnitude = scale * (m == 0 ? 0.0f : std::ldexp(1.0f, 2 * (m - 7)));
  return (code & 8) && m != 0 ? -magnitude : magnitude;
}

// The code of one element: between the neighbouring levels lo <= |t| <= hi it rounds up with
// probability r (the draw u < r), as quantize.h defines, with r computed as the codec does.
int RefCode(FourBitFormat format, float x, float s, uint32_t seed, uint64_t index) {
  const float u = UniformDraw(seed, index);
  if (format == FourBitFormat::kInt4) {
    float t = x / s;
    t = std::min(7.0f, std::max(-7.0f, t));
    const float lo = std::floor(t);
    int q = static_cast<int>(lo) + (u < t - lo ? 1 : 0);
    q = std::min(q, 7);
    return q & 0xf;
  }
  // |x| / s exactly (s is a power of two), rounded once to float.
  const float t = static_cast<float>(std::fabs(static_cast<double>(x)) / static_cast<double>(s));
  int m_lo;
  float r;
  if (t < std::ldexp(1.0f, -12)) {  // below the smallest level 4^-6
    m_lo = 0;
    r = t * 4096.0f;
  } else {
    int e = 0;
    std::frexp(t, &e);                                   // t = f·2^e, f in [0.5, 1)
    const int k = static_cast<int>(std::floor((e - 1) / 2.0));  // lo = 4^k <= t
    const float y = std::ldexp(t, -2 * k);               // t / lo, in [1, 4)
    m_lo = 7 + k;
    r = (y - 1.0f) * (1.0f / 3.0f);
  }
  const int m = std::min(7, m_lo + (u < r ? 1 : 0));
  return m == 0 ? 0 : ((x < 0 ? 8 : 0) | m);
}

std::vector<uint8_t> RefEncode(FourBitFormat format, const std::vector<float>& x, float s,
                               uint32_t seed, uint64_t index0) {
  std::vector<uint8_t> packed(PackedBytes(x.size()), 0);
  if (!(s > 0) || std::isinf(s)) return packed;
  for (size_t i = 0; i < x.size(); ++i) {
    packed[i / 2] |= static_cast<uint8_t>(RefCode(format, x[i], s, seed, index0 + i) << (4 * (i % 2)));
  }
  return packed;
}

// ---- The checks ----

class QuantizeReferenceTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { UseVectorKernels(GetParam()); }
  void TearDown() override { UseVectorKernels(true); }
};

const FourBitFormat kFormats[] = {FourBitFormat::kFp4, FourBitFormat::kInt4};
const char* Name(FourBitFormat f) { return f == FourBitFormat::kFp4 ? "fp4" : "int4"; }

std::vector<float> EdgeScales() {
  const float inf = std::numeric_limits<float>::infinity();
  return {1.0f, 0.75f, 3.0e-3f, 1.0e30f, std::numeric_limits<float>::max(),
          std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
          0x1p-110f, 0.0f, -0.0f, inf, std::numeric_limits<float>::quiet_NaN()};
}

// Every byte value, decoded and decoded-added, under every kind of scale.
TEST_P(QuantizeReferenceTest, EveryByteDecodesAsTheReference) {
  std::vector<uint8_t> packed(256);
  for (int b = 0; b < 256; ++b) packed[b] = static_cast<uint8_t>(b);
  for (FourBitFormat f : kFormats) {
    for (float s : EdgeScales()) {
      for (size_t count : {size_t{512}, size_t{511}, size_t{33}, size_t{1}}) {
        std::vector<float> out(count, 1.5f), acc(count, 0.25f);
        Decode(f, packed.data(), count, s, out.data());
        DecodeAdd(f, packed.data(), count, s, acc.data());
        for (size_t i = 0; i < count; ++i) {
          const int code = (packed[i / 2] >> (4 * (i % 2))) & 0xf;
          const float want = RefValue(f, s, code);
          ASSERT_EQ(CanonicalBitsOf(out[i]), CanonicalBitsOf(want))
              << Name(f) << " scale " << s << " element " << i << " code " << code;
          ASSERT_EQ(CanonicalBitsOf(acc[i]), CanonicalBitsOf(0.25f + want))
              << Name(f) << " add, scale " << s << " element " << i << " code " << code;
        }
      }
    }
  }
}

void ExpectEncodeMatches(FourBitFormat f, const std::vector<float>& x, uint32_t seed,
                         uint64_t index0, const std::string& what) {
  const float s = ChunkScale(f, x.data(), x.size());
  const float ref_s = RefScale(f, x);
  ASSERT_EQ(BitsOf(s), BitsOf(ref_s)) << Name(f) << " " << what << ": scale";
  std::vector<uint8_t> got(PackedBytes(x.size()), 0xee);
  Encode(f, x.data(), x.size(), s, seed, index0, got.data());
  const std::vector<uint8_t> want = RefEncode(f, x, ref_s, seed, index0);
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_EQ(got[j], want[j]) << Name(f) << " " << what << ": byte " << j << " (elements "
                               << 2 * j << ", " << 2 * j + 1 << ": " << x[2 * j] << ", "
                               << (2 * j + 1 < x.size() ? x[2 * j + 1] : 0.0f) << ")";
  }
}

TEST_P(QuantizeReferenceTest, EdgeInputsEncodeAsTheReference) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"zeros", std::vector<float>(128, 0.0f)},
      {"signed zeros", {0.0f, -0.0f, -0.0f, 0.0f, 1.0f, -0.0f}},
      {"one element", {-0.3f}},
      {"levels of fp4", {1.0f, 0.25f, 0x1p-4f, 0x1p-6f, 0x1p-8f, 0x1p-10f, 0x1p-12f,
                         -1.0f, -0.25f, 0x1p-13f, 0x1p-20f, 0.5f, 0.125f, 3.0f / 8, 0.999f,
                         -0.001f, 0.6f}},
      {"int4 steps", {7.0f, -7.0f, 3.5f, -3.5f, 0.5f, 1.0f, 6.999f, -6.5f, 0.0f, 2.0f}},
      {"largest floats", {big, -big, big / 2, 1.0f, -3.0e38f, 1.0e30f}},
      {"power of two max", {0.5f, 0.25f, -0.125f, 0.3f, 0.01f, 0x1p-30f}},
      {"subnormals", {tiny, -tiny, 3 * tiny, 0x1p-140f, -0x1p-135f, 0.0f, 0x1p-127f}},
      {"normal min", {std::numeric_limits<float>::min(), 0x1p-125f, -0x1p-120f, 0x1p-149f}},
      {"tiny scale", {0x1p-105f, -0x1p-110f, 0x1p-118f, 0x1p-101f, 0x1p-130f, 0.0f,
                      0x1p-106f, -0x1p-112f, 0x1p-103f, 0x1p-104f, 0x1p-107f, 0x1p-117f,
                      0x1p-115f, 0x1p-114f, 0x1p-113f, 0x1p-111f, 0x1p-109f}},
      {"inf", {1.0f, inf, -2.0f}},
      {"-inf", {-inf, 0.5f}},
      {"nan", {0.25f, nan, 1.0f, 2.0f}},
  };
  // Ragged lengths around the 16-element vector step, in magnitudes from 2^-40 to 2^20.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (size_t n : {size_t{15}, size_t{16}, size_t{17}, size_t{31}, size_t{128}, size_t{129},
                   size_t{255}, size_t{1000}}) {
    for (int e : {-40, -13, 0, 20}) {
      std::vector<float> x(n);
      for (float& v : x) v = std::ldexp(unit(rng), e);
      cases.push_back({"random n=" + std::to_string(n) + " 2^" + std::to_string(e), x});
      x[n / 2] = std::ldexp(1.0f, e);  // the maximum an exact power of two
      cases.push_back({"random pow2 max n=" + std::to_string(n), x});
    }
  }
  for (FourBitFormat f : kFormats) {
    for (const auto& [what, x] : cases) {
      for (uint64_t index0 : {uint64_t{0}, uint64_t{12345}, uint64_t{0xfffffff0}}) {
        ExpectEncodeMatches(f, x, /*seed=*/0x9e37u, index0, what);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Every float bit pattern's high 16 bits (sign, exponent, 7 mantissa bits) as one chunk
// element each next to a fixed maximum: the encode of every exponent and sign.
TEST_P(QuantizeReferenceTest, EveryExponentEncodesAsTheReference) {
  for (FourBitFormat f : kFormats) {
    std::vector<float> x;
    for (uint32_t hi = 0; hi < 0x10000; hi += 7) {
      const float v = FromBits(hi << 16 | 0x5a5a);
      if (std::isfinite(v) && std::fabs(v) <= 1.0f) x.push_back(v);
    }
    x.push_back(1.0f);
    for (size_t begin = 0; begin < x.size(); begin += 128) {
      std::vector<float> chunk(x.begin() + begin, x.begin() + std::min(x.size(), begin + 128));
      ExpectEncodeMatches(f, chunk, /*seed=*/31u, begin, "exponents from " + std::to_string(begin));
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, QuantizeReferenceTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "vector" : "portable"; });

}  // namespace
}  // namespace braid::compression
