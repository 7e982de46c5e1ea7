#include "compression/quantize.h"

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics wherever they are
// inlined (the pass-through operand they leave undefined by design; GCC bug 105593): the
// diagnostic's location is the header, so it is silenced there and nowhere else.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "common/multiversion.h"
#include "compression/codec_math.h"

// Hot loops are multiversioned (common/multiversion.h) and written branch-free (selects,
// fixed-size blocks) so that GCC vectorizes them; where it cannot, AVX2 intrinsics behind a
// run-time CPU check do the work, checked against the portable loops by the unit tests.
namespace braid::compression {
namespace {

constexpr size_t kBlock = 256;  // codes staged per block before packing (even)

bool g_vector_kernels = true;  // UseVectorKernels(false): the portable paths only

bool UseAvx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && g_vector_kernels;
#else
  return false;
#endif
}

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

// The shared arithmetic (codec_math.h), as the kernels below call it.
inline float Uniform(uint32_t seed, uint32_t index) { return codec::Uniform(seed, index); }

// FP4 codes of x[0..n) under a power-of-two scale s in [2^-125, 2^125], one per byte.
// Branch-free integer and select arithmetic on the float bits, so GCC vectorizes it.
BRAID_MULTIVERSION
void Fp4Codes(const float* __restrict x, size_t n, float s, uint32_t seed, uint32_t index0,
              uint8_t* __restrict codes) {
  const float inv_s = 1.0f / s;  // exact, and so is a * inv_s: s is a power of two
  for (size_t i = 0; i < n; ++i) {
    codes[i] = codec::Fp4Code(x[i], inv_s, Uniform(seed, index0 + static_cast<uint32_t>(i)));
  }
}

// INT4 codes of x[0..n) under a finite scale s > 0.
BRAID_MULTIVERSION
void Int4Codes(const float* __restrict x, size_t n, float s, uint32_t seed, uint32_t index0,
               uint8_t* __restrict codes) {
  for (size_t i = 0; i < n; ++i) {
    codes[i] = codec::Int4Code(x[i], s, Uniform(seed, index0 + static_cast<uint32_t>(i)));
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

#if defined(__x86_64__) && defined(__GNUC__)
// AVX-512 decode, 32 codes per step: the whole 16-entry table fits one register, so each
// lookup is one vpermps on the code itself.
__attribute__((target("avx512f"))) void DecodeAvx512(const uint8_t* packed, size_t count,
                                                    const float* table, float* out, bool add) {
  const __m512 t = _mm512_loadu_ps(table);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + i / 2));
    const __m128i low = _mm_and_si128(bytes, nibble);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    for (int half = 0; half < 2; ++half) {  // element order: low, high, low, high, ...
      const __m128i codes = half ? _mm_unpackhi_epi8(low, high) : _mm_unpacklo_epi8(low, high);
      __m512 v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), t);
      float* dst = out + i + 16 * half;
      if (add) v = _mm512_add_ps(_mm512_loadu_ps(dst), v);
      _mm512_storeu_ps(dst, v);
    }
  }
  DecodeAvx2(packed + i / 2, count - i, table, out + i, add);
}
#endif

void DecodeImpl(const uint8_t* packed, size_t count, const float* table, float* out, bool add) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx512() && UseAvx2()) return DecodeAvx512(packed, count, table, out, add);
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
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // The hash input of element i, (index0 + i)·golden + seed (mod 2^32, as Uniform's), kept
  // per lane and stepped by 8·golden: one add per 8 elements instead of a multiply.
  constexpr uint32_t kGolden = 0x9E3779B9u;
  __m256i h = _mm256_add_epi32(
      _mm256_mullo_epi32(_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(index0)), lane),
                         _mm256_set1_epi32(static_cast<int>(kGolden))),
      _mm256_set1_epi32(static_cast<int>(seed)));
  const __m256i step = _mm256_set1_epi32(static_cast<int>(8u * kGolden));
  // 32 codes per step: int32 -> bytes by two saturating packs (codes are 0..15, nothing
  // saturates), a dword permute back to element order, then each byte pair (c_2j, c_2j+1)
  // -> c_2j + 16·c_2j+1 by one multiply-add of unsigned bytes, and a pack to bytes.
  const __m256i dword_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i nibble_weights = _mm256_set1_epi16(0x1001);  // byte 2j x1, byte 2j+1 x16
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i c[4];
    for (int k = 0; k < 4; ++k) {
      c[k] = Fp4Codes8(_mm256_loadu_ps(x + i + 8 * k), inv_s, h);
      h = _mm256_add_epi32(h, step);
    }
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3])),
        dword_order);
    const __m256i pairs = _mm256_maddubs_epi16(bytes, nibble_weights);
    const __m256i out = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs, pairs), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + i / 2), _mm256_castsi256_si128(out));
  }
  for (; i + 16 <= n; i += 16) {  // one 16-element step left: 8 bytes
    const __m256i a = Fp4Codes8(_mm256_loadu_ps(x + i), inv_s, h);
    h = _mm256_add_epi32(h, step);
    const __m256i b = Fp4Codes8(_mm256_loadu_ps(x + i + 8), inv_s, h);
    h = _mm256_add_epi32(h, step);
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_setzero_si256()), dword_order);
    const __m256i pairs = _mm256_maddubs_epi16(bytes, nibble_weights);
    const __m128i out = _mm_packus_epi16(_mm256_castsi256_si128(pairs), _mm256_castsi256_si128(pairs));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + i / 2), out);
  }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
// AVX-512 FP4 encode, 32 elements -> 16 packed bytes per step: Fp4Codes8's arithmetic lane
// for lane (the same codes) on 16 lanes, with mask registers for the selects. Twice the lanes
// and 32 vector registers: the AVX2 loop spills its constants to the stack.
__attribute__((target("avx512f"))) inline __m512i Fp4Codes16(__m512 v, __m512 inv_s, __m512i h) {
  const __m512 t = _mm512_mul_ps(_mm512_abs_ps(v), inv_s);
  const __m512i tb = _mm512_castps_si512(t);
  const __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(tb, 23), _mm512_set1_epi32(127));
  const __m512i k = _mm512_srai_epi32(e, 1);
  const __m512i y_bits = _mm512_or_si512(
      _mm512_and_si512(tb, _mm512_set1_epi32(0x007fffff)),
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_and_si512(e, _mm512_set1_epi32(1)),
                                         _mm512_set1_epi32(127)), 23));
  const __mmask16 small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(-12));
  const __m512 r_small = _mm512_mul_ps(t, _mm512_set1_ps(4096.0f));
  const __m512 r_big = _mm512_mul_ps(
      _mm512_sub_ps(_mm512_castsi512_ps(y_bits), _mm512_set1_ps(1.0f)), _mm512_set1_ps(1.0f / 3.0f));
  const __m512 r = _mm512_mask_blend_ps(small, r_big, r_small);
  const __m512i m_lo = _mm512_maskz_add_epi32(static_cast<__mmask16>(~small), k,
                                              _mm512_set1_epi32(7));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x85ebca6bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)),
                                 _mm512_set1_ps(1.0f / 16777216.0f));
  const __mmask16 up = _mm512_cmp_ps_mask(u, r, _CMP_LT_OQ);
  const __m512i m = _mm512_min_epi32(_mm512_mask_add_epi32(m_lo, up, m_lo, _mm512_set1_epi32(1)),
                                     _mm512_set1_epi32(7));
  const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512i with_sign = _mm512_mask_or_epi32(m, neg, m, _mm512_set1_epi32(8));
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(m, _mm512_setzero_si512());
  return _mm512_maskz_mov_epi32(static_cast<__mmask16>(~zero), with_sign);
}

// n a multiple of 32.
__attribute__((target("avx512f"))) void Fp4EncodeAvx512(const float* x, size_t n, float s,
                                                       uint32_t seed, uint32_t index0,
                                                       uint8_t* packed) {
  const __m512 inv_s = _mm512_set1_ps(1.0f / s);
  constexpr uint32_t kGolden = 0x9E3779B9u;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i h = _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(index0)), lane),
                         _mm512_set1_epi32(static_cast<int>(kGolden))),
      _mm512_set1_epi32(static_cast<int>(seed)));
  const __m512i step = _mm512_set1_epi32(static_cast<int>(16u * kGolden));
  const __m128i nibble_weights = _mm_set1_epi16(0x1001);  // byte 2j x1, byte 2j+1 x16
  for (size_t i = 0; i + 32 <= n; i += 32) {
    const __m512i a = Fp4Codes16(_mm512_loadu_ps(x + i), inv_s, h);
    h = _mm512_add_epi32(h, step);
    const __m512i b = Fp4Codes16(_mm512_loadu_ps(x + i + 16), inv_s, h);
    h = _mm512_add_epi32(h, step);
    // int32 codes -> bytes in element order, then (c_2j, c_2j+1) -> c_2j + 16·c_2j+1.
    const __m128i pa = _mm_maddubs_epi16(_mm512_cvtepi32_epi8(a), nibble_weights);
    const __m128i pb = _mm_maddubs_epi16(_mm512_cvtepi32_epi8(b), nibble_weights);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + i / 2), _mm_packus_epi16(pa, pb));
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
  // MaxAbs's bits are max(bits(|x|)) (quantize_reference_test checks the rule against
  // frexp / ldexp).
  return codec::ScaleFromMaxBits(format == FourBitFormat::kInt4, Bits(m));
}

void DecodeTable(FourBitFormat format, float scale, float table[16]) {
  for (uint32_t c = 0; c < 16; ++c) {
    table[c] = format == FourBitFormat::kFp4 ? codec::Fp4Value(scale, c)
                                             : codec::Int4Value(scale, c);
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
  if (format == FourBitFormat::kFp4 && scale >= 0x1p-100f) {
    if (UseAvx512()) {
      start = count / 32 * 32;
      Fp4EncodeAvx512(x, start, scale, seed, static_cast<uint32_t>(index0), packed);
    }
    if (UseAvx2()) {
      const size_t end = count / 16 * 16;
      Fp4EncodeAvx2(x + start, end - start, scale, seed, static_cast<uint32_t>(index0 + start),
                    packed + start / 2);
      start = end;
    }
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
