// The NCCL data plane's own logic (transport/nccl_communicator.h, Note [NCCL watchdog]) at
// 2-4 ranks played by threads, through the NCCL test double (tests/testing/fake_nccl.h):
// every collective's results and grouping, waiting for the stream before returning, and the
// failures: a lost peer, an asynchronous error, a hang past the timeout, a rank that never
// joins, Abort from another thread; every rank gets braid's error within the bounds.
#include "transport/nccl_communicator.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_nccl.h"

namespace braid::transport {
namespace {

using testing::FakeNccl;

// `n` ranks of one NCCL communicator, created concurrently (creation waits for every rank).
struct NcclWorld {
  NcclWorld(FakeNccl& fake, int n, NcclOptions options = {}, int joining = -1)
      : comms(n), created(n) {
    const NcclUniqueId id = *fake.GetUniqueId();
    std::vector<NcclApi::Stream> streams;
    for (int r = 0; r < n; ++r) streams.push_back(fake.NewStream());
    std::vector<std::thread> threads;
    for (int r = 0; r < (joining < 0 ? n : joining); ++r) {
      threads.emplace_back([&, r] {
        auto c = ConnectNccl(fake, id, r, n, streams[r], device::HostDevice(), options);
        created[r] = c.status();
        if (c.ok()) comms[r] = *std::move(c);
      });
    }
    for (auto& t : threads) t.join();
  }
  // Runs fn(rank, communicator) on a thread per rank that has one.
  template <typename Fn>
  void Run(Fn fn) {
    std::vector<std::thread> threads;
    for (size_t r = 0; r < comms.size(); ++r) {
      if (comms[r] == nullptr) continue;
      threads.emplace_back([&, r] { fn(static_cast<int>(r), *comms[r]); });
    }
    for (auto& t : threads) t.join();
  }
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<absl::Status> created;
};

class NcclCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclCollectivesTest, EveryCollectiveGivesItsResult) {
  const int n = GetParam();
  FakeNccl fake;
  NcclWorld world(fake, n);
  for (const absl::Status& s : world.created) ASSERT_TRUE(s.ok()) << s;
  std::vector<TransportStats> stats(n);
  world.Run([&](int rank, Communicator& c) {
    // All-reduce: sum and average of float32, max of int32, in place and out of place.
    std::vector<float> x(1000), sum(1000);
    for (int i = 0; i < 1000; ++i) x[i] = static_cast<float>(i * (rank + 1));
    ASSERT_TRUE(c.AllReduce(x.data(), sum.data(), x.size(), DataType::kFloat32, ReduceOp::kSum).ok());
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(sum[i], i * ranks_sum) << i;
    ASSERT_TRUE(c.AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kAverage).ok());
    EXPECT_EQ(x[10], 10 * ranks_sum / n);
    std::vector<int32_t> m = {rank, -rank, 7};
    ASSERT_TRUE(c.AllReduce(m.data(), m.data(), 3, DataType::kInt32, ReduceOp::kMax).ok());
    EXPECT_EQ(m, (std::vector<int32_t>{n - 1, 0, 7}));

    // Reduce-scatter: equal blocks (one NCCL reduce-scatter), then unequal (grouped reduces).
    for (bool equal : {true, false}) {
      std::vector<size_t> counts(n);
      for (int p = 0; p < n; ++p) counts[p] = equal ? 3 : static_cast<size_t>(p + 1);
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      std::vector<float> in(total), out(counts[rank]);
      for (size_t i = 0; i < total; ++i) in[i] = static_cast<float>(i + 100 * rank);
      ASSERT_TRUE(c.ReduceScatter(in.data(), out.data(), counts, DataType::kFloat32, ReduceOp::kSum).ok());
      size_t first = 0;
      for (int p = 0; p < rank; ++p) first += counts[p];
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_EQ(out[i], n * static_cast<float>(first + i) + 100.0f * (n * (n - 1) / 2))
            << (equal ? "equal" : "unequal") << " block, element " << i;
      }
    }

    // All-gather: equal blocks (one NCCL all-gather), then unequal (grouped broadcasts).
    for (bool equal : {true, false}) {
      std::vector<size_t> blocks(n);
      for (int p = 0; p < n; ++p) blocks[p] = equal ? 4 : static_cast<size_t>(2 * p + 1);
      std::vector<char> mine(blocks[rank], static_cast<char>('a' + rank));
      std::vector<char> all(std::accumulate(blocks.begin(), blocks.end(), size_t{0}), '?');
      ASSERT_TRUE(c.AllGather(mine.data(), mine.size(), all.data(), blocks).ok());
      std::string expected;
      for (int p = 0; p < n; ++p) expected += std::string(blocks[p], static_cast<char>('a' + p));
      EXPECT_EQ(std::string(all.begin(), all.end()), expected);
    }

    // All-to-all: block to peer p is p+rank+1 bytes of (rank, p); one empty block.
    std::vector<size_t> send_bytes(n), recv_bytes(n);
    for (int p = 0; p < n; ++p) {
      send_bytes[p] = p == 0 && rank == n - 1 ? 0 : static_cast<size_t>(p + rank + 1);
      recv_bytes[p] = rank == 0 && p == n - 1 ? 0 : static_cast<size_t>(p + rank + 1);
    }
    std::vector<char> sends, recvs(std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0}));
    for (int p = 0; p < n; ++p) sends.insert(sends.end(), send_bytes[p], static_cast<char>(16 * rank + p));
    ASSERT_TRUE(c.AllToAll(sends.data(), send_bytes, recvs.data(), recv_bytes).ok());
    std::string expected;
    for (int p = 0; p < n; ++p) expected += std::string(recv_bytes[p], static_cast<char>(16 * p + rank));
    EXPECT_EQ(std::string(recvs.begin(), recvs.end()), expected);

    // Broadcast from rank 1, a barrier, and a gathered all-reduce of two pieces.
    std::vector<double> b(5, rank == 1 ? 2.5 : 0.0);
    ASSERT_TRUE(c.Broadcast(b.data(), b.size() * sizeof(double), 1).ok());
    EXPECT_EQ(b, std::vector<double>(5, 2.5));
    ASSERT_TRUE(c.Barrier().ok());
    std::vector<float> p1(3, 1.0f + rank), p2(5, -1.0f), p2_out(5), scratch(8);
    const GatheredPiece pieces[] = {{p1.data(), p1.data(), 12}, {p2.data(), p2_out.data(), 20}};
    ASSERT_TRUE(c.AllReduceGathered(pieces, scratch.data(), 8, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(p1, std::vector<float>(3, ranks_sum));
    EXPECT_EQ(p2_out, std::vector<float>(5, -1.0f * n));
    stats[rank] = c.stats();
  });
  // Counted once per collective: 3 all-reduces, 2 reduce-scatters, 2 all-gathers, an
  // all-to-all, a broadcast, a barrier and the gathered all-reduce.
  for (const TransportStats& s : stats) {
    EXPECT_EQ(s.collectives, 11u);
    EXPECT_GT(s.bytes_sent, 0u);
  }
  // Unequal blocks and all-to-all go as groups: 2 + 1 per rank.
  EXPECT_EQ(fake.calls("GroupStart"), 3 * n);
  EXPECT_EQ(fake.calls("Reduce"), n * n);
  EXPECT_EQ(fake.calls("ReduceScatter"), n);
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclCollectivesTest, ::testing::Values(2, 3, 4));

// A call refused for its arguments is this rank's alone and poisons nothing.
TEST(NcclCommunicatorTest, BadArgumentsAreRefusedWithoutPoisoning) {
  FakeNccl fake;
  NcclWorld world(fake, 2);
  world.Run([&](int rank, Communicator& c) {
    std::vector<int32_t> v(4, 1);
    absl::Status s = c.AllReduce(v.data(), v.data(), 4, DataType::kInt32, ReduceOp::kAverage);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    const size_t three[] = {1, 1, 1};
    s = c.ReduceScatter(v.data(), v.data(), three, DataType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), "NCCL reduce-scatter: 3 blocks for 2 ranks");
    ASSERT_TRUE(c.AllReduce(v.data(), v.data(), 4, DataType::kInt32, ReduceOp::kSum).ok());
    EXPECT_EQ(v, std::vector<int32_t>(4, 2));
  });
}

// A peer whose process ends (its communicator aborted, its connections closed) fails every
// other rank's collective with Unavailable, NCCL's remote error, long before the timeout;
// each survivor aborts its own communicator, and every later call fails at once alike.
TEST(NcclFailuresTest, ALostPeerFailsEveryOtherRank) {
  FakeNccl fake;
  NcclOptions o;
  o.timeout = absl::Seconds(30);
  NcclWorld world(fake, 3, o);
  world.comms[2].reset();  // rank 2's process is gone
  const absl::Time start = absl::Now();
  world.Run([&](int rank, Communicator& c) {
    std::vector<float> v(1024, 1.0f);
    absl::Status s = c.AllReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "rank " << rank << ": " << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), absl::StrCat("NCCL all-reduce of 4096 bytes (float32) on rank ",
                                                           rank, " of 3: remote process exited")))
        << s;
    const absl::Status again = c.Barrier();
    EXPECT_EQ(again, s) << "poisoned: the first error, at once";
  });
  EXPECT_EQ(fake.aborts(0), 1);
  EXPECT_EQ(fake.aborts(1), 1);
}

// An asynchronous error on one rank (CommState reports it; its stream stalls) fails that
// rank at once with the error; its abort closes its connections, so its peers' same
// collective fails with the remote error, all well within the timeout.
TEST(NcclFailuresTest, AnAsynchronousErrorReachesEveryRank) {
  FakeNccl fake;
  NcclOptions o;
  o.timeout = absl::Seconds(30);
  NcclWorld world(fake, 3, o);
  fake.InjectAsyncError(1, absl::InternalError("unhandled system error (injected)"));
  const absl::Time start = absl::Now();
  world.Run([&](int rank, Communicator& c) {
    std::vector<float> v(16, 1.0f);
    absl::Status s = c.AllReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank;
    if (rank == 1) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "unhandled system error (injected)")) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "rank " << rank << ": " << s;
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(fake.aborts(r), 1) << r;
}

// A rank whose stream stops (a kernel that never ends) fails with DeadlineExceeded at the
// timeout, and so does every other rank (its own timeout, or the stalled rank's abort
// reaching it as a remote error): every rank within the timeout plus a margin, none before.
TEST(NcclFailuresTest, AHangPastTheTimeoutFailsEveryRank) {
  FakeNccl fake;
  NcclOptions o;
  o.timeout = absl::Seconds(1);
  NcclWorld world(fake, 3, o);
  fake.InjectHang(1);
  const absl::Time start = absl::Now();
  world.Run([&](int rank, Communicator& c) {
    std::vector<float> v(16, 1.0f);
    absl::Status s = c.AllReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    const absl::Duration took = absl::Now() - start;
    EXPECT_GE(took, absl::Milliseconds(900)) << "rank " << rank;
    EXPECT_LT(took, absl::Seconds(6)) << "rank " << rank;
    if (rank == 1) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_EQ(s.message(),
                "NCCL all-reduce of 64 bytes (float32) on rank 1 of 3: not done after 1s (a peer "
                "lost or stalled, or slower than the timeout: BRAID_TIMEOUT_S); the NCCL "
                "communicator is aborted");
    } else {
      EXPECT_TRUE(s.code() == absl::StatusCode::kDeadlineExceeded ||
                  s.code() == absl::StatusCode::kUnavailable)
          << "rank " << rank << ": " << s;
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(fake.aborts(r), 1) << r;
}

// Creation waits for every rank: one that never joins fails the others' within the timeout.
TEST(NcclFailuresTest, ARankThatNeverJoinsFailsTheCreation) {
  FakeNccl fake;
  NcclOptions o;
  o.timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  NcclWorld world(fake, 3, o, /*joining=*/2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(world.created[r].code(), absl::StatusCode::kDeadlineExceeded) << world.created[r];
    EXPECT_TRUE(absl::StartsWith(world.created[r].message(),
                                 absl::StrCat("creating the NCCL communicator of 3 ranks on rank ",
                                              r, ": not done after 500ms")))
        << world.created[r];
    EXPECT_EQ(fake.aborts(r), 1);
  }
}

// Abort from another thread (the coordinator saying a rank is lost) ends the collective in
// flight with its reason, and every later call.
TEST(NcclFailuresTest, AbortEndsTheCollectiveInFlightWithItsReason) {
  FakeNccl fake;
  NcclWorld world(fake, 2);
  Communicator& c = *world.comms[0];  // rank 1 is alive but never calls
  const absl::Status reason = absl::UnavailableError("rank 1 lost (coordinator)");
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    c.Abort(reason);
  });
  std::vector<float> v(8, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = c.AllReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  aborter.join();
  EXPECT_EQ(s, reason);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(c.Broadcast(v.data(), 32, 0), reason);
  EXPECT_EQ(fake.aborts(0), 1);
}

// A call of a group that fails still ends the group (NCCL's group depth is the thread's: an
// open group would defer every later NCCL call of the thread, ncclCommAbort included), and
// the communicator fails with the call's error.
TEST(NcclCommunicatorTest, AFailedCallInAGroupStillEndsIt) {
  FakeNccl fake;
  NcclWorld world(fake, 2);
  fake.FailNextCall("Send", absl::InternalError("ncclSend: invalid usage (injected)"));
  Communicator& c = *world.comms[0];
  std::vector<char> send(4, 'x'), recv(4);
  const size_t blocks[] = {2, 2};
  absl::Status s = c.AllToAll(send.data(), blocks, recv.data(), blocks);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "(injected)")) << s;
  EXPECT_EQ(fake.calls("GroupEnd"), 1);
  EXPECT_EQ(fake.open_groups(), 0);
  EXPECT_EQ(fake.aborts(0), 1);
}

// NCCL's GroupEnd failing ends the group all the same (the fake drops its work), and the
// communicator is aborted with the error.
TEST(NcclCommunicatorTest, AFailedGroupEndFailsTheCall) {
  FakeNccl fake;
  NcclWorld world(fake, 2);
  fake.FailNextCall("GroupEnd", absl::InternalError("ncclGroupEnd: system error (injected)"));
  Communicator& c = *world.comms[0];
  std::vector<char> send(4, 'x'), recv(4);
  const size_t blocks[] = {2, 2};
  absl::Status s = c.AllToAll(send.data(), blocks, recv.data(), blocks);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "ncclGroupEnd: system error (injected)")) << s;
  EXPECT_EQ(fake.open_groups(), 0);
  EXPECT_EQ(fake.aborts(0), 1);
  EXPECT_EQ(c.Barrier(), s) << "poisoned: the first error, at once";
}

// Abort of a communicator with no call in flight aborts it at once, so a peer waiting for
// this rank in a collective fails with NCCL's remote error long before its timeout.
TEST(NcclFailuresTest, AbortOfAnIdleCommunicatorReachesItsPeersAtOnce) {
  FakeNccl fake;
  NcclOptions o;
  o.timeout = absl::Seconds(30);
  NcclWorld world(fake, 2, o);
  std::thread rank1([&] {
    absl::SleepFor(absl::Milliseconds(100));
    world.comms[1]->Abort(absl::InternalError("rank 1 failed before the bucket"));
  });
  std::vector<float> v(8, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = world.comms[0]->AllReduce(v.data(), v.data(), 8, DataType::kFloat32,
                                             ReduceOp::kSum);
  rank1.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(fake.aborts(1), 1);
  EXPECT_EQ(world.comms[1]->Barrier().message(), "rank 1 failed before the bucket");
}

// The creation watches the caller's abort too (a shutdown while a peer never joins).
TEST(NcclFailuresTest, TheCreationEndsWithTheCallersAbort) {
  FakeNccl fake;
  NcclOptions o;
  o.timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  o.abort_reason = [&] {
    return absl::Now() - start > absl::Milliseconds(200)
               ? absl::CancelledError("braid is shutting down")
               : absl::OkStatus();
  };
  NcclWorld world(fake, 2, o, /*joining=*/1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(world.created[0], absl::CancelledError("braid is shutting down"));
  EXPECT_EQ(fake.aborts(0), 1);
}

// The call returns only once its stream ran it: the double runs the collective on the
// stream's thread after the call returned, so a result read too early would be wrong (the
// collectives test above reads every result right after its call).
TEST(NcclCommunicatorTest, WaitsForTheStreamBeforeReturning) {
  FakeNccl fake;
  NcclWorld world(fake, 2);
  world.Run([&](int rank, Communicator& c) {
    for (int i = 0; i < 50; ++i) {
      std::vector<int64_t> v(64, rank + i);
      ASSERT_TRUE(c.AllReduce(v.data(), v.data(), v.size(), DataType::kInt64, ReduceOp::kSum).ok());
      ASSERT_EQ(v, std::vector<int64_t>(64, 1 + 2 * i)) << i;
    }
    EXPECT_EQ(fake.completed(rank), 50);
  });
}

}  // namespace
}  // namespace braid::transport
