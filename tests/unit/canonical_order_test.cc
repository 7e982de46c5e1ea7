// The summation order of every reduction algorithm, bit for bit, on the in-process backend:
// recursive doubling and the direct reduce-scatter (alone or in an all-reduce) must give
// exactly the canonical tree of Note [Canonical reduction order], the ring reduce-scatter
// exactly its documented ring order; and through the Communicator a tensor must reduce to the
// same bits fused with others as alone. The references are evaluated here, element by element,
// from the documented orders, on values chosen so that the order shows: random magnitudes over
// 2^-12 .. 2^12 for sum and product, and signed zeros and NaNs with distinct payloads for min
// and max (whose results depend on which operand comes first).
#include <cmath>
#include <cstring>
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
using braid::testing::RunLocalWorld;

const DataType kFloatTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                DataType::kBFloat16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kProduct};

// One element of a floating-point dtype, as bits.
using Bits = uint64_t;

double Load(Bits b, DataType dt) {
  switch (dt) {
    case DataType::kFloat32: {
      float f;
      uint32_t u = static_cast<uint32_t>(b);
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, &b, 8);
      return d;
    }
    case DataType::kFloat16: return Float16ToFloat(static_cast<uint16_t>(b));
    default: return BFloat16ToFloat(static_cast<uint16_t>(b));
  }
}

// Rounds once to the dtype (float16 / bfloat16 through float, as the kernels do).
Bits Store(double v, DataType dt) {
  switch (dt) {
    case DataType::kFloat32: {
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }
    case DataType::kFloat64: {
      Bits b;
      std::memcpy(&b, &v, 8);
      return b;
    }
    case DataType::kFloat16: return FloatToFloat16(static_cast<float>(v));
    default: return FloatToBFloat16(static_cast<float>(v));
  }
}

// Note [16-bit arithmetic]: float16 / bfloat16 sums, averages and products are computed in
// float32 and rounded once; an average pre-divides each rank's value.
bool Wide(DataType dt, ReduceOp op) {
  return (dt == DataType::kFloat16 || dt == DataType::kBFloat16) &&
         (op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kProduct);
}

// The type the reduction computes in.
DataType Arith(DataType dt, ReduceOp op) { return Wide(dt, op) ? DataType::kFloat32 : dt; }

// What rank's element x enters the tree as: itself, or for 16-bit arithmetic its float32
// value (divided by n for an average).
Bits Leaf(Bits x, int n, DataType dt, ReduceOp op) {
  if (!Wide(dt, op)) return x;
  float f = static_cast<float>(Load(x, dt));
  if (op == ReduceOp::kAverage) f /= static_cast<float>(n);
  return Store(f, DataType::kFloat32);
}

// a op b in the arithmetic type `at` (float32 for float32 and 16-bit arithmetic, double for
// float64, float32 rounded back for 16-bit min/max), as reduce.h documents. min/max return
// the first NaN operand, else the plain comparison (the second operand on ties), so they
// return one operand's bits unchanged.
Bits Combine(Bits x, Bits y, DataType at, ReduceOp op) {
  const double a = Load(x, at), b = Load(y, at);  // exact for every one of these dtypes
  if (op == ReduceOp::kMin) return std::isnan(a) ? x : std::isnan(b) ? y : a < b ? x : y;
  if (op == ReduceOp::kMax) return std::isnan(a) ? x : std::isnan(b) ? y : a > b ? x : y;
  if (at == DataType::kFloat64) return Store(op == ReduceOp::kProduct ? a * b : a + b, at);
  const float fa = static_cast<float>(a), fb = static_cast<float>(b);
  return Store(op == ReduceOp::kProduct ? fa * fb : fa + fb, at);
}

// The result from the tree's value: 16-bit arithmetic rounded once (pre-divided already),
// other averages divided.
Bits Finish(Bits acc, int n, DataType dt, ReduceOp op) {
  if (Wide(dt, op)) return Store(Load(acc, DataType::kFloat32), dt);
  if (op != ReduceOp::kAverage) return acc;
  if (dt == DataType::kFloat64) return Store(Load(acc, dt) / n, dt);
  return Store(static_cast<float>(Load(acc, dt)) / static_cast<float>(n), dt);
}

// The canonical tree as Note [Canonical reduction order] words it: ranks 2i and 2i+1 first
// for i < rem, then a balanced binary tree over what is left, lower operand first.
Bits TreeReference(const std::vector<Bits>& in, DataType dt, ReduceOp op) {
  const int n = static_cast<int>(in.size());
  const DataType at = Arith(dt, op);
  std::vector<Bits> v;
  for (Bits x : in) v.push_back(Leaf(x, n, dt, op));
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  std::vector<Bits> t;
  for (int i = 0; i < rem; ++i) t.push_back(Combine(v[2 * i], v[2 * i + 1], at, op));
  for (int i = 2 * rem; i < n; ++i) t.push_back(v[i]);
  for (int w = 1; w < p2; w *= 2) {
    for (int i = 0; i + w < p2; i += 2 * w) t[i] = Combine(t[i], t[i + w], at, op);
  }
  return Finish(t[0], n, dt, op);
}

// The ring order as AllReduceRing documents it: one rank at a time from `start` around.
Bits RingReference(const std::vector<Bits>& in, int start, DataType dt, ReduceOp op) {
  const int n = static_cast<int>(in.size());
  const DataType at = Arith(dt, op);
  Bits acc = Leaf(in[start], n, dt, op);
  for (int t = 1; t < n; ++t) acc = Combine(acc, Leaf(in[(start + t) % n], n, dt, op), at, op);
  return Finish(acc, n, dt, op);
}

// SplitMix64: a cheap, well-mixed hash to draw reproducible test values from.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's element i: order-sensitive values for `op`, deterministic per (rank, i, dtype).
Bits MakeValue(int rank, size_t i, DataType dt, ReduceOp op) {
  const uint64_t h = Mix(static_cast<uint64_t>(rank) << 40 ^ i << 8 ^ static_cast<uint64_t>(dt));
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
    const bool wide = dt == DataType::kFloat32 || dt == DataType::kFloat64;
    switch (h % 4) {
      case 0: return Store(-0.0, dt);
      case 1: return Store(0.0, dt);
      case 2:
        if (!wide) break;  // 16-bit conversions do not keep NaN payloads
        // A quiet NaN whose payload names the rank.
        return dt == DataType::kFloat32 ? Bits{0x7fc00000u + static_cast<uint32_t>(rank) + 1}
                                        : Bits{0x7ff8000000000000ull + static_cast<Bits>(rank) + 1};
    }
    return Store(rank % 2 ? 1.0 : -1.0, dt);
  }
  const double mantissa = 0.5 + 0.5 * static_cast<double>(h >> 11) / 9007199254740992.0;
  const int e = static_cast<int>((h >> 3) % 25) - 12;
  const double sign = (h & 1) ? 1.0 : -1.0;
  return Store(sign * std::ldexp(mantissa, op == ReduceOp::kProduct ? e / 4 : e), dt);
}

void FillValues(char* buf, size_t count, int rank, DataType dt, ReduceOp op) {
  const size_t e = DataTypeSize(dt);
  for (size_t i = 0; i < count; ++i) {
    const Bits b = MakeValue(rank, i, dt, op);
    std::memcpy(buf + i * e, &b, e);  // little-endian: the low bytes are the element
  }
}

Bits ElementOf(const char* buf, size_t i, DataType dt) {
  Bits b = 0;
  std::memcpy(&b, buf + i * DataTypeSize(dt), DataTypeSize(dt));
  return b;
}

std::vector<Bits> Column(int n, size_t i, DataType dt, ReduceOp op) {
  std::vector<Bits> v(n);
  for (int r = 0; r < n; ++r) v[r] = MakeValue(r, i, dt, op);
  return v;
}

// A reference per element i in [offset, offset + count), compared bit for bit with `got`.
template <typename Ref>
void ExpectBits(const char* got, size_t count, size_t offset, DataType dt, const Ref& ref,
                const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const Bits want = ref(offset + i), have = ElementOf(got, i, dt);
    if (want != have && bad++ < 3) {
      ADD_FAILURE() << what << " [" << offset + i << "]: got bits " << std::hex << have
                    << ", want " << want;
    }
  }
}

constexpr size_t kCount = 203;

CollectiveOptions SmallPieces() {
  CollectiveOptions o;
  o.chunk_bytes = 56;
  o.ring_window = 2;
  o.timeout = absl::Seconds(30);
  return o;
}

class CanonicalOrderTest : public ::testing::TestWithParam<int> {};

TEST_P(CanonicalOrderTest, TreeAlgorithmsGiveTheCanonicalTreeAndTheRingItsOrder) {
  const int n = GetParam();
  RunLocalContexts(n, SmallPieces(), [&](int rank, Context& ctx) {
    for (DataType dt : kFloatTypes) {
      for (ReduceOp op : kOps) {
        const size_t e = DataTypeSize(dt);
        std::vector<char> in(kCount * e), out(kCount * e);
        FillValues(in.data(), kCount, rank, dt, op);
        const std::string what =
            absl::StrCat(DataTypeName(dt), " ", ReduceOpName(op), " rank ", rank, " of ", n);
        auto tree = [&](size_t i) { return TreeReference(Column(n, i, dt, op), dt, op); };
        ASSERT_TRUE(AllReduceRecursiveDoubling(ctx, in.data(), out.data(), kCount, dt, op).ok());
        ExpectBits(out.data(), kCount, 0, dt, tree, "recursive doubling " + what);
        ASSERT_TRUE(AllReduceDirect(ctx, in.data(), out.data(), kCount, dt, op).ok());
        ExpectBits(out.data(), kCount, 0, dt, tree, "direct all-reduce " + what);
        // Ring all-reduce: segment k is owned by rank k-1 and summed from rank k on.
        const std::vector<Span1D> segs = PartitionEven(kCount, n);
        auto ring = [&](size_t i) {
          int k = 0;
          while (i >= segs[k].offset + segs[k].count) ++k;
          return RingReference(Column(n, i, dt, op), k % n, dt, op);
        };
        ASSERT_TRUE(AllReduceRing(ctx, in.data(), out.data(), kCount, dt, op).ok());
        ExpectBits(out.data(), kCount, 0, dt, ring, "ring all-reduce " + what);
        // Reduce-scatter: rank r owns segment r; the ring sums it from rank r+1 on.
        std::vector<size_t> counts;
        for (const Span1D& s : segs) counts.push_back(s.count);
        std::vector<char> mine(segs[rank].count * e + 1);
        ASSERT_TRUE(ReduceScatterDirect(ctx, in.data(), mine.data(), counts, dt, op).ok());
        ExpectBits(mine.data(), segs[rank].count, segs[rank].offset, dt, tree,
                   "direct reduce-scatter " + what);
        ASSERT_TRUE(ReduceScatterRing(ctx, in.data(), mine.data(), counts, dt, op).ok());
        ExpectBits(mine.data(), segs[rank].count, segs[rank].offset, dt,
                   [&](size_t i) { return RingReference(Column(n, i, dt, op), (rank + 1) % n, dt, op); },
                   "ring reduce-scatter " + what);
      }
    }
  });
}

// The values above do depend on the order, so the test above can fail: summed along the ring
// from rank 1 they differ from the tree for some element once there are three ranks.
TEST(CanonicalOrderTest, TheTestValuesAreOrderSensitive) {
  for (int n = 3; n <= 8; ++n) {
    int differ = 0;
    for (size_t i = 0; i < kCount; ++i) {
      std::vector<Bits> v = Column(n, i, DataType::kFloat32, ReduceOp::kSum);
      differ += TreeReference(v, DataType::kFloat32, ReduceOp::kSum) !=
                RingReference(v, 1, DataType::kFloat32, ReduceOp::kSum);
    }
    EXPECT_GT(differ, 0) << n << " ranks";
  }
}

// Fused or not: tensor A (37 elements: recursive doubling alone) and B (203: the direct
// reduce-scatter + all-gather alone, as is the fused bucket) reduce to the same bits alone
// and fused as A|B.
TEST_P(CanonicalOrderTest, FusedAndUnfusedAllReducesAreBitIdentical) {
  const int n = GetParam();
  CollectiveOptions o = SmallPieces();
  o.ring_threshold_bytes = 300;
  RunLocalWorld(n, o, [&](int rank, Communicator& comm) {
    constexpr size_t kA = 37, kB = 203;
    for (DataType dt : kFloatTypes) {
      for (ReduceOp op : kOps) {
        const size_t e = DataTypeSize(dt);
        if (n > 1) {
          ASSERT_EQ(ChooseAllReduceAlgorithm(kA * e, kA, n, o.ring_threshold_bytes),
                    AllReduceAlgorithm::kRecursiveDoubling);
          ASSERT_EQ(ChooseAllReduceAlgorithm(kB * e, kB, n, o.ring_threshold_bytes),
                    AllReduceAlgorithm::kRing);
        }
        std::vector<char> fused((kA + kB) * e), a(kA * e), b(kB * e);
        FillValues(fused.data(), kA + kB, rank, dt, op);
        std::memcpy(a.data(), fused.data(), kA * e);
        std::memcpy(b.data(), fused.data() + kA * e, kB * e);
        ASSERT_TRUE(comm.AllReduce(a.data(), a.data(), kA, dt, op).ok());
        ASSERT_TRUE(comm.AllReduce(b.data(), b.data(), kB, dt, op).ok());
        ASSERT_TRUE(comm.AllReduce(fused.data(), fused.data(), kA + kB, dt, op).ok());
        const std::string what = absl::StrCat(DataTypeName(dt), " ", ReduceOpName(op), " rank ",
                                              rank, " of ", n);
        EXPECT_EQ(0, std::memcmp(fused.data(), a.data(), kA * e)) << "A: " << what;
        EXPECT_EQ(0, std::memcmp(fused.data() + kA * e, b.data(), kB * e)) << "B: " << what;
      }
    }
  });
}

// Above direct_max_ranks (here 4) the Communicator's reduce-scatter becomes the ring, and its
// all-reduce gives the ring's order; up to it, the canonical tree.
TEST_P(CanonicalOrderTest, TheCommunicatorSwitchesToTheRingAboveDirectMaxRanks) {
  const int n = GetParam();
  CollectiveOptions o = SmallPieces();
  o.ring_threshold_bytes = 0;
  o.direct_max_ranks = 4;
  const DataType dt = DataType::kFloat32;
  const ReduceOp op = ReduceOp::kSum;
  const std::vector<Span1D> segs = PartitionEven(kCount, n);
  RunLocalWorld(n, o, [&](int rank, Communicator& comm) {
    std::vector<char> buf(kCount * 4);
    FillValues(buf.data(), kCount, rank, dt, op);
    ASSERT_TRUE(comm.AllReduce(buf.data(), buf.data(), kCount, dt, op).ok());
    auto expected = [&](size_t i) {
      if (n <= o.direct_max_ranks) return TreeReference(Column(n, i, dt, op), dt, op);
      int k = 0;
      while (i >= segs[k].offset + segs[k].count) ++k;
      return RingReference(Column(n, i, dt, op), k % n, dt, op);
    };
    ExpectBits(buf.data(), kCount, 0, dt, expected, absl::StrCat("rank ", rank, " of ", n));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CanonicalOrderTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "ranks");
                         });

}  // namespace
}  // namespace braid::transport
