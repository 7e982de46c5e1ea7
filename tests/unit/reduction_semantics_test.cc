// What a reduction returns near the edges of its dtype, for every all-reduce and
// reduce-scatter algorithm on 2-5 ranks (threads on the in-process backend):
//  - Note [16-bit arithmetic]: a float16 / bfloat16 average of values near the format's
//    maximum is the true average rounded once (before, 65504 + 65504 overflowed to inf), and
//    a sum whose partial sums leave the format but whose result does not is that result;
//  - a NaN on any one rank gives NaN on every rank for sum, average, min, max and product
//    (std::min-style comparisons would drop a NaN held by the lower rank), and infinities of
//    both signs give NaN for sum and average.
// The expected values are computed here in double and rounded once to the dtype.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "tests/testing/local_world.h"
#include "transport/collectives.h"
#include "transport/ring_schedule.h"

namespace braid::transport {
namespace {

using braid::testing::RunLocalContexts;

using AllReduceFn = absl::Status (*)(Context&, const void*, void*, size_t, DataType, ReduceOp);
using ReduceScatterFn = absl::Status (*)(Context&, const void*, void*, absl::Span<const size_t>,
                                         DataType, ReduceOp);
const std::pair<const char*, AllReduceFn> kAllReduces[] = {
    {"recursive doubling", &AllReduceRecursiveDoubling},
    {"direct", &AllReduceDirect},
    {"ring", &AllReduceRing}};
const std::pair<const char*, ReduceScatterFn> kReduceScatters[] = {
    {"direct reduce-scatter", &ReduceScatterDirect}, {"ring reduce-scatter", &ReduceScatterRing}};

CollectiveOptions Options() {
  CollectiveOptions o;
  o.chunk_bytes = 24;  // several pipeline pieces per segment
  o.ring_window = 2;
  o.timeout = absl::Seconds(30);
  return o;
}

double Get(const std::vector<char>& buf, size_t i, DataType dt) {
  switch (dt) {
    case DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      return Float16ToFloat(h);
    }
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      return BFloat16ToFloat(h);
    }
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, buf.data() + 4 * i, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, buf.data() + 8 * i, 8);
      return d;
    }
  }
}

// Stores v rounded once to dt (through float for the 16-bit types: exact for the values used).
void Put(std::vector<char>& buf, size_t i, DataType dt, double v) {
  switch (dt) {
    case DataType::kFloat16: {
      uint16_t h = FloatToFloat16(static_cast<float>(v));
      std::memcpy(buf.data() + 2 * i, &h, 2);
      return;
    }
    case DataType::kBFloat16: {
      uint16_t h = FloatToBFloat16(static_cast<float>(v));
      std::memcpy(buf.data() + 2 * i, &h, 2);
      return;
    }
    case DataType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(buf.data() + 4 * i, &f, 4);
      return;
    }
    default: std::memcpy(buf.data() + 8 * i, &v, 8);
  }
}

double RoundTo(DataType dt, double v) {
  std::vector<char> one(8);
  Put(one, 0, dt, v);
  return Get(one, 0, dt);
}

// Runs every all-reduce and reduce-scatter algorithm on `n` ranks over `count` elements that
// rank r fills with value(r, i), and checks element i of every rank's result with
// check(i, got, what).
void ForEveryAlgorithm(int n, size_t count, DataType dt, ReduceOp op,
                       const std::function<double(int rank, size_t i)>& value,
                       const std::function<void(size_t i, double got, const std::string&)>& check) {
  const size_t e = DataTypeSize(dt);
  const std::vector<Span1D> segs = PartitionEven(count, n);
  std::vector<size_t> counts;
  for (const Span1D& s : segs) counts.push_back(s.count);
  RunLocalContexts(n, Options(), [&](int rank, Context& ctx) {
    std::vector<char> in(count * e), out(count * e), mine(segs[rank].count * e + 1);
    for (size_t i = 0; i < count; ++i) Put(in, i, dt, value(rank, i));
    const std::string where = absl::StrCat(DataTypeName(dt), " ", ReduceOpName(op), ", rank ",
                                           rank, " of ", n, ", ");
    for (const auto& [name, fn] : kAllReduces) {
      ASSERT_TRUE(fn(ctx, in.data(), out.data(), count, dt, op).ok()) << name;
      for (size_t i = 0; i < count; ++i) check(i, Get(out, i, dt), where + name);
    }
    for (const auto& [name, fn] : kReduceScatters) {
      ASSERT_TRUE(fn(ctx, in.data(), mine.data(), counts, dt, op).ok()) << name;
      for (size_t i = 0; i < segs[rank].count; ++i) {
        check(segs[rank].offset + i, Get(mine, i, dt), where + name);
      }
    }
  });
}

class ReductionSemanticsTest : public ::testing::TestWithParam<int> {};

// Every rank holds a value within a few units in the last place of the format's largest
// finite value: the true average is representable, and is what every algorithm returns.
TEST_P(ReductionSemanticsTest, SixteenBitAverageNearTheMaximumIsTheTrueAverage) {
  const int n = GetParam();
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    const double max = dt == DataType::kFloat16 ? 65504.0 : BFloat16ToFloat(0x7f7f);
    const double ulp = dt == DataType::kFloat16 ? 32.0 : std::ldexp(1.0, 127 - 7);
    constexpr size_t kCount = 61;
    // Element i: rank r holds max - ((i + r) % 4) ulp (element 0: max on every rank).
    auto value = [&](int r, size_t i) {
      return i == 0 ? max : max - static_cast<double>((i + r) % 4) * ulp;
    };
    ForEveryAlgorithm(n, kCount, dt, ReduceOp::kAverage, value,
                      [&](size_t i, double got, const std::string& what) {
                        double sum = 0;
                        for (int r = 0; r < n; ++r) sum += value(r, i);
                        const double want = RoundTo(dt, sum / n);
                        ASSERT_TRUE(std::isfinite(want));
                        EXPECT_EQ(got, want) << what << " [" << i << "]";
                      });
  }
}

// A sum whose result fits although a partial sum does not: max, max, -max, ... alternating
// (an odd world ends on +max; an even one on 0). 16-bit partial sums would overflow to inf.
TEST_P(ReductionSemanticsTest, SixteenBitSumKeepsPartialSumsInFloat32) {
  const int n = GetParam();
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    const double big = dt == DataType::kFloat16 ? 60000.0 : 1e38;
    auto value = [&](int r, size_t i) {
      return r == 0 ? big : (r % 2 == 1 ? big : -big) * (i % 2 == 0 ? 1 : -1);
    };
    ForEveryAlgorithm(n, 37, dt, ReduceOp::kSum, value,
                      [&](size_t i, double got, const std::string& what) {
                        double sum = 0;
                        for (int r = 0; r < n; ++r) sum += RoundTo(dt, value(r, i));
                        EXPECT_EQ(got, RoundTo(dt, sum)) << what << " [" << i << "]";
                      });
  }
}

// Element i has a NaN on rank i % n only (every rank holds one somewhere); the other elements
// are finite. Every rank's result is NaN exactly at those elements, whatever the op.
TEST_P(ReductionSemanticsTest, NaNOnAnyRankReachesEveryRank) {
  const int n = GetParam();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr size_t kCount = 41;
  for (DataType dt :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                        ReduceOp::kProduct}) {
      // Elements i % 3 == 0 hold the NaN, on rank (i / 3) % n; -1 and 1 elsewhere, so that min
      // and max have a finite answer to prefer.
      auto value = [&](int r, size_t i) {
        if (i % 3 == 0 && static_cast<int>(i / 3) % n == r) return nan;
        return (r + i) % 2 ? 1.0 : -1.0;
      };
      ForEveryAlgorithm(n, kCount, dt, op, value,
                        [&](size_t i, double got, const std::string& what) {
                          EXPECT_EQ(std::isnan(got), i % 3 == 0)
                              << what << " [" << i << "] = " << got;
                        });
    }
  }
}

// +inf on one rank: sum, average and max are +inf; +inf and -inf on two ranks: sum and
// average are NaN, min -inf, max +inf.
TEST_P(ReductionSemanticsTest, InfinitiesFollowIeee) {
  const int n = GetParam();
  const double inf = std::numeric_limits<double>::infinity();
  for (DataType dt :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    // Element 0: +inf on the last rank; element 1: +inf on rank 0 and -inf on the last.
    auto value = [&](int r, size_t i) {
      if (i == 0) return r == n - 1 ? inf : 2.0;
      if (r == 0) return inf;
      return r == n - 1 ? -inf : 2.0;
    };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax}) {
      ForEveryAlgorithm(n, 2, dt, op, value, [&](size_t i, double got, const std::string& what) {
        double want;
        if (op == ReduceOp::kMin) {
          want = i == 0 ? (n == 1 ? inf : 2.0) : -inf;
        } else if (op == ReduceOp::kMax) {
          want = inf;
        } else {
          want = i == 0 ? inf : std::nan("");
        }
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << what << " [" << i << "] = " << got;
        } else {
          EXPECT_EQ(got, want) << what << " [" << i << "]";
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReductionSemanticsTest, ::testing::Range(2, 6),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "ranks");
                         });

}  // namespace
}  // namespace braid::transport
