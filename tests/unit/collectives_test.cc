// Every collective algorithm of transport/collectives.h × every dtype × every reduce op, for
// world sizes 1 to 8, on the in-process backend (one thread per rank), against references
// computed here independently of the transport's kernels: exact integer arithmetic (wrapping
// like the dtype) for sum, min, max and product of small integers, and double precision
// rounded once to the dtype for the average. Small pipeline pieces and a window smaller than
// their number exercise the pipeline's bookkeeping.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/local_world.h"
#include "tests/testing/typed_values.h"
#include "transport/collectives.h"
#include "transport/ring_schedule.h"

namespace braid::transport {
namespace {

using braid::testing::ReadValue;
using braid::testing::RunLocalContexts;
using braid::testing::SameBits;
using braid::testing::WriteValue;
using braid::testing::WriteWrapped;

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                              DataType::kUInt8};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct};
const size_t kCounts[] = {0, 1, 7, 301};

using AllReduceFn = absl::Status (*)(Context&, const void*, void*, size_t, DataType, ReduceOp);
using ReduceScatterFn = absl::Status (*)(Context&, const void*, void*, absl::Span<const size_t>,
                                         DataType, ReduceOp);
struct NamedAllReduce {
  const char* name;
  AllReduceFn fn;
};
struct NamedReduceScatter {
  const char* name;
  ReduceScatterFn fn;
};
const NamedAllReduce kAllReduces[] = {{"recursive doubling", &AllReduceRecursiveDoubling},
                                      {"direct", &AllReduceDirect},
                                      {"ring", &AllReduceRing}};
const NamedReduceScatter kReduceScatters[] = {{"direct", &ReduceScatterDirect},
                                              {"ring", &ReduceScatterRing}};

CollectiveOptions TestOptions() {
  CollectiveOptions o;
  o.chunk_bytes = 40;  // many pieces per segment ...
  o.ring_window = 3;   // ... more than are in flight at once
  o.timeout = absl::Seconds(30);
  return o;
}

// Small integers: every sum and product over up to 8 ranks is exact in every dtype (uint8
// products wrap, as the reference does).
int64_t Value(int rank, size_t i, DataType dt) {
  int64_t k = static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 13 + i / 5) % 5);
  return dt == DataType::kUInt8 ? k % 4 : k - 2;
}

void Fill(void* buf, size_t count, int rank, DataType dt, size_t offset = 0) {
  for (size_t i = 0; i < count; ++i) WriteValue(buf, i, dt, Value(rank, offset + i, dt));
}

// The reduction over `n` ranks of element i, written as element `at` of `out`: in double
// for floating-point dtypes (exact for these values, with IEEE signed zeros: (-2) * 0 is -0),
// in int64 wrapped to the dtype's width for integers.
void WriteReference(void* out, size_t at, int n, size_t i, DataType dt, ReduceOp op) {
  if (IsFloatingPoint(dt)) {
    double acc = static_cast<double>(Value(0, i, dt));
    for (int r = 1; r < n; ++r) {
      const double v = static_cast<double>(Value(r, i, dt));
      if (op == ReduceOp::kSum || op == ReduceOp::kAverage) acc += v;
      if (op == ReduceOp::kMin) acc = std::min(acc, v);
      if (op == ReduceOp::kMax) acc = std::max(acc, v);
      if (op == ReduceOp::kProduct) acc *= v;
    }
    WriteValue(out, at, dt, op == ReduceOp::kAverage ? acc / n : acc);
    return;
  }
  int64_t acc = Value(0, i, dt);
  for (int r = 1; r < n; ++r) {
    const int64_t v = Value(r, i, dt);
    if (op == ReduceOp::kSum) acc += v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kProduct) acc *= v;
  }
  WriteWrapped(out, at, dt, acc);
}

// Compares `got` (elements [offset, offset + count) of the reduction) with the reference;
// reports the first mismatches.
void ExpectReduced(const char* got, size_t count, size_t offset, int n, DataType dt,
                   ReduceOp op, const std::string& what) {
  std::vector<char> want(DataTypeSize(dt));
  int bad = 0;
  for (size_t i = 0; i < count; ++i) {
    WriteReference(want.data(), 0, n, offset + i, dt, op);
    if (SameBits(got + i * DataTypeSize(dt), want.data(), 0, dt)) continue;
    if (bad++ < 3) {
      ADD_FAILURE() << what << " [" << offset + i << "]: got " << ReadValue(got, i, dt)
                    << ", want " << ReadValue(want.data(), 0, dt);
    }
  }
}

bool Applies(DataType dt, ReduceOp op) { return op != ReduceOp::kAverage || IsFloatingPoint(dt); }

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, AllReduceEveryAlgorithmDtypeOpAndSize) {
  const int n = GetParam();
  RunLocalContexts(n, TestOptions(), [&](int rank, Context& ctx) {
    for (const NamedAllReduce& alg : kAllReduces) {
      for (DataType dt : kAllTypes) {
        const size_t elem = DataTypeSize(dt);
        for (size_t count : kCounts) {
          std::vector<char> in(count * elem + 1), out(count * elem + 1), inplace;
          Fill(in.data(), count, rank, dt);
          for (ReduceOp op : kAllOps) {
            if (!Applies(dt, op)) continue;
            const std::string what = absl::StrCat(alg.name, " ", DataTypeName(dt), " ",
                                                  ReduceOpName(op), " n=", count, " rank ", rank);
            const std::vector<char> before = in;
            std::memset(out.data(), 0xff, out.size());
            ASSERT_TRUE(alg.fn(ctx, in.data(), out.data(), count, dt, op).ok()) << what;
            EXPECT_EQ(before, in) << "input modified: " << what;
            ExpectReduced(out.data(), count, 0, n, dt, op, what);
            inplace = in;
            ASSERT_TRUE(alg.fn(ctx, inplace.data(), inplace.data(), count, dt, op).ok()) << what;
            EXPECT_EQ(0, std::memcmp(inplace.data(), out.data(), count * elem))
                << "in place differs from out of place: " << what;
          }
        }
      }
    }
  });
}

TEST_P(CollectivesTest, ReduceScatterEveryAlgorithmDtypeOpAndSize) {
  const int n = GetParam();
  RunLocalContexts(n, TestOptions(), [&](int rank, Context& ctx) {
    for (const NamedReduceScatter& alg : kReduceScatters) {
      for (DataType dt : kAllTypes) {
        const size_t elem = DataTypeSize(dt);
        for (size_t count : kCounts) {
          // Uneven per-rank counts: the first count % n ranks get one more element.
          const std::vector<Span1D> segs = PartitionEven(count, n);
          std::vector<size_t> counts;
          for (const Span1D& s : segs) counts.push_back(s.count);
          std::vector<char> in(count * elem + 1), out(segs[rank].count * elem + 1);
          Fill(in.data(), count, rank, dt);
          for (ReduceOp op : kAllOps) {
            if (!Applies(dt, op)) continue;
            const std::string what = absl::StrCat(alg.name, " ", DataTypeName(dt), " ",
                                                  ReduceOpName(op), " n=", count, " rank ", rank);
            const std::vector<char> before = in;
            std::memset(out.data(), 0xff, out.size());
            ASSERT_TRUE(alg.fn(ctx, in.data(), out.data(), counts, dt, op).ok()) << what;
            EXPECT_EQ(before, in) << "input modified: " << what;
            ExpectReduced(out.data(), segs[rank].count, segs[rank].offset, n, dt, op, what);
          }
        }
      }
    }
  });
}

// All-gather(v): rank r contributes count + r elements.
void CheckAllGather(Context& ctx, int rank, int n, DataType dt, size_t count) {
  const size_t elem = DataTypeSize(dt);
  std::vector<size_t> bytes(n);
  size_t total = 0;
  for (int r = 0; r < n; ++r) total += (bytes[r] = (count + r) * elem);
  std::vector<char> mine(bytes[rank] + 1), all(total + 1, '\xff');
  Fill(mine.data(), count + rank, rank, dt);
  const std::string what = absl::StrCat("allgather ", DataTypeName(dt), " n=", count);
  ASSERT_TRUE(AllGatherRing(ctx, mine.data(), bytes[rank], all.data(), bytes).ok()) << what;
  std::vector<char> want(total + 1);
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    Fill(want.data() + off, count + r, r, dt);
    off += bytes[r];
  }
  EXPECT_EQ(0, std::memcmp(all.data(), want.data(), total)) << what << " rank " << rank;
}

// All-to-all(v): rank s sends count/n + (s + 2p) % 3 elements to p, element i of that block
// being Value(s, i + 1000 p).
void CheckAllToAll(Context& ctx, int rank, int n, DataType dt, size_t count) {
  const size_t elem = DataTypeSize(dt);
  auto n_of = [&](int s, int p) { return count / n + (s + 2 * p) % 3; };
  std::vector<size_t> sb(n), rb(n);
  size_t stot = 0, rtot = 0;
  for (int p = 0; p < n; ++p) {
    stot += (sb[p] = n_of(rank, p) * elem);
    rtot += (rb[p] = n_of(p, rank) * elem);
  }
  std::vector<char> send(stot + 1), recv(rtot + 1, '\xff'), want(rtot + 1);
  size_t so = 0, ro = 0;
  for (int p = 0; p < n; so += sb[p], ro += rb[p], ++p) {
    Fill(send.data() + so, n_of(rank, p), rank, dt, 1000 * p);
    Fill(want.data() + ro, n_of(p, rank), p, dt, 1000 * rank);
  }
  const std::string what = absl::StrCat("alltoall ", DataTypeName(dt), " n=", count);
  ASSERT_TRUE(AllToAllDirect(ctx, send.data(), sb, recv.data(), rb).ok()) << what;
  EXPECT_EQ(0, std::memcmp(recv.data(), want.data(), rtot)) << what << " rank " << rank;
}

// Broadcast from every root in turn.
void CheckBroadcast(Context& ctx, int rank, int n, DataType dt, size_t count) {
  const size_t elem = DataTypeSize(dt);
  for (int root = 0; root < n; ++root) {
    std::vector<char> buf(count * elem + 1), want(count * elem + 1);
    Fill(buf.data(), count, rank, dt);
    Fill(want.data(), count, root, dt);
    const std::string what = absl::StrCat("broadcast ", DataTypeName(dt), " n=", count,
                                          " root ", root, " rank ", rank);
    ASSERT_TRUE(BroadcastBinomial(ctx, buf.data(), count * elem, root).ok()) << what;
    EXPECT_EQ(0, std::memcmp(buf.data(), want.data(), count * elem)) << what;
  }
}

TEST_P(CollectivesTest, CopyingCollectivesEveryDtypeAndSize) {
  const int n = GetParam();
  RunLocalContexts(n, TestOptions(), [&](int rank, Context& ctx) {
    for (DataType dt : kAllTypes) {
      for (size_t count : kCounts) {
        CheckAllGather(ctx, rank, n, dt, count);
        CheckAllToAll(ctx, rank, n, dt, count);
        CheckBroadcast(ctx, rank, n, dt, count);
        ASSERT_TRUE(BarrierDissemination(ctx).ok());
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "ranks");
                         });

}  // namespace
}  // namespace braid::transport
