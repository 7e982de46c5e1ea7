// Multi-process tests of the UCX Communicator: real processes, real UCX endpoints over
// shared memory and over tcp on loopback. One job per world size runs the whole
// collective × dtype × op × size matrix against references computed here, independently of
// the transport's kernels (in double precision, rounded once to the dtype).
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/typed_values.h"
#include "transport/ring_schedule.h"
#include "transport/ucx_communicator.h"

namespace braid::transport {
namespace {

using braid::testing::RankExit;
using braid::testing::RunRanks;
using braid::testing::RunRanksOptions;

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                              DataType::kUInt8};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct};
const size_t kCounts[] = {0, 1, 7, 1000003};

// Small integers, so every sum and product of up to 4 ranks is exact in every dtype and the
// reference is exact too; average is the one rounded result.
double Value(int rank, size_t i, DataType dt) {
  int64_t k = static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 13 + i / 5) % 5);
  return dt == DataType::kUInt8 ? static_cast<double>(k % 4) : static_cast<double>(k - 2);
}

void Write(void* buf, size_t i, DataType dt, double v) { braid::testing::WriteValue(buf, i, dt, v); }
double Read(const void* buf, size_t i, DataType dt) { return braid::testing::ReadValue(buf, i, dt); }

double Reference(int size, size_t i, DataType dt, ReduceOp op) {
  double acc = Value(0, i, dt);
  for (int r = 1; r < size; ++r) {
    double v = Value(r, i, dt);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc += v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc *= v; break;
    }
  }
  return op == ReduceOp::kAverage ? acc / size : acc;
}

// Relative tolerance of the one rounding an average makes.
double AverageTolerance(DataType dt) {
  switch (dt) {
    case DataType::kFloat16: return 1.0 / 1024;
    case DataType::kBFloat16: return 1.0 / 128;
    case DataType::kFloat32: return 1e-6;
    default: return 1e-12;
  }
}

// Counts mismatches, printing the first few with their context.
struct Checker {
  int rank;
  int failures = 0;
  void Expect(bool ok, const std::string& what) {
    if (ok) return;
    if (++failures <= 10) fprintf(stderr, "[rank %d] MISMATCH %s\n", rank, what.c_str());
  }
};

bool Matches(double got, double want, DataType dt, ReduceOp op) {
  if (op == ReduceOp::kAverage) {
    return std::fabs(got - want) <= AverageTolerance(dt) * std::max(1.0, std::fabs(want));
  }
  // Exact: the reference rounded to the dtype once, like the data.
  std::vector<char> tmp(8);
  Write(tmp.data(), 0, dt, want);
  return got == Read(tmp.data(), 0, dt);
}

void SetTransportEnv(const std::string& tls) {
  setenv("UCX_TLS", tls.c_str(), 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
}

absl::StatusOr<std::unique_ptr<Communicator>> Connect(int rank, int size, FileStore* store,
                                                      absl::Duration timeout,
                                                      int direct_max_ranks = 16) {
  UcxOptions o;
  o.direct_max_ranks = direct_max_ranks;
  o.rank = rank;
  o.size = size;
  o.store = store;
  o.timeout = timeout;
  o.connect_timeout = absl::Seconds(30);
  o.chunk_bytes = 64 * 1024;  // many pipeline pieces per segment, more than the window
  return CreateUcxCommunicator(o);
}

// The whole matrix for one rank. Returns the number of mismatches (0 = pass).
int RunMatrix(int rank, int size, const std::string& dir, int direct_max_ranks) {
  FileStore store(dir);
  auto comm_or = Connect(rank, size, &store, absl::Seconds(30), direct_max_ranks);
  if (!comm_or.ok()) {
    fprintf(stderr, "[rank %d] connect: %s\n", rank, comm_or.status().ToString().c_str());
    return 100;
  }
  Communicator& comm = **comm_or;
  Checker c{rank};
  auto check_status = [&](const absl::Status& s, const std::string& what) {
    c.Expect(s.ok(), absl::StrCat(what, ": ", s.ToString()));
    return s.ok();
  };

  for (DataType dt : kAllTypes) {
    const size_t elem = DataTypeSize(dt);
    for (size_t count : kCounts) {
      std::vector<char> in(count * elem + 1), out(count * elem + 1), inplace(count * elem + 1);
      for (size_t i = 0; i < count; ++i) Write(in.data(), i, dt, Value(rank, i, dt));
      for (ReduceOp op : kAllOps) {
        const std::string what =
            absl::StrCat(DataTypeName(dt), " ", ReduceOpName(op), " n=", count);
        if (op == ReduceOp::kAverage && !IsFloatingPoint(dt)) {
          absl::Status s = comm.AllReduce(in.data(), out.data(), count, dt, op);
          c.Expect(s.code() == absl::StatusCode::kInvalidArgument,
                   "allreduce average of an integer type must be InvalidArgument: " + what);
          continue;
        }
        // All-reduce, out of place: the input must stay untouched.
        std::vector<char> before = in;
        if (check_status(comm.AllReduce(in.data(), out.data(), count, dt, op), "allreduce " + what)) {
          c.Expect(before == in, "allreduce modified its input: " + what);
          int bad = 0;
          for (size_t i = 0; i < count; ++i) {
            if (!Matches(Read(out.data(), i, dt), Reference(size, i, dt, op), dt, op) && bad++ < 3) {
              c.Expect(false, absl::StrCat("allreduce ", what, " [", i, "] got ",
                                           Read(out.data(), i, dt), " want ",
                                           Reference(size, i, dt, op)));
            }
          }
        }
        // All-reduce in place must give the same bits.
        inplace = in;
        if (check_status(comm.AllReduce(inplace.data(), inplace.data(), count, dt, op),
                         "allreduce in-place " + what)) {
          c.Expect(std::memcmp(inplace.data(), out.data(), count * elem) == 0,
                   "in-place allreduce differs from out-of-place: " + what);
        }
        // Every rank must hold bit-identical results: gather a fingerprint of each.
        uint64_t h = 1469598103934665603ull;
        for (size_t b = 0; b < count * elem; ++b) h = (h ^ static_cast<uint8_t>(out[b])) * 1099511628211ull;
        std::vector<uint64_t> all(size);
        std::vector<size_t> eight(size, sizeof(uint64_t));
        if (check_status(comm.AllGather(&h, sizeof(h), all.data(), eight), "fingerprint " + what)) {
          for (int r = 0; r < size; ++r) {
            c.Expect(all[r] == h, absl::StrCat("rank ", r, " result differs from rank ", rank,
                                               ": ", what));
          }
        }
        // Reduce-scatter with uneven per-rank counts: rank r gets segment r.
        std::vector<Span1D> segs = PartitionEven(count, size);
        std::vector<size_t> counts;
        for (const auto& s : segs) counts.push_back(s.count);
        std::vector<char> rs(segs[rank].count * elem + 1);
        if (check_status(comm.ReduceScatter(in.data(), rs.data(), counts, dt, op),
                         "reducescatter " + what)) {
          int bad = 0;
          for (size_t i = 0; i < segs[rank].count; ++i) {
            size_t g = segs[rank].offset + i;
            if (!Matches(Read(rs.data(), i, dt), Reference(size, g, dt, op), dt, op) && bad++ < 3) {
              c.Expect(false, absl::StrCat("reducescatter ", what, " [", g, "] got ",
                                           Read(rs.data(), i, dt), " want ",
                                           Reference(size, g, dt, op)));
            }
          }
        }
      }
      // All-gather with per-rank sizes: rank r contributes count + r elements.
      {
        std::vector<size_t> bytes(size);
        size_t total = 0;
        for (int r = 0; r < size; ++r) total += (bytes[r] = (count + r) * elem);
        std::vector<char> mine(bytes[rank] + 1), all(total + 1);
        for (size_t i = 0; i < count + rank; ++i) Write(mine.data(), i, dt, Value(rank, i, dt));
        const std::string what = absl::StrCat("allgather ", DataTypeName(dt), " n=", count);
        if (check_status(comm.AllGather(mine.data(), bytes[rank], all.data(), bytes), what)) {
          size_t off = 0, bad = 0;
          for (int r = 0; r < size; ++r) {
            for (size_t i = 0; i < count + r; ++i) {
              if (Read(all.data() + off, i, dt) != Value(r, i, dt) && bad++ < 3) {
                c.Expect(false, absl::StrCat(what, " block ", r, " [", i, "]"));
              }
            }
            off += bytes[r];
          }
        }
      }
      // All-to-all with per-pair sizes: rank s sends count/size + (s + 2p) % 3 elements to p.
      {
        auto n_of = [&](int s, int p) { return count / std::max(1, size) + (s + 2 * p) % 3; };
        std::vector<size_t> sb(size), rb(size);
        size_t stot = 0, rtot = 0;
        for (int p = 0; p < size; ++p) {
          stot += (sb[p] = n_of(rank, p) * elem);
          rtot += (rb[p] = n_of(p, rank) * elem);
        }
        std::vector<char> sendbuf(stot + 1), recvbuf(rtot + 1);
        size_t off = 0;
        for (int p = 0; p < size; ++p) {  // element i of the block for p: Value(rank, i + 1000 p)
          for (size_t i = 0; i < n_of(rank, p); ++i) {
            Write(sendbuf.data() + off, i, dt, Value(rank, i + 1000 * p, dt));
          }
          off += sb[p];
        }
        const std::string what = absl::StrCat("alltoall ", DataTypeName(dt), " n=", count);
        if (check_status(comm.AllToAll(sendbuf.data(), sb, recvbuf.data(), rb), what)) {
          size_t roff = 0, bad = 0;
          for (int p = 0; p < size; ++p) {
            for (size_t i = 0; i < n_of(p, rank); ++i) {
              if (Read(recvbuf.data() + roff, i, dt) != Value(p, i + 1000 * rank, dt) && bad++ < 3) {
                c.Expect(false, absl::StrCat(what, " from ", p, " [", i, "]"));
              }
            }
            roff += rb[p];
          }
        }
      }
      // Broadcast from a root that varies with the case.
      {
        int root = static_cast<int>((count + static_cast<size_t>(dt)) % size);
        std::vector<char> buf(count * elem + 1);
        for (size_t i = 0; i < count; ++i) Write(buf.data(), i, dt, Value(rank, i, dt));
        const std::string what = absl::StrCat("broadcast ", DataTypeName(dt), " n=", count,
                                              " root=", root);
        if (check_status(comm.Broadcast(buf.data(), count * elem, root), what)) {
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) {
            if (Read(buf.data(), i, dt) != Value(root, i, dt) && bad++ < 3) {
              c.Expect(false, absl::StrCat(what, " [", i, "]"));
            }
          }
        }
      }
      check_status(comm.Barrier(), "barrier");
    }
  }

  // Transport bytes of the ring: 2(n-1)/n of the buffer, within one chunk.
  if (size > 1) {
    const size_t count = 1000003;
    std::vector<float> buf(count, 1.0f);
    TransportStats before = comm.stats();
    if (check_status(comm.AllReduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum),
                     "ring byte count")) {
      double sent = static_cast<double>(comm.stats().bytes_sent - before.bytes_sent);
      double want = 2.0 * (size - 1) / size * count * sizeof(float);
      c.Expect(std::fabs(sent - want) <= (1 << 20),
               absl::StrCat("ring sent ", sent, " bytes, want ", want, " within one chunk"));
      c.Expect(buf[count / 2] == static_cast<float>(size), "ring byte-count run result");
    }
  }
  // A bad argument is rejected on every rank without poisoning the communicator.
  {
    std::vector<size_t> wrong(size + 1, 0);
    absl::Status s = comm.ReduceScatter(nullptr, nullptr, wrong, DataType::kFloat32, ReduceOp::kSum);
    c.Expect(s.code() == absl::StatusCode::kInvalidArgument, "reduce-scatter with wrong counts");
    float one = 1.0f;
    absl::Status after = comm.AllReduce(&one, &one, 1, DataType::kFloat32, ReduceOp::kSum);
    c.Expect(after.ok() && one == static_cast<float>(size),
             absl::StrCat("all-reduce after a rejected call: ", after.ToString(), ", ", one));
  }
  if (rank == 0) fprintf(stderr, "[rank 0] transports: %s\n", comm.Describe().c_str());
  return std::min(c.failures, 100);
}

struct MatrixCase {
  int size;
  std::string tls;
  int direct_max_ranks = 16;  // below size: the ring reduce-scatter of large worlds
};
void PrintTo(const MatrixCase& c, std::ostream* os) {
  *os << c.size << " ranks over " << c.tls
      << (c.size > c.direct_max_ranks ? " (ring reduce-scatter)" : "");
}

class TransportMatrixTest : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(TransportMatrixTest, EveryCollectiveDtypeOpAndSizeMatchesReference) {
  const MatrixCase& mc = GetParam();
  std::string dir = braid::testing::MakeTempDir("braid_store_");
  ASSERT_FALSE(dir.empty());
  RunRanksOptions o;
  o.ranks = mc.size;
  o.deadline = absl::Seconds(300);
  auto exits = RunRanks(o, [&](int rank) {
    SetTransportEnv(mc.tls);
    return RunMatrix(rank, mc.size, dir, mc.direct_max_ranks);
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.signal, 0) << "rank " << e.rank << " died of signal " << e.signal;
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank << " saw mismatches (see stderr)";
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, TransportMatrixTest,
    ::testing::Values(MatrixCase{1, "sm"}, MatrixCase{2, "sm"}, MatrixCase{3, "sm"},
                      MatrixCase{4, "sm"}, MatrixCase{2, "tcp"}, MatrixCase{3, "tcp"},
                      MatrixCase{4, "tcp"}, MatrixCase{4, "sm", 2}),
    [](const ::testing::TestParamInfo<MatrixCase>& info) {
      return absl::StrCat(info.param.tls, "_", info.param.size, "ranks",
                          info.param.size > info.param.direct_max_ranks ? "_ring" : "");
    });

// The two phases the runtime uses, with the exchange done by the caller (here through the
// store, with a record format of the test's own): every rank opens its worker, publishes its
// PeerAddress, reads everyone's and connects; then an all-reduce of rank + 1 gives n(n+1)/2.
TEST(TransportTwoPhaseTest, OpenPublishConnectAndReduce) {
  const int kRanks = 3;
  std::string dir = braid::testing::MakeTempDir("braid_two_phase_");
  ASSERT_FALSE(dir.empty());
  RunRanksOptions o;
  o.ranks = kRanks;
  o.deadline = absl::Seconds(120);
  auto exits = RunRanks(o, [&](int rank) {
    SetTransportEnv("sm");
    FileStore store(dir);
    UcxOptions uo;
    uo.rank = rank;
    uo.size = kRanks;
    uo.timeout = absl::Seconds(30);
    auto worker = OpenUcxWorker(uo);
    if (!worker.ok()) return 1;
    const PeerAddress self = (*worker)->self();
    if (self.pid != getpid() || self.address.empty()) return 2;
    const std::string key = absl::StrCat("peer", rank);
    if (!store.Set(key + "/host", self.host).ok() ||
        !store.Set(key + "/pid", std::to_string(self.pid)).ok() ||
        !store.Set(key + "/address", self.address).ok()) {
      return 3;
    }
    std::vector<PeerAddress> peers(kRanks);
    for (int p = 0; p < kRanks; ++p) {
      const std::string k = absl::StrCat("peer", p);
      auto host = store.Get(k + "/host", absl::Seconds(30));
      auto pid = store.Get(k + "/pid", absl::Seconds(30));
      auto address = store.Get(k + "/address", absl::Seconds(30));
      if (!host.ok() || !pid.ok() || !address.ok()) return 4;
      peers[p] = PeerAddress{*host, std::stoll(*pid), *address};
    }
    auto comm = ConnectUcx(*std::move(worker), std::move(peers));
    if (!comm.ok()) {
      fprintf(stderr, "[rank %d] %s\n", rank, comm.status().ToString().c_str());
      return 5;
    }
    int64_t x = rank + 1;
    absl::Status s = (*comm)->AllReduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum);
    if (!s.ok() || x != kRanks * (kRanks + 1) / 2) return 6;
    return (*comm)->Barrier().ok() ? 0 : 7;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank;
  }
}

// The tag's pair field carries a keyed value (Note [Tag layout]): ranks that derive it with the
// same key talk; a rank with another key matches no receive, so its peer times out.
TEST(TransportTagTest, KeyedPairFieldsMatchOnlyUnderTheSameKey) {
  std::string dir = braid::testing::MakeTempDir("braid_pair_tag_");
  ASSERT_FALSE(dir.empty());
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(60);
  auto exits = RunRanks(o, [&](int rank) {
    SetTransportEnv("sm");
    FileStore store(dir);
    auto keyed = [](uint32_t key) {
      return [key](int s, int d) { return key ^ (static_cast<uint32_t>(s) * 2654435761u) ^
                                          (static_cast<uint32_t>(d) * 40503u); };
    };
    UcxOptions uo;
    uo.rank = rank;
    uo.size = 2;
    uo.store = &store;
    uo.timeout = absl::Seconds(1);
    uo.pair_tag = keyed(0xfeedf00du);
    uo.store_prefix = "same";
    auto same = CreateUcxCommunicator(uo);
    if (!same.ok()) return 1;
    int64_t x = rank + 5;
    if (!(*same)->AllReduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum).ok() || x != 11) return 2;
    if (!(*same)->Barrier().ok()) return 3;
    uo.pair_tag = keyed(rank == 0 ? 0xfeedf00du : 0xbadc0ffeu);
    uo.store_prefix = "other";
    auto other = CreateUcxCommunicator(uo);
    if (!other.ok()) return 4;
    absl::Status s = (*other)->Barrier();
    fprintf(stderr, "[rank %d] barrier under another key: %s\n", rank, s.ToString().c_str());
    return s.code() == absl::StatusCode::kDeadlineExceeded ? 0 : 5;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank;
  }
}

// Note [Warm shared memory] (transport/ucx_warmup.cc): the warm-up's messages, sent at
// connection under sequence number 0xFFFF, are all received by the warm-up and never meet a
// collective's receive: collectives of every sequence number past 0xFFFF (the tag keeps 16
// bits), every 64th of 8000 bytes (the warm-up's size: a leftover message would fill it with
// zeros rather than fail), stay exact. A warm-up that posted no receives fails here at call
// 65535 with a wrong sum. Rank 1 connects 300 ms late, so rank 0's warm-up messages wait
// for it as unexpected ones.
TEST(TransportWarmupTest, CollectivesPastTheWarmUpsSequenceNumberStayExact) {
  const std::string dir = braid::testing::MakeTempDir("braid_warmup_");
  ASSERT_FALSE(dir.empty());
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(240);
  auto exits = RunRanks(o, [&](int rank) {
    SetTransportEnv("sm");
    if (rank == 1) absl::SleepFor(absl::Milliseconds(300));
    FileStore store(dir);
    auto comm = Connect(rank, 2, &store, absl::Seconds(30));
    if (!comm.ok()) return 1;
    std::vector<int64_t> big(1000);  // 8000 bytes
    constexpr int kCalls = 0x10000 + 1000;
    for (int i = 0; i < kCalls; ++i) {
      if (i % 64 == 63) {
        for (size_t k = 0; k < big.size(); ++k) big[k] = (rank + 1) * (i + static_cast<int64_t>(k));
        absl::Status s = (*comm)->AllReduce(big.data(), big.data(), big.size(), DataType::kInt64,
                                            ReduceOp::kSum);
        for (size_t k = 0; s.ok() && k < big.size(); ++k) {
          if (big[k] != 3 * (i + static_cast<int64_t>(k))) {
            fprintf(stderr, "[rank %d] call %d: element %zu is %lld\n", rank, i, k,
                    static_cast<long long>(big[k]));
            return 2;
          }
        }
        if (!s.ok()) {
          fprintf(stderr, "[rank %d] call %d: %s\n", rank, i, s.ToString().c_str());
          return 3;
        }
        continue;
      }
      int64_t x = (rank + 1) * static_cast<int64_t>(i);
      absl::Status s = (*comm)->AllReduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum);
      if (!s.ok() || x != 3 * static_cast<int64_t>(i)) {
        fprintf(stderr, "[rank %d] call %d: %s, %lld\n", rank, i, s.ToString().c_str(),
                static_cast<long long>(x));
        return 4;
      }
    }
    return (*comm)->Barrier().ok() ? 0 : 5;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank;
  }
}

// Exit codes a rank reports in the failure tests.
constexpr int kExitUnavailable = 20;
constexpr int kExitDeadline = 21;
constexpr int kExitCancelled = 22;
constexpr int kExitOther = 23;

int ExitFor(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kUnavailable) return kExitUnavailable;
  if (s.code() == absl::StatusCode::kDeadlineExceeded) return kExitDeadline;
  if (s.code() == absl::StatusCode::kCancelled) return kExitCancelled;
  return kExitOther;
}

class TransportFailureTest : public ::testing::TestWithParam<std::string> {};

// Killing one rank during a stream of large all-reduces: the survivors fail with
// Unavailable within BRAID_TIMEOUT_S + 5 s, and nothing hangs.
TEST_P(TransportFailureTest, KilledPeerGivesUnavailableOnSurvivors) {
  const int kRanks = 3;
  const absl::Duration kTimeout = absl::Seconds(4);
  std::string dir = braid::testing::MakeTempDir("braid_kill_");
  std::string ready = dir + "/ready";
  RunRanksOptions o;
  o.ranks = kRanks;
  o.deadline = absl::Seconds(60);
  absl::Time killed_at;
  const absl::Time started = absl::Now();
  o.after_start = [&](const std::vector<pid_t>& pids) {
    // Wait until rank 0 has completed some all-reduces, then kill rank 2.
    absl::Time limit = absl::Now() + absl::Seconds(30);
    while (access(ready.c_str(), F_OK) != 0 && absl::Now() < limit) absl::SleepFor(absl::Milliseconds(10));
    kill(pids[2], SIGKILL);
    killed_at = absl::Now();
  };
  auto exits = RunRanks(o, [&](int rank) {
    SetTransportEnv(GetParam());
    FileStore store(dir);
    auto comm = Connect(rank, kRanks, &store, kTimeout);
    if (!comm.ok()) return kExitOther + 10;
    std::vector<float> buf(4 << 20, 1.0f);
    for (int i = 0; i < 100000; ++i) {
      absl::Status s = (*comm)->AllReduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                                          ReduceOp::kAverage);
      if (!s.ok()) {
        fprintf(stderr, "[rank %d] after %d all-reduces: %s\n", rank, i, s.ToString().c_str());
        return ExitFor(s);
      }
      if (rank == 0 && i == 5) {
        FILE* f = fopen(ready.c_str(), "w");
        if (f) fclose(f);
      }
    }
    return 0;
  });
  EXPECT_EQ(exits[2].signal, SIGKILL);
  const absl::Duration kill_offset = killed_at - started;  // RankExit::elapsed counts from fork
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(exits[r].timed_out) << "rank " << r << " hung";
    EXPECT_EQ(exits[r].exit_code, kExitUnavailable) << "rank " << r;
    EXPECT_LE(exits[r].elapsed - kill_offset, kTimeout + absl::Seconds(5)) << "rank " << r;
  }
}

// Abort() from another thread fails a collective that is blocked waiting for a peer.
TEST_P(TransportFailureTest, AbortFromAnotherThreadWakesABlockedCollective) {
  std::string dir = braid::testing::MakeTempDir("braid_abort_");
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(60);
  auto exits = RunRanks(o, [&](int rank) {
    SetTransportEnv(GetParam());
    FileStore store(dir);
    auto comm = Connect(rank, 2, &store, absl::Seconds(30));
    if (!comm.ok()) return kExitOther + 10;
    if (rank == 1) {  // never joins the broadcast; waits for rank 0 to finish
      absl::SleepFor(absl::Seconds(3));
      return 0;
    }
    Communicator* c = comm->get();
    std::thread aborter([c] {
      absl::SleepFor(absl::Milliseconds(300));
      c->Abort(absl::CancelledError("test abort"));
    });
    char byte = 0;
    absl::Time t0 = absl::Now();
    absl::Status s = c->Broadcast(&byte, 1, 1);
    absl::Duration took = absl::Now() - t0;
    aborter.join();
    if (s.code() != absl::StatusCode::kCancelled || s.message() != "test abort") return kExitOther;
    if (took > absl::Seconds(2)) return kExitDeadline;
    // Poisoned: the next call fails at once with the same error.
    absl::Status again = c->Barrier();
    return again.code() == absl::StatusCode::kCancelled ? 0 : kExitOther + 1;
  });
  EXPECT_EQ(exits[0].exit_code, 0);
  EXPECT_EQ(exits[1].exit_code, 0);
}

// A peer that stays alive but never joins: DeadlineExceeded after the progress timeout.
TEST_P(TransportFailureTest, SilentPeerGivesDeadlineExceeded) {
  std::string dir = braid::testing::MakeTempDir("braid_deadline_");
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(60);
  auto exits = RunRanks(o, [&](int rank) {
    SetTransportEnv(GetParam());
    FileStore store(dir);
    auto comm = Connect(rank, 2, &store, absl::Seconds(1));
    if (!comm.ok()) return kExitOther + 10;
    if (rank == 1) {
      absl::SleepFor(absl::Seconds(4));
      return 0;
    }
    float x = 1;
    absl::Time t0 = absl::Now();
    absl::Status s = (*comm)->AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    absl::Duration took = absl::Now() - t0;
    fprintf(stderr, "[rank 0] %s after %s\n", s.ToString().c_str(), absl::FormatDuration(took).c_str());
    if (s.code() != absl::StatusCode::kDeadlineExceeded) return ExitFor(s);
    return took >= absl::Seconds(1) && took < absl::Seconds(3) ? 0 : kExitOther;
  });
  EXPECT_EQ(exits[0].exit_code, 0);
  EXPECT_EQ(exits[1].exit_code, 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportFailureTest, ::testing::Values("sm", "tcp"));

}  // namespace
}  // namespace braid::transport
