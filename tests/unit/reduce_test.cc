// transport/reduce.cc against straightforward scalar references written here: every op x
// dtype x size, in place and out of place (with aliasing), unaligned pointers, every float16
// and bfloat16 bit pattern against special values, and DivideInPlace. Half types are checked
// bit for bit against common/half.h (any NaN is accepted where the reference is NaN).
#include "transport/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/half.h"

namespace braid {
// Readable test parameters in gtest's failure messages (found by argument-dependent lookup).
void PrintTo(DataType dtype, std::ostream* os) { *os << DataTypeName(dtype); }
void PrintTo(ReduceOp op, std::ostream* os) { *os << ReduceOpName(op); }
}  // namespace braid

namespace braid::transport {
namespace {

using Bytes = std::vector<uint8_t>;

constexpr DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                  DataType::kBFloat16, DataType::kInt32,  DataType::kInt64,
                                  DataType::kUInt8};
constexpr ReduceOp kKernelOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                   ReduceOp::kProduct};

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

template <typename T>
T RefFloat(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    // NaN-propagating: the first NaN operand, else the plain comparison (b on ties).
    case ReduceOp::kMin: return std::isnan(a) ? a : std::isnan(b) ? b : a < b ? a : b;
    case ReduceOp::kMax: return std::isnan(a) ? a : std::isnan(b) ? b : a > b ? a : b;
    default: ADD_FAILURE() << "no reference for " << ReduceOpName(op); return a;
  }
}

// Integers: exact result in 128 bits, then wrapped to the width of T.
template <typename T>
T RefInt(ReduceOp op, T a, T b) {
  __int128 x = a, y = b, r = 0;
  switch (op) {
    case ReduceOp::kSum: r = x + y; break;
    case ReduceOp::kProduct: r = x * y; break;
    case ReduceOp::kMin: r = x < y ? x : y; break;
    case ReduceOp::kMax: r = x > y ? x : y; break;
    default: ADD_FAILURE() << "no reference for " << ReduceOpName(op);
  }
  return static_cast<T>(static_cast<uint64_t>(static_cast<unsigned __int128>(r)));
}

uint16_t RefHalf(ReduceOp op, uint16_t a, uint16_t b, bool bf16) {
  if (bf16) return FloatToBFloat16(RefFloat(op, BFloat16ToFloat(a), BFloat16ToFloat(b)));
  return FloatToFloat16(RefFloat(op, Float16ToFloat(a), Float16ToFloat(b)));
}

// out = a op b for element i, by the reference.
void RefElement(DataType dt, ReduceOp op, const uint8_t* a, const uint8_t* b, uint8_t* out) {
  switch (dt) {
    case DataType::kFloat32: return Put(out, RefFloat(op, Get<float>(a), Get<float>(b)));
    case DataType::kFloat64: return Put(out, RefFloat(op, Get<double>(a), Get<double>(b)));
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return Put(out, RefHalf(op, Get<uint16_t>(a), Get<uint16_t>(b),
                              dt == DataType::kBFloat16));
    case DataType::kInt32: return Put(out, RefInt(op, Get<int32_t>(a), Get<int32_t>(b)));
    case DataType::kInt64: return Put(out, RefInt(op, Get<int64_t>(a), Get<int64_t>(b)));
    case DataType::kUInt8: return Put(out, RefInt(op, Get<uint8_t>(a), Get<uint8_t>(b)));
  }
}

bool IsNaN(DataType dt, const uint8_t* p) {
  switch (dt) {
    case DataType::kFloat32: return std::isnan(Get<float>(p));
    case DataType::kFloat64: return std::isnan(Get<double>(p));
    case DataType::kFloat16: return (Get<uint16_t>(p) & 0x7fff) > 0x7c00;
    case DataType::kBFloat16: return (Get<uint16_t>(p) & 0x7fff) > 0x7f80;
    default: return false;
  }
}

std::string Hex(const uint8_t* p, size_t n) {
  std::string s = "0x";
  for (size_t i = n; i-- > 0;) absl::StrAppendFormat(&s, "%02x", p[i]);
  return s;
}

// Number of elements of `got` that differ from `want` (bit for bit; NaN matches any NaN);
// the first few are reported.
size_t CountMismatches(DataType dt, const uint8_t* got, const uint8_t* want, size_t count,
                       const std::string& what) {
  const size_t w = DataTypeSize(dt);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* g = got + i * w;
    const uint8_t* x = want + i * w;
    if (std::memcmp(g, x, w) == 0 || (IsNaN(dt, x) && IsNaN(dt, g))) continue;
    if (++bad <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << Hex(g, w) << ", want "
                    << Hex(x, w);
    }
  }
  return bad;
}

// Random inputs with negatives and, for floating types, special values mixed in.
Bytes RandomInput(DataType dt, size_t count, std::mt19937_64& rng) {
  const size_t w = DataTypeSize(dt);
  Bytes out(count * w);
  std::uniform_real_distribution<double> moderate(-100.0, 100.0);
  std::uniform_int_distribution<int> pick(0, 99);
  const float kSpecial32[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-40f,
                              3e38f, -3e38f, 1.0f, -1.0f};
  const double kSpecial64[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 5e-324, -1e-310,
                               1.7e308, -1.7e308, 1.0, -1.0};
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = out.data() + i * w;
    const int r = pick(rng);
    const uint64_t bits = rng();
    switch (dt) {
      case DataType::kFloat32:
        Put(p, r < 10 ? kSpecial32[bits % 11] : static_cast<float>(moderate(rng)));
        break;
      case DataType::kFloat64:
        Put(p, r < 10 ? kSpecial64[bits % 11] : moderate(rng));
        break;
      case DataType::kFloat16:  // raw patterns cover subnormals, inf, NaN, large values
        Put(p, r < 50 ? static_cast<uint16_t>(bits)
                      : FloatToFloat16(static_cast<float>(moderate(rng) / 10)));
        break;
      case DataType::kBFloat16:
        Put(p, r < 50 ? static_cast<uint16_t>(bits)
                      : FloatToBFloat16(static_cast<float>(moderate(rng))));
        break;
      case DataType::kInt32:  // small values too, so that min/max/sum see both kinds
        Put(p, r < 50 ? static_cast<int32_t>(bits) : static_cast<int32_t>(bits % 201) - 100);
        break;
      case DataType::kInt64:
        Put(p, r < 50 ? static_cast<int64_t>(bits) : static_cast<int64_t>(bits % 201) - 100);
        break;
      case DataType::kUInt8:
        Put(p, static_cast<uint8_t>(bits));
        break;
    }
  }
  return out;
}

Bytes Reference(DataType dt, ReduceOp op, const Bytes& a, const Bytes& b) {
  const size_t w = DataTypeSize(dt);
  Bytes out(a.size());
  for (size_t i = 0; i < a.size() / w; ++i) {
    RefElement(dt, op, a.data() + i * w, b.data() + i * w, out.data() + i * w);
  }
  return out;
}

using Case = std::tuple<DataType, ReduceOp, size_t>;

class ReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceTest, MatchesScalarReference) {
  const auto [dt, op, count] = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(dt) * 1000 + static_cast<uint64_t>(op) * 10 + count);
  const Bytes a = RandomInput(dt, count, rng);
  const Bytes b = RandomInput(dt, count, rng);
  const Bytes want = Reference(dt, op, a, b);
  const std::string name =
      absl::StrCat(DataTypeName(dt), " ", ReduceOpName(op), " count ", count);

  Bytes dst = a;
  ReduceInto(dst.data(), b.data(), count, dt, op);
  EXPECT_EQ(CountMismatches(dt, dst.data(), want.data(), count, name + " ReduceInto"), 0u);

  Bytes out(a.size(), 0xab);
  Reduce3(out.data(), a.data(), b.data(), count, dt, op);
  EXPECT_EQ(CountMismatches(dt, out.data(), want.data(), count, name + " Reduce3"), 0u);

  Bytes out_a = a;  // out == a
  Reduce3(out_a.data(), out_a.data(), b.data(), count, dt, op);
  EXPECT_EQ(CountMismatches(dt, out_a.data(), want.data(), count, name + " Reduce3 out==a"), 0u);

  Bytes out_b = b;  // out == b
  Reduce3(out_b.data(), a.data(), out_b.data(), count, dt, op);
  EXPECT_EQ(CountMismatches(dt, out_b.data(), want.data(), count, name + " Reduce3 out==b"), 0u);

  const Bytes want_self = Reference(dt, op, a, a);  // out == a == b
  Bytes self = a;
  Reduce3(self.data(), self.data(), self.data(), count, dt, op);
  EXPECT_EQ(CountMismatches(dt, self.data(), want_self.data(), count, name + " a op a"), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypesOpsSizes, ReduceTest,
    ::testing::Combine(::testing::ValuesIn(kAllTypes), ::testing::ValuesIn(kKernelOps),
                       ::testing::Values<size_t>(0, 1, 7, 33, 1000003)),
    [](const ::testing::TestParamInfo<Case>& info) {
      return absl::StrCat(DataTypeName(std::get<0>(info.param)), "_",
                          ReduceOpName(std::get<1>(info.param)), "_", std::get<2>(info.param));
    });

std::string TypeOpName(const ::testing::TestParamInfo<std::tuple<DataType, ReduceOp>>& info) {
  return absl::StrCat(DataTypeName(std::get<0>(info.param)), "_",
                      ReduceOpName(std::get<1>(info.param)));
}

// Buffers that start one element past a vector boundary, with guard elements on both sides
// that must stay untouched.
class ReduceOffsetTest : public ::testing::TestWithParam<std::tuple<DataType, ReduceOp>> {};

TEST_P(ReduceOffsetTest, UnalignedAndBounded) {
  const auto [dt, op] = GetParam();
  const size_t w = DataTypeSize(dt);
  std::mt19937_64 rng(42);
  for (size_t count : {0, 1, 7, 31, 33, 64, 1001}) {
    const Bytes a = RandomInput(dt, count + 2, rng);
    const Bytes b = RandomInput(dt, count + 2, rng);
    Bytes want = Reference(dt, op, a, b);
    std::memcpy(want.data(), a.data(), w);                                      // guard before
    std::memcpy(want.data() + (count + 1) * w, a.data() + (count + 1) * w, w);  // guard after
    Bytes dst = a;
    ReduceInto(dst.data() + w, b.data() + w, count, dt, op);
    EXPECT_EQ(CountMismatches(dt, dst.data(), want.data(), count + 2,
                              absl::StrCat(DataTypeName(dt), " ", ReduceOpName(op), " count ",
                                           count, " at offset 1")),
              0u);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesOps, ReduceOffsetTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kKernelOps)),
                         TypeOpName);

// Every float16 / bfloat16 bit pattern combined with each special value, both ways round:
// zeros, subnormals, the smallest normal, values that overflow on sum or product, inf, NaN,
// and values whose sums land on rounding ties.
class HalfExhaustiveTest : public ::testing::TestWithParam<std::tuple<DataType, ReduceOp>> {};

TEST_P(HalfExhaustiveTest, AllPatternsAgainstSpecials) {
  const auto [dt, op] = GetParam();
  const bool bf16 = dt == DataType::kBFloat16;
  const std::vector<uint16_t> specials =
      bf16 ? std::vector<uint16_t>{0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x8080, 0x3f80,
                                   0xbf80, 0x3f81, 0x4000, 0x7f7f, 0xff7f, 0x7f00, 0x7f80,
                                   0xff80, 0x7fc0, 0x7f81, 0x3b80, 0x3401}
           : std::vector<uint16_t>{0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400,
                                   0x8400, 0x3c00, 0xbc00, 0x3c01, 0x4000, 0x7bff, 0xfbff,
                                   0x7800, 0x5bff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x1400,
                                   0x1001, 0x0200};
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<uint16_t> other(all.size()), out(all.size()), want(all.size());
  for (uint16_t s : specials) {
    for (int order = 0; order < 2; ++order) {
      std::fill(other.begin(), other.end(), s);
      const std::vector<uint16_t>& a = order == 0 ? all : other;
      const std::vector<uint16_t>& b = order == 0 ? other : all;
      for (size_t i = 0; i < all.size(); ++i) want[i] = RefHalf(op, a[i], b[i], bf16);
      Reduce3(out.data(), a.data(), b.data(), all.size(), dt, op);
      EXPECT_EQ(CountMismatches(dt, reinterpret_cast<const uint8_t*>(out.data()),
                                reinterpret_cast<const uint8_t*>(want.data()), all.size(),
                                absl::StrFormat("%s %s special 0x%04x order %d", DataTypeName(dt),
                                                ReduceOpName(op), s, order)),
                0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    HalfTypes, HalfExhaustiveTest,
    ::testing::Combine(::testing::Values(DataType::kFloat16, DataType::kBFloat16),
                       ::testing::ValuesIn(kKernelOps)),
    TypeOpName);

// Hand-checked values, so that a reference and a kernel wrong in the same way still fail.
TEST(ReduceKnownValues, Float16) {
  // 65504 + 16 = 65520 is the rounding tie to infinity; 1 + 2^-11 ties to even (1.0);
  // 2^-24 * 0.5 is a tie and rounds to +0; 2^-24 + 2^-24 = 2^-23 (subnormal).
  const std::vector<uint16_t> a = {0x7bff, 0x3c00, 0x0001, 0x0001, 0x7bff, 0xc000};
  const std::vector<uint16_t> b = {0x4c00, 0x1000, 0x3800, 0x0001, 0x3c00, 0x4200};
  std::vector<uint16_t> sum(a.size()), prod(a.size());
  Reduce3(sum.data(), a.data(), b.data(), a.size(), DataType::kFloat16, ReduceOp::kSum);
  Reduce3(prod.data(), a.data(), b.data(), a.size(), DataType::kFloat16, ReduceOp::kProduct);
  EXPECT_EQ(sum[0], 0x7c00);   // 65504 + 16 -> inf
  EXPECT_EQ(sum[1], 0x3c00);   // 1 + 2^-11 -> 1
  EXPECT_EQ(prod[2], 0x0000);  // 2^-24 * 0.5 -> 0
  EXPECT_EQ(sum[3], 0x0002);   // 2^-24 + 2^-24
  EXPECT_EQ(prod[4], 0x7bff);  // 65504 * 1
  EXPECT_EQ(sum[5], 0x3c00);   // -2 + 3 = 1
  EXPECT_EQ(prod[5], 0xc600);  // -2 * 3 = -6
}

TEST(ReduceKnownValues, BFloat16AndIntegers) {
  std::vector<uint16_t> bf = {0x3f80, 0x7f7f};   // 1.0, max finite
  std::vector<uint16_t> bf2 = {0x3b80, 0x7f7f};  // 2^-8 (a tie: 1 + 2^-8 -> 1), max
  ReduceInto(bf.data(), bf2.data(), 2, DataType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(bf[0], 0x3f80);
  EXPECT_EQ(bf[1], 0x7f80);  // overflow to inf

  std::vector<int32_t> i32 = {INT32_MAX, INT32_MIN, -5, 65536};
  std::vector<int32_t> j32 = {1, -1, 3, 65536};
  std::vector<int32_t> p32 = i32;
  ReduceInto(i32.data(), j32.data(), 4, DataType::kInt32, ReduceOp::kSum);
  ReduceInto(p32.data(), j32.data(), 4, DataType::kInt32, ReduceOp::kProduct);
  EXPECT_EQ(i32, (std::vector<int32_t>{INT32_MIN, INT32_MAX, -2, 131072}));
  EXPECT_EQ(p32, (std::vector<int32_t>{INT32_MAX, INT32_MIN, -15, 0}));

  std::vector<uint8_t> u8 = {250, 3, 16, 0};
  std::vector<uint8_t> v8 = {10, 200, 16, 255};
  std::vector<uint8_t> s8(4), m8(4), n8(4);
  Reduce3(s8.data(), u8.data(), v8.data(), 4, DataType::kUInt8, ReduceOp::kSum);
  Reduce3(m8.data(), u8.data(), v8.data(), 4, DataType::kUInt8, ReduceOp::kProduct);
  Reduce3(n8.data(), u8.data(), v8.data(), 4, DataType::kUInt8, ReduceOp::kMin);
  EXPECT_EQ(s8, (std::vector<uint8_t>{4, 203, 32, 255}));
  EXPECT_EQ(m8, (std::vector<uint8_t>{196, 88, 0, 0}));
  EXPECT_EQ(n8, (std::vector<uint8_t>{10, 3, 16, 0}));

  std::vector<int64_t> i64 = {INT64_MAX, -7, int64_t{1} << 40};
  std::vector<int64_t> j64 = {2, 9, int64_t{1} << 30};
  ReduceInto(i64.data(), j64.data(), 3, DataType::kInt64, ReduceOp::kProduct);
  EXPECT_EQ(i64, (std::vector<int64_t>{-2, -63, 0}));  // 2^70 wraps to 0
}

TEST(ReduceKnownValues, FloatMinMaxNaNOrder) {
  // A NaN in either operand is the result (the first NaN when both are: payload 1 here), so
  // a NaN on any rank survives; -0 vs +0 returns b.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float nan1, nan2;
  const uint32_t p1 = 0x7fc00001u, p2 = 0x7fc00002u;
  std::memcpy(&nan1, &p1, 4);
  std::memcpy(&nan2, &p2, 4);
  // Nine elements: the vector loop and its scalar tail both see every case.
  std::vector<float> a = {nan, 1.0f, -0.0f, 0.0f, nan1, 2.0f, nan, 1.0f, -0.0f};
  std::vector<float> b = {1.0f, nan, 0.0f, -0.0f, nan2, 3.0f, 1.0f, nan, 0.0f};
  std::vector<float> mn(9), mx(9);
  Reduce3(mn.data(), a.data(), b.data(), 9, DataType::kFloat32, ReduceOp::kMin);
  Reduce3(mx.data(), a.data(), b.data(), 9, DataType::kFloat32, ReduceOp::kMax);
  for (int i : {0, 1, 6, 7}) {
    EXPECT_TRUE(std::isnan(mn[i])) << i;
    EXPECT_TRUE(std::isnan(mx[i])) << i;
  }
  uint32_t bits;
  std::memcpy(&bits, &mn[4], 4);
  EXPECT_EQ(bits, p1);
  std::memcpy(&bits, &mx[4], 4);
  EXPECT_EQ(bits, p1);
  EXPECT_EQ(mn[5], 2.0f);
  EXPECT_EQ(mx[5], 3.0f);
  EXPECT_TRUE(std::signbit(mx[3]) && mx[3] == 0.0f);
  EXPECT_FALSE(std::signbit(mn[2]));

  // The same through the 16-bit codecs, 17 elements (two vectors of 8 and a tail).
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    const uint16_t qnan = dt == DataType::kFloat16 ? 0x7e00 : 0x7fc0;
    const uint16_t one = dt == DataType::kFloat16 ? 0x3c00 : 0x3f80;
    std::vector<uint16_t> x(17, one), y(17, one), lo(17), hi(17);
    for (int i : {0, 9, 16}) x[i] = qnan;
    for (int i : {3, 12}) y[i] = qnan;
    Reduce3(lo.data(), x.data(), y.data(), 17, dt, ReduceOp::kMin);
    Reduce3(hi.data(), x.data(), y.data(), 17, dt, ReduceOp::kMax);
    for (int i = 0; i < 17; ++i) {
      const bool want_nan = i == 0 || i == 9 || i == 16 || i == 3 || i == 12;
      const uint16_t mask = dt == DataType::kFloat16 ? 0x7c00 : 0x7f80;
      auto is_nan = [&](uint16_t v) { return (v & mask) == mask && (v & ~0x8000 & ~mask) != 0; };
      EXPECT_EQ(is_nan(lo[i]), want_nan) << DataTypeName(dt) << " min [" << i << "]";
      EXPECT_EQ(is_nan(hi[i]), want_nan) << DataTypeName(dt) << " max [" << i << "]";
    }
  }
}

// Widening to float32 (and dividing) and narrowing back, every 16-bit pattern, against the
// scalar references of common/half.h.
TEST(WidenNarrow, EveryPatternAgainstHalfH) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    const bool bf16 = dt == DataType::kBFloat16;
    for (int divisor : {1, 3, 4}) {
      std::vector<float> wide(all.size());
      WidenToFloat32(wide.data(), all.data(), all.size(), dt, divisor);
      size_t bad = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        const float want =
            (bf16 ? BFloat16ToFloat(all[i]) : Float16ToFloat(all[i])) / static_cast<float>(divisor);
        if (!(std::memcmp(&want, &wide[i], 4) == 0 || (std::isnan(want) && std::isnan(wide[i])))) {
          if (++bad <= 3) ADD_FAILURE() << DataTypeName(dt) << " / " << divisor << " pattern " << i;
        }
      }
      EXPECT_EQ(bad, 0u);
    }
    std::vector<float> wide(all.size());
    WidenToFloat32(wide.data(), all.data(), all.size(), dt, 1);
    std::vector<uint16_t> back(all.size());
    NarrowFromFloat32(back.data(), wide.data(), wide.size(), dt);
    EXPECT_EQ(CountMismatches(dt, reinterpret_cast<const uint8_t*>(back.data()),
                              reinterpret_cast<const uint8_t*>(all.data()), all.size(),
                              absl::StrCat(DataTypeName(dt), " round trip")),
              0u);
    // Rounding: 65520 ties to infinity in float16, 1 + 2^-9 to 1 in bfloat16.
    const std::vector<float> f = {65519.0f, 65520.0f, 1.0f + 0x1p-9f, -1e-9f};
    std::vector<uint16_t> h(f.size());
    NarrowFromFloat32(h.data(), f.data(), f.size(), dt);
    for (size_t i = 0; i < f.size(); ++i) {
      EXPECT_EQ(h[i], bf16 ? FloatToBFloat16(f[i]) : FloatToFloat16(f[i])) << f[i];
    }
  }
  EXPECT_TRUE(AccumulatesInFloat32(DataType::kFloat16, ReduceOp::kAverage));
  EXPECT_TRUE(AccumulatesInFloat32(DataType::kBFloat16, ReduceOp::kProduct));
  EXPECT_FALSE(AccumulatesInFloat32(DataType::kFloat16, ReduceOp::kMax));
  EXPECT_FALSE(AccumulatesInFloat32(DataType::kFloat32, ReduceOp::kSum));
}

// A NaN narrows to the same float16 bits on every path: the scalar reference (half.h), the
// portable kernel and F16C's vcvtps2ph (used on x86-64-v3 for blocks of 8, the scalar code
// for the tail) all quiet it and keep its payload's top bits, as the GPU kernels, which
// share half.h, do. 17 elements: two vector blocks and a tail, each holding every NaN.
TEST(WidenNarrow, NaNPayloadsNarrowAlikeOnEveryPath) {
  const uint32_t nans[] = {0x7fa00000u, 0x7fffe000u, 0xffc12345u, 0x7f800001u, 0x7fc00000u};
  std::vector<float> f(17);
  for (size_t i = 0; i < f.size(); ++i) {
    const uint32_t b = nans[i % 5];
    std::memcpy(&f[i], &b, 4);
  }
  EXPECT_EQ(FloatToFloat16(f[0]), 0x7f00);  // 0x7fa00000: quieted, payload bit kept
  EXPECT_EQ(FloatToFloat16(f[1]), 0x7fff);
  EXPECT_EQ(FloatToFloat16(f[2]), 0xfe09);  // sign kept, payload's top 9 bits
  std::vector<uint16_t> h(f.size());
  NarrowFromFloat32(h.data(), f.data(), f.size(), DataType::kFloat16);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(h[i], FloatToFloat16(f[i])) << i;
  // Through a reduction of NaNs with ones (max keeps the NaN of `a`), F16C or not.
  std::vector<uint16_t> a(f.size()), ones(f.size(), 0x3c00), out(f.size());
  for (size_t i = 0; i < f.size(); ++i) a[i] = FloatToFloat16(f[i]);
  Reduce3(out.data(), a.data(), ones.data(), out.size(), DataType::kFloat16, ReduceOp::kSum);
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(out[i], FloatToFloat16(Float16ToFloat(a[i]) + 1.0f)) << i;
  }
}

TEST(ReduceKnownValues, ZeroCountTouchesNothing) {
  ReduceInto(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum);
  Reduce3(nullptr, nullptr, nullptr, 0, DataType::kFloat16, ReduceOp::kMax);
  DivideInPlace(nullptr, 0, DataType::kBFloat16, 3);
}

// ---- DivideInPlace ----

class DivideTest : public ::testing::TestWithParam<std::tuple<DataType, int>> {};

TEST_P(DivideTest, MatchesScalarReference) {
  const auto [dt, divisor] = GetParam();
  std::mt19937_64 rng(divisor);
  Bytes buf;
  if (dt == DataType::kFloat16 || dt == DataType::kBFloat16) {
    buf.resize(2 * 65536);  // every bit pattern
    for (uint32_t i = 0; i < 65536; ++i) Put(buf.data() + 2 * i, static_cast<uint16_t>(i));
  } else {
    buf = RandomInput(dt, 1000003, rng);
  }
  const size_t w = DataTypeSize(dt);
  const size_t count = buf.size() / w;
  Bytes want(buf.size());
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* p = buf.data() + i * w;
    uint8_t* q = want.data() + i * w;
    switch (dt) {
      case DataType::kFloat32: Put(q, Get<float>(p) / static_cast<float>(divisor)); break;
      case DataType::kFloat64: Put(q, Get<double>(p) / static_cast<double>(divisor)); break;
      case DataType::kFloat16:
        Put(q, FloatToFloat16(Float16ToFloat(Get<uint16_t>(p)) / static_cast<float>(divisor)));
        break;
      case DataType::kBFloat16:
        Put(q,
            FloatToBFloat16(BFloat16ToFloat(Get<uint16_t>(p)) / static_cast<float>(divisor)));
        break;
      default: FAIL();
    }
  }
  DivideInPlace(buf.data(), count, dt, divisor);
  EXPECT_EQ(CountMismatches(dt, buf.data(), want.data(), count,
                            absl::StrCat(DataTypeName(dt), " / ", divisor)),
            0u);
}

INSTANTIATE_TEST_SUITE_P(
    FloatTypes, DivideTest,
    ::testing::Combine(::testing::Values(DataType::kFloat32, DataType::kFloat64,
                                         DataType::kFloat16, DataType::kBFloat16),
                       ::testing::Values(1, 2, 3, 7, 1000, 1 << 20)),
    [](const ::testing::TestParamInfo<std::tuple<DataType, int>>& info) {
      return absl::StrCat(DataTypeName(std::get<0>(info.param)), "_by_",
                          std::get<1>(info.param));
    });

TEST(DivideKnownValues, Float16AverageOfFour) {
  std::vector<uint16_t> v = {0x4c00, 0x3c00, 0x0001, 0x7c00};  // 16, 1, 2^-24, inf
  DivideInPlace(v.data(), v.size(), DataType::kFloat16, 4);
  EXPECT_EQ(v, (std::vector<uint16_t>{0x4400, 0x3400, 0x0000, 0x7c00}));  // 4, .25, 0, inf
}

// ---- Rejected arguments ----

TEST(ReduceDeathTest, AverageIsRejected) {
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  EXPECT_DEATH(ReduceInto(a.data(), b.data(), 4, DataType::kFloat32, ReduceOp::kAverage),
               "average is sum followed by DivideInPlace");
  EXPECT_DEATH(Reduce3(a.data(), a.data(), b.data(), 4, DataType::kFloat16, ReduceOp::kAverage),
               "got average");
}

TEST(ReduceDeathTest, DivideOfIntegerIsRejected) {
  std::vector<int32_t> v(4, 8);
  EXPECT_DEATH(DivideInPlace(v.data(), 4, DataType::kInt32, 2), "floating-point types only");
}

}  // namespace
}  // namespace braid::transport
