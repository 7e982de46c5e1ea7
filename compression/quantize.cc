#include "compression/quantize.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "common/multiversion.h"

// Hot loops are multiversioned (common/multiversion.h) and written branch-free (selects,
// fixed-size blocks) so that GCC vectorizes them; where it cannot, AVX2 intrinsics behind a
// run-time CPU check do the work, checked against the portable loops by the unit tests.
namespace braid::compression {
namespace {

constexpr size_t kBlock = 256;  // codes staged per block before packing (even)

bool g_vector_kernels = true;  // UseVectorKernels(false): the portable paths only

bool UseAvx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && g_vector_kernels;
#else
  return false;
#endif
}

// Bit casts the vectorizer sees through (FloatBits' memcpy blocks it in these loops).
inline uint32_t Bits(float f) { return __builtin_bit_cast(uint32_t, f); }
inline float Float(uint32_t u) { return __builtin_bit_cast(float, u); }

inline uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

inline float Uniform(uint32_t seed, uint32_t index) {
  return static_cast<float>(Fmix32(index * 0x9E3779B9u + seed) >> 8) * (1.0f / 16777216.0f);
}

// FP4 codes of x[0..n) under a power-of-two scale s in [2^-125, 2^125], one per byte.
// Branch-free integer and select arithmetic on the float bits, so GCC vectorizes it.
BRAID_MULTIVERSION
void Fp4Codes(const float* __restrict x, size_t n, float s, uint32_t seed, uint32_t index0,
              uint8_t* __restrict codes) {
  const float inv_s = 1.0f / s;  // exact, and so is a * inv_s: s is a power of two
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::fabs(v) * inv_s;  // in [0, 1]
    const uint32_t tb = Bits(t);
    const int32_t e = static_cast<int32_t>(tb >> 23) - 127;  // floor(log2 t)
    const int32_t k = e >> 1;                                // floor(log4 t), lo = 4^k
    // t / lo = 1.mantissa * 2^(e - 2k), in [1, 4): set t's exponent to e - 2k = e & 1.
    const float y = Float((tb & 0x007fffffu) | (static_cast<uint32_t>(127 + (e & 1)) << 23));
    const bool small = e < -12;  // t < 4^-6: between 0 and the smallest level
    // Where t lies between its neighbouring levels lo and hi = 4·lo, in [0, 1).
    const float r_small = t * 4096.0f;
    const float r_big = (y - 1.0f) * (1.0f / 3.0f);
    const float r = small ? r_small : r_big;
    const int32_t m_lo = small ? 0 : 7 + k;
    int32_t m = m_lo + (Uniform(seed, index0 + static_cast<uint32_t>(i)) < r ? 1 : 0);
    m = m > 7 ? 7 : m;
    const int32_t sign = v < 0.0f ? 8 : 0;
    codes[i] = static_cast<uint8_t>(m == 0 ? 0 : (sign | m));
  }
}

// INT4 codes of x[0..n) under a finite scale s > 0.
BRAID_MULTIVERSION
void Int4Codes(const float* __restrict x, size_t n, float s, uint32_t seed, uint32_t index0,
               uint8_t* __restrict codes) {
  for (size_t i = 0; i < n; ++i) {
    float t = x[i] / s;
    t = t > 7.0f ? 7.0f : (t < -7.0f ? -7.0f : t);
    const float lo = std::floor(t);
    const float r = t - lo;
    int32_t q = static_cast<int32_t>(lo) +
                (Uniform(seed, index0 + static_cast<uint32_t>(i)) < r ? 1 : 0);
    q = q > 7 ? 7 : q;
    codes[i] = static_cast<uint8_t>(static_cast<uint32_t>(q) & 0xfu);
  }
}

// Portable decode: two table lookups per byte.
void DecodeScalar(const uint8_t* packed, size_t count, const float* table, float* out,
                  bool add) {
  const size_t pairs = count / 2;
  if (add) {
    for (size_t j = 0; j < pairs; ++j) {
      out[2 * j] += table[packed[j] & 0xf];
      out[2 * j + 1] += table[packed[j] >> 4];
    }
  } else {
    for (size_t j = 0; j < pairs; ++j) {
      out[2 * j] = table[packed[j] & 0xf];
      out[2 * j + 1] = table[packed[j] >> 4];
    }
  }
  if (count % 2) {
    const float v = table[packed[pairs] & 0xf];
    out[count - 1] = add ? out[count - 1] + v : v;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 decode, 16 codes per step: the 16-entry table is two 8-float registers; vpermps looks
// each code's low 3 bits up in both and bit 3 picks one. GCC does not find this itself (a
// table lookup is a gather to it), and decode runs n + 1 times per element in the 4-bit
// all-reduce, so it is worth the intrinsics.
__attribute__((target("avx2"))) void DecodeAvx2(const uint8_t* packed, size_t count,
                                                const float* table, float* out, bool add) {
  const __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + i / 2));
    const __m128i low = _mm_and_si128(bytes, nibble);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const __m128i codes = _mm_unpacklo_epi8(low, high);  // element order: low, high, ...
    for (int half = 0; half < 2; ++half) {
      const __m256i idx = _mm256_cvtepu8_epi32(half ? _mm_srli_si128(codes, 8) : codes);
      const __m256 from_lo = _mm256_permutevar8x32_ps(lo, idx);
      const __m256 from_hi = _mm256_permutevar8x32_ps(hi, idx);
      // Bit 3 of the code, moved to the sign bit, selects the upper half of the table.
      const __m256 pick = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
      __m256 v = _mm256_blendv_ps(from_lo, from_hi, pick);
      float* dst = out + i + 8 * half;
      if (add) v = _mm256_add_ps(_mm256_loadu_ps(dst), v);
      _mm256_storeu_ps(dst, v);
    }
  }
  DecodeScalar(packed + i / 2, count - i, table, out + i, add);
}
#endif

void DecodeImpl(const uint8_t* packed, size_t count, const float* table, float* out, bool add) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx2()) return DecodeAvx2(packed, count, table, out, add);
#endif
  DecodeScalar(packed, count, table, out, add);
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 FP4 encode, 16 elements -> 8 packed bytes per step: the same arithmetic as Fp4Codes,
// lane for lane (so the same codes), plus the nibble packing in registers. GCC's version
// of Fp4Codes spends much of its time narrowing int32 codes to bytes and re-reading them.
__attribute__((target("avx2"))) inline __m256i Fp4Codes8(__m256 v, __m256 inv_s, __m256i h) {
  const __m256 t = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), inv_s);
  const __m256i tb = _mm256_castps_si256(t);
  const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(tb, 23), _mm256_set1_epi32(127));
  const __m256i k = _mm256_srai_epi32(e, 1);
  const __m256i y_bits = _mm256_or_si256(
      _mm256_and_si256(tb, _mm256_set1_epi32(0x007fffff)),
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_and_si256(e, _mm256_set1_epi32(1)),
                                         _mm256_set1_epi32(127)), 23));
  const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(-12), e);  // e < -12
  const __m256 r_small = _mm256_mul_ps(t, _mm256_set1_ps(4096.0f));
  const __m256 r_big = _mm256_mul_ps(
      _mm256_sub_ps(_mm256_castsi256_ps(y_bits), _mm256_set1_ps(1.0f)), _mm256_set1_ps(1.0f / 3.0f));
  const __m256 r = _mm256_blendv_ps(r_big, r_small, _mm256_castsi256_ps(small));
  const __m256i m_lo = _mm256_andnot_si256(small, _mm256_add_epi32(k, _mm256_set1_epi32(7)));
  // Uniform(seed, index): murmur3's finaliser, 24 bits, as in Uniform().
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)),
                                 _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(u, r, _CMP_LT_OQ));  // -1 or 0
  const __m256i m = _mm256_min_epi32(_mm256_sub_epi32(m_lo, up), _mm256_set1_epi32(7));
  const __m256i sign = _mm256_castps_si256(
      _mm256_and_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ),
                    _mm256_castsi256_ps(_mm256_set1_epi32(8))));
  const __m256i zero = _mm256_cmpeq_epi32(m, _mm256_setzero_si256());
  return _mm256_andnot_si256(zero, _mm256_or_si256(m, sign));
}

__attribute__((target("avx2"))) void Fp4EncodeAvx2(const float* x, size_t n, float s,
                                                   uint32_t seed, uint32_t index0,
                                                   uint8_t* packed) {
  const __m256 inv_s = _mm256_set1_ps(1.0f / s);
  const __m256i golden = _mm256_set1_epi32(static_cast<int>(0x9E3779B9u));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i low_byte = _mm256_set1_epi64x(0xff);
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i first_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                               -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
                                               -1, -1, -1, -1, -1, -1, -1, -1);
  for (size_t i = 0; i + 16 <= n; i += 16) {
    const uint32_t base = index0 + static_cast<uint32_t>(i);
    const __m256i idx_a = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), lane);
    const __m256i idx_b = _mm256_add_epi32(idx_a, _mm256_set1_epi32(8));
    const __m256i seedv = _mm256_set1_epi32(static_cast<int>(seed));
    const __m256i a = Fp4Codes8(_mm256_loadu_ps(x + i), inv_s,
                                _mm256_add_epi32(_mm256_mullo_epi32(idx_a, golden), seedv));
    const __m256i b = Fp4Codes8(_mm256_loadu_ps(x + i + 8), inv_s,
                                _mm256_add_epi32(_mm256_mullo_epi32(idx_b, golden), seedv));
    // Per 64-bit lane (codes c_2j, c_2j+1): low byte = c_2j | c_2j+1 << 4.
    const __m256i pa = _mm256_and_si256(_mm256_or_si256(a, _mm256_srli_epi64(a, 28)), low_byte);
    const __m256i pb = _mm256_and_si256(_mm256_or_si256(b, _mm256_srli_epi64(b, 28)), low_byte);
    // Dwords [a01, b01, a23, b23, ...] -> [a01, a23, a45, a67 | b01, b23, b45, b67] -> bytes.
    const __m256i mixed = _mm256_permutevar8x32_epi32(
        _mm256_or_si256(pa, _mm256_slli_epi64(pb, 32)), order);
    const __m256i bytes = _mm256_shuffle_epi8(mixed, first_bytes);
    const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(bytes)));
    const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(bytes, 1)));
    const uint64_t out = lo | (static_cast<uint64_t>(hi) << 32);
    std::memcpy(packed + i / 2, &out, sizeof(out));
  }
}
#endif

// max |x| and whether any element is NaN or infinite. Computed on the bits: for |x| the
// unsigned integer order is the float order, infinities are 0x7f800000 and NaNs above it,
// and an integer max reduction vectorizes where a float one may not (NaN semantics).
BRAID_MULTIVERSION
float MaxAbs(const float* __restrict x, size_t n, bool* nonfinite) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = Bits(x[i]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  *nonfinite = m >= 0x7f800000u;
  return Float(m);
}

}  // namespace

float UniformDraw(uint32_t seed, uint64_t index) {
  return Uniform(seed, static_cast<uint32_t>(index));
}

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t NameHash(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

float ChunkScale(FourBitFormat format, const float* x, size_t count) {
  bool nonfinite = false;
  const float m = MaxAbs(x, count, &nonfinite);
  if (nonfinite) return std::nanf("");
  if (m == 0.0f) return 0.0f;
  if (format == FourBitFormat::kInt4) return m / 7.0f;
  int e = 0;
  const float f = std::frexp(m, &e);  // m = f·2^e, f in [0.5, 1)
  if (f == 0.5f) return m;
  // Above 2^127 the next power of two is beyond float32: no scale holds the chunk, which
  // is then broken like a non-finite one (NaN), never silently clipped.
  return e > 127 ? std::nanf("") : std::ldexp(1.0f, e);
}

void DecodeTable(FourBitFormat format, float scale, float table[16]) {
  if (format == FourBitFormat::kFp4) {
    // 4^(m-7) for m = 1..7: multiplying by a power of two rounds exactly like ldexp, and this
    // runs once per chunk (ldexp's library call showed in profiles).
    static constexpr float kPow4[8] = {0.0f,    0x1p-12f, 0x1p-10f, 0x1p-8f,
                                       0x1p-6f, 0x1p-4f,  0x1p-2f,  1.0f};
    for (int m = 0; m < 8; ++m) {
      table[m] = scale * kPow4[m];  // m = 0: zero, or NaN for a NaN scale
      table[8 + m] = -table[m];
    }
    table[8] = table[0];  // code 8 (negative zero) is never produced; decode it as zero
  } else {
    for (int c = 0; c < 16; ++c) table[c] = static_cast<float>((c ^ 8) - 8) * scale;
  }
}

void Encode(FourBitFormat format, const float* x, size_t count, float scale, uint32_t seed,
            uint64_t index0, uint8_t* packed) {
  if (!(scale > 0.0f) || std::isinf(scale)) {
    // Zero chunk (all codes 0), or a non-finite one: the NaN scale carries the breakage.
    std::memset(packed, 0, PackedBytes(count));
    return;
  }
  size_t start = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (format == FourBitFormat::kFp4 && scale >= 0x1p-100f && UseAvx2()) {
    start = count / 16 * 16;
    Fp4EncodeAvx2(x, start, scale, seed, static_cast<uint32_t>(index0), packed);
  }
#endif
  uint8_t codes[kBlock];
  for (size_t done = start; done < count; done += kBlock) {
    const size_t n = count - done < kBlock ? count - done : kBlock;
    const uint32_t i0 = static_cast<uint32_t>(index0 + done);
    if (format == FourBitFormat::kFp4 && scale < 0x1p-100f) {
      // A tiny (near-denormal) scale: 1/scale would overflow. Scale the block up by 2^100
      // first, which is exact for values this small and changes no code.
      float scaled[kBlock];
      for (size_t i = 0; i < n; ++i) scaled[i] = x[done + i] * 0x1p100f;
      Fp4Codes(scaled, n, scale * 0x1p100f, seed, i0, codes);
    } else if (format == FourBitFormat::kFp4) {
      Fp4Codes(x + done, n, scale, seed, i0, codes);
    } else {
      Int4Codes(x + done, n, scale, seed, i0, codes);
    }
    PackCodes(codes, n, packed + done / 2);
  }
}

void UseVectorKernels(bool enabled) { g_vector_kernels = enabled; }

void Decode(FourBitFormat format, const uint8_t* packed, size_t count, float scale, float* out) {
  float table[16];
  DecodeTable(format, scale, table);
  DecodeImpl(packed, count, table, out, /*add=*/false);
}

void DecodeAdd(FourBitFormat format, const uint8_t* packed, size_t count, float scale,
               float* out) {
  float table[16];
  DecodeTable(format, scale, table);
  DecodeImpl(packed, count, table, out, /*add=*/true);
}

// The one portable packer: Encode uses it, the unit tests check it round-trips.
BRAID_MULTIVERSION
void PackCodes(const uint8_t* codes, size_t count, uint8_t* packed) {
  for (size_t j = 0; j < count / 2; ++j) {
    packed[j] = static_cast<uint8_t>((codes[2 * j] & 0xf) | ((codes[2 * j + 1] & 0xf) << 4));
  }
  if (count % 2) packed[count / 2] = codes[count - 1] & 0xf;
}

void UnpackCodes(const uint8_t* packed, size_t count, uint8_t* codes) {
  for (size_t i = 0; i < count; ++i) codes[i] = (packed[i / 2] >> (4 * (i % 2))) & 0xf;
}

}  // namespace braid::compression
