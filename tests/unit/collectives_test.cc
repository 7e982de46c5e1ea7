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
#include "transport/gather.h"
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

// A bucket's buffer cut into pieces of 0 to 3 pipeline pieces' length, each in an
// allocation of its own (Note [Gathered all-reduce]): in place when `in_place`, else read
// from one allocation and written to another. Lengths depend on the rank, so the ranks'
// layouts differ as scattered tensors do.
struct ScatteredBuffer {
  std::vector<std::vector<char>> inputs, outputs;
  std::vector<GatheredPiece> pieces;

  ScatteredBuffer(const std::vector<char>& gathered, size_t elem, size_t chunk_bytes, int rank,
                  bool in_place) {
    const size_t count = gathered.size() / elem, max = 3 * chunk_bytes / elem + 1;
    uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1) + count;
    for (size_t at = 0; at < count || inputs.empty();) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const size_t n = std::min<size_t>((x >> 33) % max, count - at);
      inputs.emplace_back(gathered.begin() + at * elem, gathered.begin() + (at + n) * elem);
      outputs.emplace_back(in_place ? 0 : n * elem, '\xff');
      at += n;
    }
    for (size_t k = 0; k < inputs.size(); ++k) {
      char* in = inputs[k].data();
      pieces.push_back({in, in_place ? in : outputs[k].data(), inputs[k].size()});
    }
  }

  std::vector<char> Result() const {
    std::vector<char> r;
    for (const GatheredPiece& p : pieces) {
      r.insert(r.end(), static_cast<const char*>(p.output),
               static_cast<const char*>(p.output) + p.bytes);
    }
    return r;
  }
};

// The gathered all-reduce has the bits and the messages of the one over the gathered buffer:
// every rank gathered, or every other rank reducing a contiguous buffer as it stands.
TEST_P(CollectivesTest, GatheredAllReduceMatchesTheContiguousOne) {
  const int n = GetParam();
  const CollectiveOptions options = TestOptions();
  RunLocalContexts(n, options, [&](int rank, Context& ctx) {
    for (const ReduceScatterAlgorithm alg :
         {ReduceScatterAlgorithm::kDirect, ReduceScatterAlgorithm::kRing}) {
      for (DataType dt : kAllTypes) {
        const size_t elem = DataTypeSize(dt);
        for (size_t count : kCounts) {
          std::vector<char> in(count * elem);
          Fill(in.data(), count, rank, dt);
          for (ReduceOp op : kAllOps) {
            if (!Applies(dt, op)) continue;
            for (const bool mixed : {false, true}) {
              for (const bool in_place : {false, true}) {
                const std::string what =
                    absl::StrCat(alg == ReduceScatterAlgorithm::kDirect ? "direct " : "ring ",
                                 DataTypeName(dt), " ", ReduceOpName(op), " n=", count,
                                 in_place ? " in place" : "", mixed ? " mixed" : "",
                                 " rank ", rank);
                if (mixed && rank % 2 == 0) {
                  // One byte more: no null buffer, even of 0 elements.
                  std::vector<char> send(in), got(count * elem + 1);
                  send.push_back(0);
                  AllReduceFn fn = alg == ReduceScatterAlgorithm::kDirect ? &AllReduceDirect
                                                                          : &AllReduceRing;
                  ASSERT_TRUE(fn(ctx, send.data(), got.data(), count, dt, op).ok()) << what;
                  ExpectReduced(got.data(), count, 0, n, dt, op, what);
                  continue;
                }
                ScatteredBuffer b(in, elem, options.chunk_bytes, rank, in_place);
                std::vector<char> scratch(count * elem + 1);
                const GatherMap map(b.pieces);
                ASSERT_TRUE(
                    AllReduceGathered(ctx, map, scratch.data(), count, dt, op, alg).ok())
                    << what;
                ExpectReduced(b.Result().data(), count, 0, n, dt, op, what);
                if (!in_place) {
                  std::vector<char> inputs;
                  for (const auto& v : b.inputs) inputs.insert(inputs.end(), v.begin(), v.end());
                  EXPECT_EQ(inputs, in) << "input modified: " << what;
                }
              }
            }
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
