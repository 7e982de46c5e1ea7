// Element-wise reduction kernels. One generic loop, instantiated per (dtype, op) and compiled
// twice by GCC function multiversioning (target_clones): an x86-64-v3 (AVX2, FMA, F16C, the
// Haswell feature set) clone that works on 256-bit ymm vectors and a baseline SSE2 clone; the
// loader picks one through an ifunc resolver, so the shipped build never needs -march=native.
//
// The clone is named "arch=x86-64-v3", not "arch=haswell": GCC's resolver tests an arch=<cpu>
// clone with __builtin_cpu_is, i.e. the CPU *model*, so "arch=haswell" is chosen on Haswell
// only and every AMD or newer Intel CPU gets the baseline. x86-64-v3 is tested as a feature
// level (__builtin_cpu_supports) and is chosen on every CPU that has the features.
//
// Note [Half-precision conversions]
// float16 and bfloat16 are widened to float32, combined, and rounded back to nearest even
// after every operation, bit for bit like the scalar references in common/half.h. GCC 12 does
// not vectorize _Float16 <-> float conversions (it has no vector pattern for them short of
// AVX512-FP16), so the generic float16 codec is branchless bit manipulation plus float
// arithmetic that vectorizes in both clones (after M. Dukhan's FP16 library, MIT licence):
//  - widening: a normal half is shifted into float position and its exponent rebased by a
//    multiplication by 2^-112; a subnormal half m * 2^-24 is built as (0.5 + m * 2^-24) - 0.5,
//    both exact;
//  - narrowing: |f| * 2^112 * 2^-110 saturates values >= 2^16 to infinity; adding a power of
//    two whose ulp is the half ulp of |f| (at least 2^-24, the subnormal ulp) lets the float
//    adder do the round-to-nearest-even, after which exponent and mantissa are read off and
//    a rounding carry into the exponent (up to infinity) falls out of the integer sum.
// Widening agrees with half.h on all 2^16 inputs and narrowing on all 2^32 (checked once by an
// exhaustive harness; the unit tests cover every half pattern and the rounding ties). None of
// it goes through subnormal floats, so FTZ/DAZ modes cannot change the results. A NaN input
// gives a quieted NaN with the payload's top bits (float16: sign|0x7e00|payload >> 13, as
// F16C's vcvtps2ph; bfloat16: the upper half, quieted), as in half.h.
// On x86-64-v3 CPUs float16 goes through F16C instead (see CombineF16c), four times faster.

#include "transport/reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "glog/logging.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// The default RelWithDebInfo build is -O2, whose "very cheap" vectorizer cost model refuses
// loops that need a scalar tail: ask for the dynamic model for this file's own code (placed
// after the includes, so inline functions from headers keep the flags of every other file).
// No contraction, so the x86-64-v3 clone cannot fuse a multiply and an add into an FMA that
// the scalar references and the baseline clone do not have. No trapping math, so GCC may
// compute both sides of the float16 codec's selects (if-conversion); no result here depends
// on floating-point exception flags.
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "fp-contract=off", \
                     "no-trapping-math")

namespace braid::transport {
namespace {

// Not under ThreadSanitizer: a clone's resolver runs while the program is being loaded,
// before TSan's runtime is up, and TSan-instrumented it crashes (the TSan build keeps the
// default clone only).
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define BRAID_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BRAID_VECTOR_CLONES
#endif
#if defined(__x86_64__)
#define BRAID_X86_64_V3 __attribute__((target("arch=x86-64-v3")))
#endif
#define BRAID_INLINE inline __attribute__((always_inline))

BRAID_INLINE uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
BRAID_INLINE float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- Codecs: how an element is loaded into its compute type and stored back. ----

template <typename T>
struct Native {
  using Storage = T;
  using Compute = T;
  static BRAID_INLINE Compute Load(Storage s) { return s; }
  static BRAID_INLINE Storage Store(Compute c) { return c; }
};

// See Note [Half-precision conversions].
struct Float16 {
  using Storage = uint16_t;
  using Compute = float;
  static BRAID_INLINE float Load(uint16_t h) {
    const uint32_t w = static_cast<uint32_t>(h) << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;  // exponent and mantissa, sign shifted out
    // Normal, infinite or NaN: exponent field rebased by 0xe0, then scaled by 2^-112.
    const float normal = FromBits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
    // Zero or subnormal: 0.5 + mant * 2^-24 - 0.5 (exact).
    const float subnormal = FromBits((two_w >> 17) | (126u << 23)) - 0.5f;
    return FromBits(sign | (two_w < (1u << 27) ? Bits(subnormal) : Bits(normal)));
  }
  static BRAID_INLINE uint16_t Store(float f) {
    const uint32_t w = Bits(f);
    const uint32_t two_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    float base = (FromBits(w & 0x7fffffffu) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t bias = two_w & 0xff000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;  // the ulp never drops below 2^-24
    base = FromBits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = Bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    const uint32_t nan = 0x7e00u | ((w >> 13) & 0x3ffu);  // quieted, payload kept (F16C's)
    return static_cast<uint16_t>((sign >> 16) | (two_w > 0xff000000u ? nan : nonsign));
  }
};

// bfloat16 is the upper half of a float32; rounding is integer RNE as in half.h, with the
// NaN test turned into a select so that the loop vectorizes.
struct BFloat16 {
  using Storage = uint16_t;
  using Compute = float;
  static BRAID_INLINE float Load(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }
  static BRAID_INLINE uint16_t Store(float f) {
    const uint32_t u = Bits(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
};

// ---- Operators. Integer sums and products wrap: compute them in the unsigned type. ----

template <typename T, bool = std::is_integral_v<T>>
struct WideOf { using type = T; };
template <typename T>  // uint8_t widens to unsigned: no promotion to a signed int
struct WideOf<T, true> { using type = std::make_unsigned_t<std::common_type_t<T, unsigned>>; };
template <typename T>
using Wide = typename WideOf<T>::type;

struct Sum {
  template <typename T>
  static BRAID_INLINE T Apply(T a, T b) {
    return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
  }
};
struct Product {
  template <typename T>
  static BRAID_INLINE T Apply(T a, T b) {
    return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
  }
};
// NaN-propagating comparisons: a NaN in `a` is returned as is (a plain a < b ? a : b would
// drop it and return b), a NaN in `b` falls out of the comparison (false: b is returned).
// So the first NaN operand wins, which the canonical order makes the same on every rank.
// `a != a` is false for integers and folds away.
struct Min {
  template <typename T>
  static BRAID_INLINE T Apply(T a, T b) { return a != a ? a : (a < b ? a : b); }
};
struct Max {
  template <typename T>
  static BRAID_INLINE T Apply(T a, T b) { return a != a ? a : (a > b ? a : b); }
};

// ---- The hot loops. ----

// out[i] = a[i] op b[i]. `ivdep`: out may equal a or b (never partially overlap), and an
// element is read before it is written, so no runtime alias check is needed.
template <typename Codec, typename Op>
BRAID_VECTOR_CLONES void Combine(typename Codec::Storage* out, const typename Codec::Storage* a,
                                 const typename Codec::Storage* b, size_t count) {
#pragma GCC ivdep
  for (size_t i = 0; i < count; ++i) {
    out[i] = Codec::Store(Op::Apply(Codec::Load(a[i]), Codec::Load(b[i])));
  }
}

template <typename Codec>
BRAID_VECTOR_CLONES void Divide(typename Codec::Storage* buf, size_t count,
                                typename Codec::Compute divisor) {
  for (size_t i = 0; i < count; ++i) buf[i] = Codec::Store(Codec::Load(buf[i]) / divisor);
}

// ---- float16 with F16C. ----
// GCC 12 cannot vectorize the conversions through _Float16 (Note [Half-precision
// conversions]), so on x86-64-v3 CPUs the float16 kernels are written with the F16C
// intrinsics: eight elements per vcvtph2ps / vcvtps2ph (round to nearest even), about four
// times the generic clone's speed. The count % 8 tail uses the generic conversions, which
// agree bit for bit.

#if defined(__x86_64__)
bool HaveX86_64_V3() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v3") != 0;
  }();
  return have;
}

BRAID_X86_64_V3 BRAID_INLINE __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
BRAID_X86_64_V3 BRAID_INLINE void StoreHalf8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// The operators on eight floats, spelled out in the x86-64-v3 target (the templates above
// would be instantiated for the baseline ABI, which has no ymm arguments). vminps / vmaxps
// return the second operand for NaNs and equal zeros; a NaN in `a` is blended back in, so
// they agree exactly with Min and Max.
BRAID_X86_64_V3 BRAID_INLINE __m256 Apply8(Sum, __m256 a, __m256 b) { return a + b; }
BRAID_X86_64_V3 BRAID_INLINE __m256 Apply8(Product, __m256 a, __m256 b) { return a * b; }
BRAID_X86_64_V3 BRAID_INLINE __m256 Apply8(Min, __m256 a, __m256 b) {
  return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
BRAID_X86_64_V3 BRAID_INLINE __m256 Apply8(Max, __m256 a, __m256 b) {
  return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

template <typename Op>
BRAID_X86_64_V3 void CombineF16c(uint16_t* out, const uint16_t* a, const uint16_t* b,
                                 size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    StoreHalf8(out + i, Apply8(Op(), LoadHalf8(a + i), LoadHalf8(b + i)));
  }
  for (; i < count; ++i) {
    out[i] = Float16::Store(Op::Apply(Float16::Load(a[i]), Float16::Load(b[i])));
  }
}

BRAID_X86_64_V3 void DivideF16c(uint16_t* buf, size_t count, float divisor) {
  const __m256 d = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) StoreHalf8(buf + i, LoadHalf8(buf + i) / d);
  for (; i < count; ++i) buf[i] = Float16::Store(Float16::Load(buf[i]) / divisor);
}

BRAID_X86_64_V3 void WidenF16c(float* dst, const uint16_t* src, size_t count, float divisor) {
  const __m256 d = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, LoadHalf8(src + i) / d);
  for (; i < count; ++i) dst[i] = Float16::Load(src[i]) / divisor;
}

BRAID_X86_64_V3 void NarrowF16c(uint16_t* dst, const float* src, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) StoreHalf8(dst + i, _mm256_loadu_ps(src + i));
  for (; i < count; ++i) dst[i] = Float16::Store(src[i]);
}
#else
bool HaveX86_64_V3() { return false; }
#endif

// ---- Dispatch on op, then dtype. ----

template <typename Codec, typename Op>
void Run(typename Codec::Storage* out, const typename Codec::Storage* a,
         const typename Codec::Storage* b, size_t count) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<Codec, Float16>) {
    if (HaveX86_64_V3()) return CombineF16c<Op>(out, a, b, count);
  }
#endif
  Combine<Codec, Op>(out, a, b, count);
}

template <typename Codec>
void CombineOp(void* out, const void* a, const void* b, size_t count, ReduceOp op) {
  using S = typename Codec::Storage;
  auto* o = static_cast<S*>(out);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  switch (op) {
    case ReduceOp::kSum: return Run<Codec, Sum>(o, x, y, count);
    case ReduceOp::kProduct: return Run<Codec, Product>(o, x, y, count);
    case ReduceOp::kMin: return Run<Codec, Min>(o, x, y, count);
    case ReduceOp::kMax: return Run<Codec, Max>(o, x, y, count);
    case ReduceOp::kAverage: break;
  }
  LOG(FATAL) << "reduce kernels take sum, min, max or product, got " << ReduceOpName(op)
             << " (" << static_cast<int>(op) << "); average is sum followed by DivideInPlace";
}

void CombineAny(void* out, const void* a, const void* b, size_t count, DataType dtype,
                ReduceOp op) {
  switch (dtype) {
    case DataType::kFloat32: return CombineOp<Native<float>>(out, a, b, count, op);
    case DataType::kFloat64: return CombineOp<Native<double>>(out, a, b, count, op);
    case DataType::kFloat16: return CombineOp<Float16>(out, a, b, count, op);
    case DataType::kBFloat16: return CombineOp<BFloat16>(out, a, b, count, op);
    case DataType::kInt32: return CombineOp<Native<int32_t>>(out, a, b, count, op);
    case DataType::kInt64: return CombineOp<Native<int64_t>>(out, a, b, count, op);
    case DataType::kUInt8: return CombineOp<Native<uint8_t>>(out, a, b, count, op);
  }
  LOG(FATAL) << "reduce: unknown dtype " << static_cast<int>(dtype);
}

template <typename Codec>
void DivideAs(void* buf, size_t count, int divisor) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<Codec, Float16>) {
    if (HaveX86_64_V3()) return DivideF16c(static_cast<uint16_t*>(buf), count, divisor);
  }
#endif
  Divide<Codec>(static_cast<typename Codec::Storage*>(buf), count,
                static_cast<typename Codec::Compute>(divisor));
}

template <typename Codec>
BRAID_VECTOR_CLONES void Widen(float* __restrict dst, const typename Codec::Storage* __restrict src,
                               size_t count, float divisor) {
  for (size_t i = 0; i < count; ++i) dst[i] = Codec::Load(src[i]) / divisor;
}

template <typename Codec>
BRAID_VECTOR_CLONES void Narrow(typename Codec::Storage* __restrict dst,
                                const float* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Codec::Store(src[i]);
}

}  // namespace

void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  CombineAny(dst, dst, src, count, dtype, op);
}

void Reduce3(void* out, const void* a, const void* b, size_t count, DataType dtype,
             ReduceOp op) {
  CombineAny(out, a, b, count, dtype, op);
}

void DivideInPlace(void* buf, size_t count, DataType dtype, int divisor) {
  switch (dtype) {
    case DataType::kFloat32: return DivideAs<Native<float>>(buf, count, divisor);
    case DataType::kFloat64: return DivideAs<Native<double>>(buf, count, divisor);
    case DataType::kFloat16: return DivideAs<Float16>(buf, count, divisor);
    case DataType::kBFloat16: return DivideAs<BFloat16>(buf, count, divisor);
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kUInt8:
      break;
  }
  LOG(FATAL) << "DivideInPlace is defined for floating-point types only, got "
             << DataTypeName(dtype) << " (" << static_cast<int>(dtype) << ")";
}

bool AccumulatesInFloat32(DataType dtype, ReduceOp op) {
  return (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) &&
         (op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kProduct);
}

void WidenToFloat32(float* dst, const void* src, size_t count, DataType dtype, int divisor) {
  const float d = static_cast<float>(divisor);
  const auto* s = static_cast<const uint16_t*>(src);
  switch (dtype) {
    case DataType::kFloat16:
#if defined(__x86_64__)
      if (HaveX86_64_V3()) return WidenF16c(dst, s, count, d);
#endif
      return Widen<Float16>(dst, s, count, d);
    case DataType::kBFloat16: return Widen<BFloat16>(dst, s, count, d);
    default: break;
  }
  LOG(FATAL) << "WidenToFloat32 takes float16 or bfloat16, got " << DataTypeName(dtype);
}

void NarrowFromFloat32(void* dst, const float* src, size_t count, DataType dtype) {
  auto* d = static_cast<uint16_t*>(dst);
  switch (dtype) {
    case DataType::kFloat16:
#if defined(__x86_64__)
      if (HaveX86_64_V3()) return NarrowF16c(d, src, count);
#endif
      return Narrow<Float16>(d, src, count);
    case DataType::kBFloat16: return Narrow<BFloat16>(d, src, count);
    default: break;
  }
  LOG(FATAL) << "NarrowFromFloat32 takes float16 or bfloat16, got " << DataTypeName(dtype);
}

}  // namespace braid::transport
