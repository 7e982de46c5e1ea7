// The in-process backend's point-to-point semantics, and what CollectiveCommunicator promises
// on top of any backend: exact statistics counted once per successful call, deadlines,
// Abort from another thread, a lost peer, mismatched sizes, rejected arguments, the sticky
// first error, and collectives composed through RunCollective.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_world.h"
#include "transport/channels.h"
#include "transport/collectives.h"
#include "transport/local_communicator.h"

namespace braid::transport {
namespace {

using braid::testing::RunLocalWorld;

// ---- Point-to-point, driven from one thread (the endpoints are plain objects). ----

TEST(LocalPointToPointTest, ReceivesMatchSourceAndTagWhateverTheOrder) {
  auto p = CreateLocalPointToPoints(3);
  char a = 'a', b = 'b', c = 'c', got_a = 0, got_b = 0, got_c = 0;
  Request s1, s2, s3, r1, r2, r3;
  ASSERT_TRUE(p[0]->PostSend(1, Tag{5, 1}, &b, 1, &s1).ok());
  ASSERT_TRUE(p[0]->PostSend(1, Tag{5, 0}, &a, 1, &s2).ok());
  ASSERT_TRUE(p[2]->PostSend(1, Tag{5, 0}, &c, 1, &s3).ok());  // same tag, other source
  ASSERT_TRUE(p[1]->PostRecv(2, Tag{5, 0}, &got_c, 1, &r3).ok());
  ASSERT_TRUE(p[1]->PostRecv(0, Tag{5, 0}, &got_a, 1, &r1).ok());
  ASSERT_TRUE(p[1]->PostRecv(0, Tag{5, 1}, &got_b, 1, &r2).ok());
  for (Request* r : {&s1, &s2, &s3, &r1, &r2, &r3}) {
    EXPECT_TRUE(p[r->is_recv ? 1 : (r == &s3 ? 2 : 0)]->Test(r).value());
  }
  EXPECT_EQ(got_a, 'a');
  EXPECT_EQ(got_b, 'b');
  EXPECT_EQ(got_c, 'c');
}

TEST(LocalPointToPointTest, ASendCompletesOnlyOnceItsReceiveCopiedIt) {
  auto p = CreateLocalPointToPoints(2);
  std::vector<int> data = {1, 2, 3}, got(3, 0);
  Request s, r;
  ASSERT_TRUE(p[0]->PostSend(1, Tag{0, 0}, data.data(), 12, &s).ok());
  EXPECT_TRUE(s.pending);
  EXPECT_FALSE(p[0]->Test(&s).value());
  data[0] = 7;  // the receive copies the buffer as it is when it matches
  ASSERT_TRUE(p[1]->PostRecv(0, Tag{0, 0}, got.data(), 12, &r).ok());
  EXPECT_TRUE(p[0]->Test(&s).value());
  EXPECT_TRUE(p[1]->Test(&r).value());
  EXPECT_EQ(got, (std::vector<int>{7, 2, 3}));
}

TEST(LocalPointToPointTest, AMessageOfAnotherLengthFailsTheReceive) {
  auto p = CreateLocalPointToPoints(2);
  char out[8] = {0}, in[4] = {0};
  Request s, r;
  ASSERT_TRUE(p[1]->PostRecv(0, Tag{3, 2}, in, 4, &r).ok());
  ASSERT_TRUE(p[0]->PostSend(1, Tag{3, 2}, out, 8, &s).ok());
  absl::StatusOr<bool> got = p[1]->Test(&r);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(got.status().message(),
            "rank 1: received 8 bytes from rank 0, expected 4 (ranks called different "
            "collectives or sizes)");
  EXPECT_FALSE(r.pending);
}

TEST(LocalPointToPointTest, WaitReturnsAtItsDeadlineWhenNothingHappens) {
  auto p = CreateLocalPointToPoints(2);
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(p[0]->Wait(t0, t0 + absl::Milliseconds(50)).ok());
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(50));
}

TEST(LocalPointToPointTest, AbortWakesAWaitAndSticks) {
  auto p = CreateLocalPointToPoints(2);
  absl::Status waited;
  std::thread owner([&] { waited = p[0]->Wait(absl::Now(), absl::Now() + absl::Seconds(60)); });
  p[0]->Abort(absl::CancelledError("stop"));
  p[0]->Abort(absl::InternalError("second reason is ignored"));
  owner.join();
  EXPECT_EQ(waited, absl::CancelledError("stop"));
  EXPECT_EQ(p[0]->Health(), absl::CancelledError("stop"));
  EXPECT_TRUE(p[1]->Health().ok());
}

TEST(LocalPointToPointTest, AClosedPeerFailsPendingAndNewRequests) {
  auto p = CreateLocalPointToPoints(3);
  char buf = 0;
  Request r;
  ASSERT_TRUE(p[1]->PostRecv(0, Tag{0, 0}, &buf, 1, &r).ok());
  p[0].reset();
  absl::StatusOr<bool> got = p[1]->Test(&r);
  EXPECT_EQ(got.status(), absl::UnavailableError("rank 1: rank 0 has left (its endpoint was closed)"));
  Request s;
  EXPECT_EQ(p[2]->PostSend(0, Tag{0, 0}, &buf, 1, &s),
            absl::UnavailableError("rank 2: rank 0 has left (its endpoint was closed)"));
}

// ---- CollectiveCommunicator over the in-process backend. ----

CollectiveOptions Options(absl::Duration timeout = absl::Seconds(30)) {
  CollectiveOptions o;
  o.timeout = timeout;
  o.ring_threshold_bytes = 1024;
  o.chunk_bytes = 1024;
  return o;
}

TransportStats Delta(const TransportStats& after, const TransportStats& before) {
  return {after.bytes_sent - before.bytes_sent, after.bytes_received - before.bytes_received,
          after.messages_sent - before.messages_sent,
          after.messages_received - before.messages_received,
          after.collectives - before.collectives};
}

void ExpectStats(const TransportStats& s, uint64_t sent, uint64_t received, uint64_t msgs_sent,
                 uint64_t msgs_received, const std::string& what) {
  EXPECT_EQ(s.bytes_sent, sent) << what;
  EXPECT_EQ(s.bytes_received, received) << what;
  EXPECT_EQ(s.messages_sent, msgs_sent) << what;
  EXPECT_EQ(s.messages_received, msgs_received) << what;
  EXPECT_EQ(s.collectives, 1u) << what;
}

// Byte counts worked out from each algorithm's definition, per rank.
TEST(CommunicatorStatsTest, EachCallCountsTheBytesItsAlgorithmMoves) {
  RunLocalWorld(4, Options(), [](int rank, Communicator& comm) {
    float small[10] = {0};
    TransportStats s0 = comm.stats();
    ASSERT_TRUE(comm.AllReduce(small, small, 10, DataType::kFloat32, ReduceOp::kSum).ok());
    // Recursive doubling on 4 ranks: two rounds exchanging the whole 40 bytes.
    ExpectStats(Delta(comm.stats(), s0), 80, 80, 2, 2, "recursive doubling");
    std::vector<float> big(4000, 1.0f);
    s0 = comm.stats();
    ASSERT_TRUE(comm.AllReduce(big.data(), big.data(), 4000, DataType::kFloat32, ReduceOp::kSum).ok());
    // Direct reduce-scatter + ring all-gather: 2(n-1)/n of 16000 bytes, in 1000-byte pieces
    // (4 per 4000-byte segment): 3 peers x 4 pieces, then 3 steps x 4 pieces.
    ExpectStats(Delta(comm.stats(), s0), 24000, 24000, 24, 24, "direct all-reduce");
    EXPECT_EQ(big[1234], 4.0f);
    s0 = comm.stats();
    ASSERT_TRUE(comm.Barrier().ok());
    ExpectStats(Delta(comm.stats(), s0), 0, 0, 2, 2, "barrier");  // ceil(log2 4) rounds
    char bytes[100] = {0};
    s0 = comm.stats();
    ASSERT_TRUE(comm.Broadcast(bytes, 100, 0).ok());
    // Binomial tree from 0: 0 -> 2, 0 -> 1, 2 -> 3.
    const uint64_t sends[] = {2, 0, 1, 0}, recvs[] = {0, 1, 1, 1};
    ExpectStats(Delta(comm.stats(), s0), 100 * sends[rank], 100 * recvs[rank], sends[rank],
                recvs[rank], "broadcast");
    char block[12] = {0}, all[48];
    const std::vector<size_t> sizes(4, 12);
    s0 = comm.stats();
    ASSERT_TRUE(comm.AllGather(block, 12, all, sizes).ok());
    ExpectStats(Delta(comm.stats(), s0), 36, 36, 3, 3, "all-gather");  // 3 ring steps
    EXPECT_EQ(comm.stats().collectives, 5u);
  });
}

// Recursive doubling on 3 ranks: rank 0 hands its data to rank 1 and gets the result back.
TEST(CommunicatorStatsTest, RecursiveDoublingOnThreeRanksCountsThePairingSteps) {
  RunLocalWorld(3, Options(), [](int rank, Communicator& comm) {
    double x[5] = {1, 2, 3, 4, 5};
    ASSERT_TRUE(comm.AllReduce(x, x, 5, DataType::kFloat64, ReduceOp::kSum).ok());
    EXPECT_EQ(x[4], 15.0);
    const uint64_t sent[] = {40, 80, 40}, msgs[] = {1, 2, 1};
    ExpectStats(comm.stats(), sent[rank], sent[rank], msgs[rank], msgs[rank], "3 ranks");
  });
}

TEST(CommunicatorStatsTest, AWorldOfOneCountsCallsButNoMessages) {
  RunLocalWorld(1, Options(), [](int rank, Communicator& comm) {
    int32_t v[3] = {1, 2, 3}, out[3];
    ASSERT_TRUE(comm.AllReduce(v, out, 3, DataType::kInt32, ReduceOp::kSum).ok());
    EXPECT_EQ(out[2], 3);
    ASSERT_TRUE(comm.Barrier().ok());
    const TransportStats s = comm.stats();
    EXPECT_EQ(s.collectives, 2u);
    EXPECT_EQ(s.bytes_sent + s.bytes_received + s.messages_sent + s.messages_received, 0u);
  });
}

// A peer that never joins: DeadlineExceeded after the progress timeout, nothing counted, and
// every later call fails at once with the same error.
// Sizes whose bytes overflow, or exceed the limit of a tensor (2^48 bytes), are refused
// before any buffer is touched or any message sent, on every rank alike, and do not poison
// the communicator: a valid call works after them.
TEST(CommunicatorFailureTest, OverflowingSizesAreInvalidArgumentBeforeAnythingMoves) {
  RunLocalWorld(2, Options(), [](int rank, Communicator& comm) {
    const size_t huge = SIZE_MAX / 2;
    absl::Status s = comm.AllReduce(nullptr, nullptr, huge, DataType::kFloat64, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), absl::StrCat("all-reduce: ", huge,
                                        " elements of 8 bytes exceed the limit of a tensor, "
                                        "2^48 bytes"));
    const std::vector<size_t> counts = {SIZE_MAX - 1, 4};
    s = comm.ReduceScatter(nullptr, nullptr, counts, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(s.message(), "reduce-scatter: the sizes sum beyond 2^64");
    const std::vector<size_t> bytes = {size_t{1} << 47, size_t{1} << 47, size_t{1} << 47};
    EXPECT_EQ(comm.AllToAll(nullptr, bytes, nullptr, bytes).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.Broadcast(nullptr, size_t{1} << 49, 0).code(),
              absl::StatusCode::kInvalidArgument);
    float x[2] = {1.0f, static_cast<float>(rank)};
    EXPECT_TRUE(comm.AllReduce(x, x, 2, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(x[1], 1.0f);
  });
}

TEST(CommunicatorFailureTest, ASilentPeerGivesDeadlineExceededAndPoisons) {
  const absl::Duration timeout = absl::Milliseconds(200);
  absl::Notification done;
  RunLocalWorld(2, Options(timeout), [&](int rank, Communicator& comm) {
    if (rank == 1) {
      done.WaitForNotification();
      return;
    }
    float x = 1;
    const absl::Time t0 = absl::Now();
    absl::Status s = comm.AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    const absl::Duration took = absl::Now() - t0;
    EXPECT_EQ(s, absl::DeadlineExceededError(
                     "rank 0: collective #0 made no progress for 200ms (BRAID_TIMEOUT_S); "
                     "waiting for a message from rank 1 and the delivery of a message to "
                     "rank 1"));
    EXPECT_GE(took, timeout);
    EXPECT_LT(took, timeout + absl::Seconds(2));
    EXPECT_EQ(comm.stats().collectives, 0u);
    EXPECT_EQ(comm.stats().messages_sent, 0u);
    const absl::Time t1 = absl::Now();
    EXPECT_EQ(comm.Barrier(), s);
    EXPECT_LT(absl::Now() - t1, absl::Milliseconds(100));
    done.Notify();
  });
}

// The deadline's error names the peers each rank still waited on. Recursive doubling on 4
// ranks with rank 3 silent: rank 2 (its first partner) and rank 1 (its second) wait on rank
// 3; rank 0 finishes its first round with rank 1, then waits on rank 2, stuck in its own.
// What ranks 0 and 1 did complete before the failure is not counted.
TEST(CommunicatorFailureTest, TheDeadlineNamesThePeersEachRankWaitsOn) {
  const absl::Duration timeout = absl::Milliseconds(300);
  absl::Notification done;
  std::atomic<int> left{3};
  const std::string waits_on[] = {"rank 2", "rank 3", "rank 3"};
  RunLocalWorld(4, Options(timeout), [&](int rank, Communicator& comm) {
    if (rank != 3) {
      float x = 1;
      absl::Status s = comm.AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
      EXPECT_EQ(s, absl::DeadlineExceededError(absl::StrCat(
                       "rank ", rank, ": collective #0 made no progress for 300ms "
                       "(BRAID_TIMEOUT_S); waiting for a message from ", waits_on[rank],
                       " and the delivery of a message to ", waits_on[rank])));
      // Ranks 0 and 1 completed their first round's messages, but a call that fails adds
      // nothing to the statistics (Note [Transport statistics]).
      const TransportStats st = comm.stats();
      EXPECT_EQ(st.collectives + st.messages_sent + st.messages_received + st.bytes_sent +
                    st.bytes_received,
                0u)
          << "rank " << rank;
      if (--left == 0) done.Notify();
    }
    done.WaitForNotification();  // nobody leaves early: a closed peer is another error
  });
}

// Abort() from another thread fails a collective blocked waiting for a peer, with its reason.
TEST(CommunicatorFailureTest, AbortFromAnotherThreadWakesABlockedCollective) {
  absl::Notification done;
  RunLocalWorld(2, Options(), [&](int rank, Communicator& comm) {
    if (rank == 1) {  // never joins the broadcast
      done.WaitForNotification();
      return;
    }
    std::thread aborter([&comm] {
      absl::SleepFor(absl::Milliseconds(100));  // let rank 0 block first
      comm.Abort(absl::CancelledError("test abort"));
    });
    char byte = 0;
    const absl::Time t0 = absl::Now();
    absl::Status s = comm.Broadcast(&byte, 1, 1);
    const absl::Duration took = absl::Now() - t0;
    aborter.join();
    EXPECT_EQ(s, absl::CancelledError("test abort"));
    EXPECT_LT(took, absl::Seconds(5));  // far below the 30 s timeout
    EXPECT_EQ(comm.Barrier(), absl::CancelledError("test abort"));
    done.Notify();
  });
}

TEST(CommunicatorFailureTest, AbortBeforeACallFailsItAtOnce) {
  RunLocalWorld(2, Options(), [&](int rank, Communicator& comm) {
    comm.Abort(absl::UnavailableError("coordinator lost rank 3"));
    int x = 0;
    EXPECT_EQ(comm.AllReduce(&x, &x, 1, DataType::kInt32, ReduceOp::kMax),
              absl::UnavailableError("coordinator lost rank 3"));
  });
}

// Rank 2's endpoint is gone: the ranks that talk to it fail with Unavailable naming it.
TEST(CommunicatorFailureTest, ALostPeerGivesUnavailableNamingIt) {
  auto comms = CreateLocalCommunicators(3, Options());
  comms[2].reset();
  std::vector<absl::Status> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back([&, r] { got[r] = comms[r]->Barrier(); });
  for (std::thread& t : threads) t.join();
  // Dissemination round 0: rank 0 receives from rank 2, rank 1 sends to it.
  EXPECT_EQ(got[0], absl::UnavailableError("rank 0: rank 2 has left (its endpoint was closed)"));
  EXPECT_EQ(got[1], absl::UnavailableError("rank 1: rank 2 has left (its endpoint was closed)"));
}

TEST(CommunicatorFailureTest, MismatchedSizesFailOnBothRanks) {
  RunLocalWorld(2, Options(), [&](int rank, Communicator& comm) {
    std::vector<float> x(8 + rank, 1.0f);
    absl::Status s = comm.AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32,
                                    ReduceOp::kSum);
    const std::string want =
        rank == 0 ? "rank 0: received 36 bytes from rank 1, expected 32"
                  : "rank 1: received 32 bytes from rank 0, expected 36";
    EXPECT_EQ(s, absl::InternalError(want + " (ranks called different collectives or sizes)"));
  });
}

TEST(CommunicatorFailureTest, BadArgumentsAreRejectedWithoutPoisoning) {
  RunLocalWorld(2, Options(), [&](int rank, Communicator& comm) {
    int32_t v[2] = {1, 2};
    const std::vector<size_t> three(3, 1);
    EXPECT_EQ(comm.ReduceScatter(v, v, three, DataType::kInt32, ReduceOp::kSum),
              absl::InvalidArgumentError("reduce-scatter needs one count per rank: got 3 for 2"));
    EXPECT_EQ(comm.AllReduce(v, v, 2, DataType::kInt32, ReduceOp::kAverage).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.Broadcast(v, 8, 2),
              absl::InvalidArgumentError("broadcast root 2 is not a rank of a world of size 2"));
    ASSERT_TRUE(comm.AllReduce(v, v, 2, DataType::kInt32, ReduceOp::kSum).ok());
    EXPECT_EQ(v[1], 4);
    EXPECT_EQ(comm.stats().collectives, 1u);
  });
}

// A compressor's pattern: broadcast the leader's indices, then all-reduce the values they
// select, as one collective.
TEST(CommunicatorComposeTest, RunCollectiveRunsSeveralAlgorithmsAsOneCall) {
  RunLocalWorld(3, Options(), [&](int rank, Communicator& comm) {
    int32_t idx[2] = {rank == 0 ? 4 : -1, rank == 0 ? 1 : -1};
    float values[2] = {0, 0};
    const float dense[5] = {10.0f * rank, 1.0f + rank, 2, 3, 100.0f * rank};
    absl::Status s = comm.RunCollective([&](Context& ctx) -> absl::Status {
      absl::Status b = BroadcastBinomial(ctx, idx, sizeof(idx), 0);
      if (!b.ok()) return b;
      for (int k = 0; k < 2; ++k) values[k] = dense[idx[k]];
      return AllReduceRecursiveDoubling(ctx, values, values, 2, DataType::kFloat32,
                                        ReduceOp::kSum);
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(values[0], 300.0f);  // dense[4] summed over ranks 0, 1, 2
    EXPECT_EQ(values[1], 6.0f);    // dense[1]
    EXPECT_EQ(comm.stats().collectives, 1u);
    // Broadcast: 0 -> 2 and 0 -> 1, 8 bytes each. Recursive doubling on 3 ranks: 0 -> 1
    // (pre-step), 1 <-> 2, 1 -> 0 (post-step), 8 bytes each.
    const uint64_t sent[] = {16 + 8, 16, 8};
    EXPECT_EQ(comm.stats().bytes_sent, sent[rank]) << "rank " << rank;
  });
}

TEST(CommunicatorComposeTest, BarrierReturnsOnlyOnceEveryRankEnteredIt) {
  std::atomic<int> entered{0};
  RunLocalWorld(5, Options(), [&](int rank, Communicator& comm) {
    for (int round = 1; round <= 20; ++round) {
      entered.fetch_add(1);
      ASSERT_TRUE(comm.Barrier().ok());
      EXPECT_GE(entered.load(), 5 * round) << "rank " << rank << " left barrier " << round
                                           << " early";
      ASSERT_TRUE(comm.Barrier().ok());  // nobody enters the next round before all checked
    }
  });
}

// Interrupting one channel fails that channel only: the other, and a process set's channels
// over the same layer, go on (a vote woken when a rank left, Note [Process sets]).
TEST(ChannelsTest, InterruptingOneChannelLeavesTheOthersRunning) {
  std::vector<Channels> world = CreateLocalChannels(2);
  world[0].control->Interrupt(absl::CancelledError("peer left"));
  EXPECT_EQ(world[0].control->Barrier(), absl::CancelledError("peer left"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      float x = 1.0f + r;
      EXPECT_TRUE(world[r].data->AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum).ok());
      EXPECT_EQ(x, 3.0f);
      Channels set = world[r].subset(1, {0, 1});
      EXPECT_TRUE(set.control->Barrier().ok());
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace braid::transport

namespace braid::transport {
namespace {

// Note [Channels]: the two channels' messages under the same tag never match each other's
// receives: rank 0 sends the data channel's message first, yet the control channel's receive
// gets the control channel's (over one channel it would take the first one sent).
TEST(ChannelsTest, TheChannelsOfOneLayerNeverMatchEachOthersMessages) {
  auto layers = CreateLocalPointToPoints(2);
  auto from = SplitPointToPoint(std::move(layers[0]));
  auto to = SplitPointToPoint(std::move(layers[1]));
  char d = 'd', c = 'c', got_c = 0, got_d = 0;
  Request sd, sc, rc, rd;
  ASSERT_TRUE(from.data->PostSend(1, Tag{0, 0}, &d, 1, &sd).ok());
  ASSERT_TRUE(from.control->PostSend(1, Tag{0, 0}, &c, 1, &sc).ok());
  ASSERT_TRUE(to.control->PostRecv(0, Tag{0, 0}, &got_c, 1, &rc).ok());
  ASSERT_TRUE(to.data->PostRecv(0, Tag{0, 0}, &got_d, 1, &rd).ok());
  EXPECT_TRUE(to.control->Test(&rc).value());
  EXPECT_TRUE(to.data->Test(&rd).value());
  EXPECT_TRUE(from.data->Test(&sd).value());
  EXPECT_TRUE(from.control->Test(&sc).value());
  EXPECT_EQ(got_c, 'c');
  EXPECT_EQ(got_d, 'd');
}

// Each channel's collectives carry their own sequence: a vote's all-gather on the control
// channel between two data all-reduces leaves both channels' results right.
TEST(ChannelsTest, CollectivesOnBothChannelsInterleaveInOneOrder) {
  std::vector<Channels> world = CreateLocalChannels(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Channels& ch = world[r];
      std::vector<float> data(1000, 1.0f + r);
      int32_t mine = 10 + r;
      std::vector<int32_t> gathered(2);
      std::vector<size_t> four(2, sizeof(int32_t));
      for (int step = 0; step < 3; ++step) {
        EXPECT_TRUE(ch.data->AllReduce(data.data(), data.data(), data.size(),
                                       DataType::kFloat32, ReduceOp::kSum).ok());
        EXPECT_TRUE(ch.control->AllGather(&mine, sizeof(mine), gathered.data(), four).ok());
      }
      EXPECT_EQ(data, std::vector<float>(1000, 3.0f * 2 * 2));
      EXPECT_EQ(gathered, (std::vector<int32_t>{10, 11}));
      EXPECT_EQ(ch.data->stats().collectives, 3u);
      EXPECT_EQ(ch.control->stats().collectives, 3u);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Aborting one channel aborts the layer under both: a failure is the rank's, not a channel's.
TEST(ChannelsTest, AbortingOneChannelFailsTheOther) {
  std::vector<Channels> world = CreateLocalChannels(2);
  world[0].control->Abort(absl::CancelledError("stop"));
  EXPECT_EQ(world[0].data->Barrier(), absl::CancelledError("stop"));
}

}  // namespace
}  // namespace braid::transport
