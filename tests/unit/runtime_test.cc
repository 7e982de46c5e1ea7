// braid::Runtime in one process: several ranks as threads, each with the in-process
// coordinator and communicators injected (tests/testing/runtime_world.h). The queue,
// negotiation, handles, error paths and lifecycle, asserted against references computed here
// and exact error texts. The all-reduce pipeline has its own file (runtime_pipeline_test.cc).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "runtime/loop_affinity.h"
#include "runtime/runtime.h"
#include "tests/testing/delegating_communicator.h"
#include "tests/testing/runtime_world.h"
#include "tests/testing/thread_count.h"

namespace braid {
namespace {

using testing::RuntimeWorld;
using testing::RuntimeWorldOptions;
using testing::WorldOf;

CollectiveRequest AllReduce(const std::string& name, const float* in, float* out, int64_t n,
                            ReduceOp op = ReduceOp::kSum) {
  CollectiveRequest r;
  r.name = name;
  r.shape = {n};
  r.input = in;
  r.output = out;
  r.op = op;
  return r;
}

absl::Status WaitFor(const absl::StatusOr<std::shared_ptr<Handle>>& h) {
  if (!h.ok()) return h.status();
  return (*h)->Wait(absl::Seconds(30));
}

CollectiveRequest Barrier(const std::string& name) {
  CollectiveRequest r;
  r.name = name;
  r.collective = Collective::kBarrier;
  return r;
}

// The error a peer of a rank that refused `name` locally gets: the report itself when the
// peer had submitted the tensor first, else the poisoned name's error quoting it (Note
// [Resynchronization] in coordinator/negotiation.h); which one depends on timing.
void ExpectRefusalReported(const absl::Status& got, const std::string& report) {
  if (got.code() == absl::StatusCode::kInvalidArgument) {
    EXPECT_EQ(got.message(), report);
  } else {
    EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition) << got;
    EXPECT_NE(got.message().find(absl::StrCat("(", report, ")")), absl::string_view::npos)
        << got;
  }
}

TEST(RuntimeTest, EverythingBeforeInitIsFailedPrecondition) {
  Runtime rt;
  std::vector<float> x(4);
  const std::string want = "braid is not initialized: call init() first";
  EXPECT_EQ(rt.Enqueue(AllReduce("x", x.data(), x.data(), 4)).status(),
            absl::FailedPreconditionError(want));
  EXPECT_EQ(rt.rank().status(), absl::FailedPreconditionError(want));
  EXPECT_EQ(rt.compression_report().status(), absl::FailedPreconditionError(want));
  EXPECT_EQ(rt.transport_stats().status(), absl::FailedPreconditionError(want));
  EXPECT_EQ(rt.compression_state().status(), absl::FailedPreconditionError(want));
  EXPECT_FALSE(rt.initialized());
  EXPECT_TRUE(rt.Shutdown().ok()) << "shutting down what never started is fine";
}

// Every collective once on three ranks, against references computed here.
TEST(RuntimeTest, EveryCollectiveMatchesItsReference) {
  RuntimeWorld world(WorldOf(3));
  ASSERT_TRUE(world.InitOk());
  world.Run([](int rank, Runtime& rt) {
    EXPECT_EQ(*rt.rank(), rank);
    EXPECT_EQ(*rt.size(), 3);
    // all-gather, dim 0 = rank + 1.
    std::vector<int32_t> mine((rank + 1) * 2, rank);
    CollectiveRequest g;
    g.name = "gather";
    g.collective = Collective::kAllGather;
    g.dtype = DataType::kInt32;
    g.shape = {rank + 1, 2};
    g.input = mine.data();
    auto h = rt.Enqueue(g);
    ASSERT_TRUE(WaitFor(h).ok());
    EXPECT_EQ((*h)->output_shape(), (std::vector<int64_t>{6, 2}));
    std::vector<int32_t> got(12);
    std::memcpy(got.data(), (*h)->output().data(), 12 * sizeof(int32_t));
    EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}));
    // broadcast from rank 1.
    std::vector<double> b(5, rank == 1 ? 2.5 : -1.0);
    CollectiveRequest bc;
    bc.name = "bcast";
    bc.collective = Collective::kBroadcast;
    bc.dtype = DataType::kFloat64;
    bc.shape = {5};
    bc.input = b.data();
    bc.output = b.data();
    bc.root_rank = 1;
    ASSERT_TRUE(WaitFor(rt.Enqueue(bc)).ok());
    EXPECT_EQ(b, std::vector<double>(5, 2.5));
    // reduce-scatter of 7 rows: 3, 2, 2.
    std::vector<float> rs(7 * 2), part(7 * 2, -1);
    for (int i = 0; i < 14; ++i) rs[i] = static_cast<float>(i + 100 * rank);
    CollectiveRequest sc;
    sc.name = "scatter";
    sc.collective = Collective::kReduceScatter;
    sc.shape = {7, 2};
    sc.input = rs.data();
    sc.output = part.data();
    sc.op = ReduceOp::kSum;
    h = rt.Enqueue(sc);
    ASSERT_TRUE(WaitFor(h).ok());
    const int first_row = rank == 0 ? 0 : rank == 1 ? 3 : 5, rows = rank == 0 ? 3 : 2;
    EXPECT_EQ((*h)->output_shape(), (std::vector<int64_t>{rows, 2}));
    for (int i = 0; i < rows * 2; ++i) {
      EXPECT_EQ(part[i], 3.0f * (first_row * 2 + i) + 300.0f) << "rank " << rank << " " << i;
    }
    // all-to-all with splits: rank r sends r + 1 rows to each rank.
    std::vector<int64_t> send(3 * (rank + 1));
    for (size_t i = 0; i < send.size(); ++i) send[i] = rank * 1000 + static_cast<int64_t>(i);
    CollectiveRequest a2a;
    a2a.name = "a2a";
    a2a.collective = Collective::kAllToAll;
    a2a.dtype = DataType::kInt64;
    a2a.shape = {3 * (rank + 1)};
    a2a.input = send.data();
    a2a.splits = {rank + 1, rank + 1, rank + 1};
    h = rt.Enqueue(a2a);
    ASSERT_TRUE(WaitFor(h).ok());
    std::vector<int64_t> want;
    for (int p = 0; p < 3; ++p) {
      for (int k = 0; k <= p; ++k) want.push_back(p * 1000 + rank * (p + 1) + k);
    }
    ASSERT_EQ((*h)->output().size(), want.size() * sizeof(int64_t));
    std::vector<int64_t> recv(want.size());
    std::memcpy(recv.data(), (*h)->output().data(), (*h)->output().size());
    EXPECT_EQ(recv, want);
    CollectiveRequest barrier;
    barrier.name = "barrier";
    barrier.collective = Collective::kBarrier;
    EXPECT_TRUE(WaitFor(rt.Enqueue(barrier)).ok());
  });
}

// A burst of 40 tensors, enqueued in a different order on every rank, all complete with
// the right sums: the queue, the batching of requests and the coordinator's order.
TEST(RuntimeTest, FortyTensorsInDifferentOrdersPerRank) {
  RuntimeWorld world(WorldOf(3));
  ASSERT_TRUE(world.InitOk());
  world.Run([](int rank, Runtime& rt) {
    std::vector<int> order(40);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(rank));
    std::vector<std::vector<float>> in(40), out(40);
    std::vector<std::shared_ptr<Handle>> handles(40);
    for (int t : order) {
      in[t].assign(10 + t, static_cast<float>(rank + t));
      out[t].assign(10 + t, 0.0f);
      auto h = rt.Enqueue(AllReduce(absl::StrCat("t", t), in[t].data(), out[t].data(), 10 + t));
      ASSERT_TRUE(h.ok()) << h.status();
      handles[t] = *h;
    }
    for (int t = 0; t < 40; ++t) {
      ASSERT_TRUE(handles[t]->Wait(absl::Seconds(30)).ok()) << t;
      EXPECT_EQ(out[t], std::vector<float>(10 + t, static_cast<float>(3 + 3 * t))) << t;
    }
  });
}

// A mismatch fails the tensor on every rank with one message naming it and each rank's
// value; the job goes on.
TEST(RuntimeTest, MismatchesFailEveryRankWithTheSameMessageAndTheJobGoesOn) {
  RuntimeWorld world(WorldOf(3));
  ASSERT_TRUE(world.InitOk());
  std::vector<std::string> shape_errors(3), method_errors(3);
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> x(8, 1.0f);
    absl::Status s = WaitFor(rt.Enqueue(AllReduce("bad", x.data(), x.data(), rank == 2 ? 5 : 4)));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    shape_errors[rank] = std::string(s.message());
    CollectiveRequest r = AllReduce("mixed", x.data(), x.data(), 4);
    r.compression = rank == 0 ? "fp16" : "none";
    s = WaitFor(rt.Enqueue(r));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    method_errors[rank] = std::string(s.message());
    std::vector<float> y(4, static_cast<float>(rank)), z(4);
    ASSERT_TRUE(WaitFor(rt.Enqueue(AllReduce("after", y.data(), z.data(), 4))).ok());
    EXPECT_EQ(z, std::vector<float>(4, 3.0f));
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(shape_errors[r],
              "tensor 'bad': shape differs across ranks: [4] on ranks 0, 1; [5] on rank 2");
    EXPECT_EQ(method_errors[r],
              "tensor 'mixed': compression differs across ranks: fp16 on rank 0; none on "
              "ranks 1, 2");
  }
}

TEST(RuntimeTest, ANameInFlightIsAlreadyExistsUntilItCompletes) {
  RuntimeWorld world;
  ASSERT_TRUE(world.InitOk());
  std::vector<float> x(4, 1.0f), y(4), z(4);
  // Rank 0 alone: its "x" waits for rank 1.
  auto first = world[0].Enqueue(AllReduce("x", x.data(), y.data(), 4));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(world[0].Enqueue(AllReduce("x", x.data(), z.data(), 4)).status(),
            absl::AlreadyExistsError("tensor 'x' is already in flight on rank 0: wait for it "
                                     "to complete before reusing the name"));
  EXPECT_FALSE((*first)->Poll());
  std::vector<float> x1(4, 2.0f), y1(4);
  ASSERT_TRUE(WaitFor(world[1].Enqueue(AllReduce("x", x1.data(), y1.data(), 4))).ok());
  ASSERT_TRUE((*first)->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(y, std::vector<float>(4, 3.0f));
  // Completed: the name is free again.
  world.Run([](int rank, Runtime& rt) {
    std::vector<float> a(4, 1.0f), b(4);
    EXPECT_TRUE(WaitFor(rt.Enqueue(AllReduce("x", a.data(), b.data(), 4))).ok());
  });
}

TEST(RuntimeTest, BadRequestsAreInvalidArgumentAtEnqueue) {
  RuntimeWorld world;
  ASSERT_TRUE(world.InitOk());
  Runtime& rt = world[0];
  std::vector<float> x(4);
  CollectiveRequest r = AllReduce("nulls", x.data(), nullptr, 4);
  EXPECT_EQ(rt.Enqueue(r).status(),
            absl::InvalidArgumentError("allreduce 'nulls' on rank 0: output buffer is null"));
  r = AllReduce("", x.data(), x.data(), 4);
  EXPECT_EQ(rt.Enqueue(r).status(),
            absl::InvalidArgumentError("allreduce '' on rank 0: a name is required"));
  std::vector<int32_t> ints(4);
  CollectiveRequest c;
  c.name = "ints";
  c.dtype = DataType::kInt32;
  c.shape = {4};
  c.input = ints.data();
  c.output = ints.data();
  c.op = ReduceOp::kSum;
  c.compression = "fp16";
  EXPECT_EQ(rt.Enqueue(c).status(),
            absl::InvalidArgumentError(
                "allreduce 'ints' on rank 0: compression 'fp16' applies only to allreduce of "
                "floating-point tensors with op sum or average, got int32 / sum"));
  c.dtype = DataType::kFloat32;
  c.compression = "fp5";
  EXPECT_EQ(rt.Enqueue(c).status().message(),
            absl::StrCat("allreduce 'ints' on rank 0: compression 'fp5': unknown method 'fp5'; "
                         "valid methods: ",
                         absl::StrJoin(CompressionMethods(), ", ")));
  EXPECT_EQ(CanonicalCompression("fp4:chunk=128,ef=1").value(), "fp4:ef=1");
}

// Note [Local failures]: a collective rank 1 refuses fails on rank 0, which submitted it,
// at once (not at the negotiation deadline), naming the tensor, rank 1 and the cause; both
// ranks go on.
TEST(RuntimeTest, ARefusalOnOneRankFailsItsPeersAtOnce) {
  RuntimeWorld world;
  ASSERT_TRUE(world.InitOk());
  const std::string cause =
      "allreduce 'w' on rank 1: compression 'fp16' applies only to allreduce of "
      "floating-point tensors with op sum or average, got int32 / sum";
  world.Run([&](int rank, Runtime& rt) {
    std::vector<int32_t> ints(4, rank);
    CollectiveRequest c;
    c.name = "w";
    c.dtype = DataType::kInt32;
    c.shape = {4};
    c.input = ints.data();
    c.output = ints.data();
    c.op = ReduceOp::kSum;
    if (rank == 1) {
      c.compression = "fp16";
      EXPECT_EQ(rt.Enqueue(c).status(), absl::InvalidArgumentError(cause));
    } else {
      auto h = rt.Enqueue(c);
      ASSERT_TRUE(h.ok()) << h.status();
      // Well within the 2 s the failure must take, far below the negotiation deadline.
      ExpectRefusalReported((*h)->Wait(absl::Seconds(2)),
                            absl::StrCat("tensor 'w' failed on rank 1: ", cause));
    }
    std::vector<float> x(4, static_cast<float>(rank + 1)), y(4);
    ASSERT_TRUE(WaitFor(rt.Enqueue(AllReduce("after", x.data(), y.data(), 4))).ok());
    EXPECT_EQ(y, std::vector<float>(4, 3.0f));
  });
}

// Under the fast path a tensor every rank has cached is agreed among the ranks, not by the
// coordinator. A refusal of it on one rank still fails it on its peers at once (its slot
// leaves every rank's cache, so the peers ask the coordinator, which holds the failure), and
// that error, sent to one rank alone, leaves the ranks' agreement in step: after a barrier
// the same cached tensors go on giving the right sums.
TEST(RuntimeTest, ARefusalOfACachedTensorFailsItsPeersUnderTheFastPath) {
  RuntimeWorldOptions o = WorldOf(2);
  o.settings.set_fast_path(1);
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  const std::string cause = "allreduce 'w' on rank 1: input buffer is null";
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> x(4), y(4);
    auto step = [&](int k) {
      for (const char* name : {"w", "v"}) {
        std::fill(x.begin(), x.end(), static_cast<float>(rank + k));
        EXPECT_TRUE(WaitFor(rt.Enqueue(AllReduce(name, x.data(), y.data(), 4))).ok())
            << name << " at step " << k;
        EXPECT_EQ(y, std::vector<float>(4, static_cast<float>(1 + 2 * k))) << name;
      }
    };
    for (int k = 0; k < 3; ++k) step(k);
    if (rank == 1) {
      EXPECT_EQ(rt.Enqueue(AllReduce("w", nullptr, y.data(), 4)).status(),
                absl::InvalidArgumentError(cause));
    } else {
      auto h = rt.Enqueue(AllReduce("w", x.data(), y.data(), 4));
      ASSERT_TRUE(h.ok()) << h.status();
      ExpectRefusalReported((*h)->Wait(absl::Seconds(2)),
                            absl::StrCat("tensor 'w' failed on rank 1: ", cause));
    }
    // 'w' may be poisoned (rank 0's call came after the report): the ranks resynchronize.
    EXPECT_TRUE(WaitFor(rt.Enqueue(Barrier("resync"))).ok());
    for (int k = 3; k < 8; ++k) step(k);
  });
}

// A cached tensor one rank never calls: held for the ranks' vote, it falls back to the
// coordinator (after min(1 s, stall check / 2, negotiation deadline / 2)), whose negotiation
// deadline fails it on the rank that called it, naming both sides; after a barrier the job
// goes on.
TEST(RuntimeTest, TheNegotiationDeadlineFailsACachedTensorOneRankNeverCalls) {
  RuntimeWorldOptions o = WorldOf(2);
  o.settings.set_fast_path(1);
  o.settings.set_stall_check_ms(1000);
  o.settings.set_negotiation_timeout_ms(2000);
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  absl::Notification failed;  // rank 1 waits for it: a tensor it submitted would expire too
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> x(4, static_cast<float>(rank + 1)), y(4);
    for (int k = 0; k < 3; ++k) {
      for (const char* name : {"w", "v"}) {
        EXPECT_TRUE(WaitFor(rt.Enqueue(AllReduce(name, x.data(), y.data(), 4))).ok()) << name;
        EXPECT_EQ(y, std::vector<float>(4, 3.0f));
      }
    }
    if (rank == 0) {
      const absl::Time start = absl::Now();
      auto h = rt.Enqueue(AllReduce("w", x.data(), y.data(), 4));
      ASSERT_TRUE(h.ok()) << h.status();
      absl::Status s = (*h)->Wait(absl::Seconds(10));
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "submitted by rank 0 but not by rank 1")) << s;
      EXPECT_GE(absl::Now() - start, absl::Seconds(2));
      failed.Notify();
    } else {
      EXPECT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(15)));
    }
    // The deadline leaves the job out of step until the ranks resynchronize (Note
    // [Resynchronization] in coordinator/negotiation.h).
    EXPECT_EQ(WaitFor(rt.Enqueue(AllReduce("v", x.data(), y.data(), 4))).code(),
              absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(WaitFor(rt.Enqueue(Barrier("resync"))).ok());
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(WaitFor(rt.Enqueue(AllReduce("v", x.data(), y.data(), 4))).ok());
      EXPECT_EQ(y, std::vector<float>(4, 3.0f));
    }
  });
}

std::string ReadFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return text;
}

// start_timeline / stop_timeline while the job runs: each file holds what ran while it was
// recording and nothing else, closed as a JSON array; rank 1 writes PATH.rank1.
TEST(RuntimeTest, TheTimelineStartsAndStopsWhileTheJobRuns) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string base = absl::StrCat(dir ? dir : "/tmp", "/braid-rt-timeline-", getpid());
  RuntimeWorld world;
  ASSERT_TRUE(world.InitOk());
  EXPECT_EQ(world[0].StartTimeline(""),
            absl::InvalidArgumentError("start_timeline needs a file path"));
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> x(4, 1.0f), y(4);
    ASSERT_TRUE(rt.StartTimeline(base + "-a.json").ok());
    ASSERT_TRUE(WaitFor(rt.Enqueue(AllReduce("recorded", x.data(), y.data(), 4))).ok());
    ASSERT_TRUE(rt.StopTimeline().ok());
    ASSERT_TRUE(rt.StopTimeline().ok()) << "stopping twice is fine";
    ASSERT_TRUE(WaitFor(rt.Enqueue(AllReduce("unrecorded", x.data(), y.data(), 4))).ok());
    ASSERT_TRUE(rt.StartTimeline(base + "-b.json").ok());
    ASSERT_TRUE(WaitFor(rt.Enqueue(AllReduce("second", x.data(), y.data(), 4))).ok());
    ASSERT_TRUE(rt.StopTimeline().ok());
  });
  for (const std::string suffix : {"", ".rank1"}) {
    const std::string a = ReadFile(base + "-a.json" + suffix);
    const std::string b = ReadFile(base + "-b.json" + suffix);
    EXPECT_NE(a.find("\"recorded\""), std::string::npos) << a;
    EXPECT_NE(a.find("ALLREDUCE"), std::string::npos) << a;
    EXPECT_EQ(a.find("unrecorded"), std::string::npos) << a;
    EXPECT_EQ(a.find("second"), std::string::npos) << a;
    EXPECT_NE(b.find("\"second\""), std::string::npos) << b;
    EXPECT_EQ(b.find("recorded"), std::string::npos) << b;
    for (const std::string* text : {&a, &b}) {
      ASSERT_GE(text->size(), 2u);
      EXPECT_EQ(text->front(), '[');
      EXPECT_EQ((*text)[text->find_last_not_of(" \n")], ']');
    }
    std::remove((base + "-a.json" + suffix).c_str());
    std::remove((base + "-b.json" + suffix).c_str());
  }
  Runtime idle;
  EXPECT_EQ(idle.StartTimeline(base + "-c.json").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(idle.StopTimeline().code(), absl::StatusCode::kFailedPrecondition);
}

// A rank that shuts down cancels its own pending work; a tensor its peers still wait for
// fails on them (it can never complete), and nothing after Shutdown is accepted.
TEST(RuntimeTest, ShutdownCancelsPendingWorkAndFailsWhatPeersWaitFor) {
  RuntimeWorld world;
  ASSERT_TRUE(world.InitOk());
  std::vector<float> a(4, 1.0f), b(4), c(4), d(4);
  auto waits_on_1 = world[0].Enqueue(AllReduce("only0", a.data(), b.data(), 4));
  auto waits_on_0 = world[1].Enqueue(AllReduce("only1", a.data(), c.data(), 4));
  ASSERT_TRUE(waits_on_1.ok() && waits_on_0.ok());
  ASSERT_TRUE(world[1].Shutdown().ok());
  EXPECT_EQ((*waits_on_0)->Wait(absl::Seconds(30)),
            absl::CancelledError("braid was shut down before 'only1' completed"));
  EXPECT_EQ((*waits_on_1)->Wait(absl::Seconds(30)),
            absl::FailedPreconditionError(
                "tensor 'only0' can never complete: rank 1 already shut down"));
  EXPECT_EQ(world[1].Enqueue(AllReduce("late", a.data(), d.data(), 4)).status(),
            absl::FailedPreconditionError(
                "braid has been shut down: call init() again to start a new job"));
  // A tensor enqueued later on the survivor fails the same way.
  EXPECT_EQ(WaitFor(world[0].Enqueue(AllReduce("later", a.data(), d.data(), 4))),
            absl::FailedPreconditionError(
                "tensor 'later' can never complete: rank 1 already shut down"));
}

// Every handle completes once: its status never changes afterwards, whatever races it
// (here: rank 1 leaves while rank 0 still has twenty tensors in flight).
TEST(RuntimeTest, EveryHandleCompletesExactlyOnce) {
  Handle h;
  EXPECT_FALSE(h.Poll());
  EXPECT_EQ(h.status().message(), "pending");
  h.Complete(absl::OkStatus());
  h.Complete(absl::InternalError("late"));
  EXPECT_TRUE(h.Wait(absl::ZeroDuration()).ok()) << "the first completion wins";

  RuntimeWorld world;
  ASSERT_TRUE(world.InitOk());
  std::vector<std::vector<float>> in(20, std::vector<float>(64, 1.0f)), out = in;
  std::vector<std::shared_ptr<Handle>> handles;
  for (int t = 0; t < 20; ++t) {
    auto h0 = world[0].Enqueue(AllReduce(absl::StrCat("t", t), in[t].data(), out[t].data(), 64));
    ASSERT_TRUE(h0.ok());
    handles.push_back(*h0);
  }
  std::vector<float> x(64, 1.0f), y(64);
  for (int t = 0; t < 10; ++t) {
    ASSERT_TRUE(WaitFor(world[1].Enqueue(AllReduce(absl::StrCat("t", t), x.data(), y.data(), 64))).ok());
  }
  ASSERT_TRUE(world[1].Shutdown().ok());
  for (int t = 0; t < 20; ++t) {
    const absl::Status first = handles[t]->Wait(absl::Seconds(30));
    EXPECT_EQ(first.ok(), t < 10) << t << ": " << first;
    if (t >= 10) {
      EXPECT_EQ(first.code(), absl::StatusCode::kFailedPrecondition) << first;
    }
    absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(handles[t]->Wait(absl::ZeroDuration()), first) << "completed twice: " << t;
    EXPECT_TRUE(handles[t]->Poll());
  }
}

// Init after Shutdown starts a new job: counters start from zero.
TEST(RuntimeTest, InitAgainStartsANewJob) {
  RuntimeWorld world;
  for (int job = 0; job < 2; ++job) {
    ASSERT_TRUE(world.InitOk()) << "job " << job;
    world.Run([](int rank, Runtime& rt) {
      std::vector<float> x(16, 1.0f), y(16);
      EXPECT_TRUE(WaitFor(rt.Enqueue(AllReduce("w", x.data(), y.data(), 16))).ok());
      EXPECT_EQ(y, std::vector<float>(16, 2.0f));
      auto report = rt.compression_report();
      ASSERT_TRUE(report.ok());
      ASSERT_EQ(report->methods.size(), 1u);
      EXPECT_EQ(report->methods[0].bytes.reductions, 1u) << "counters are per job";
    });
    for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
  }
}

// A communicator that passes everything through, except that its all-reduces wait until
// `release` is notified and then time out: a rank whose data plane stalls mid-collective,
// and finds its peers gone when it resumes.
class StalledAllReduce final : public testing::DelegatingCommunicator {
 public:
  StalledAllReduce(std::unique_ptr<transport::Communicator> inner, absl::Notification* release)
      : DelegatingCommunicator(std::move(inner)), release_(release) {}
  absl::Status AllReduce(const void*, void*, size_t, DataType, ReduceOp) override {
    release_->WaitForNotification();
    return absl::DeadlineExceededError("stalled rank released, its peers gone");
  }
  absl::Status AllReduceGathered(absl::Span<const transport::GatheredPiece>, void*, size_t,
                                 DataType, ReduceOp) override {
    release_->WaitForNotification();
    return absl::DeadlineExceededError("stalled rank released, its peers gone");
  }

 private:
  absl::Notification* release_;
};

// A collective that times out on the data plane fails with an error naming its tensors and
// the peer this rank waited on, and every later collective repeats that error (the data
// plane is poisoned), not a bare sequence number.
TEST(RuntimeTest, ADataPlaneTimeoutNamesTheTensorsAndThePeer) {
  for (bool fast_path : {false, true}) {
    SCOPED_TRACE(fast_path ? "fast path" : "through the coordinator");
    absl::Notification release;
    RuntimeWorldOptions o = WorldOf(2);
    o.timeout = absl::Milliseconds(500);
    o.settings.set_fast_path(fast_path ? 1 : 0);
    o.wrap_communicator = [&](int rank, std::unique_ptr<transport::Communicator> comm)
        -> std::unique_ptr<transport::Communicator> {
      if (rank == 0) return comm;
      return std::make_unique<StalledAllReduce>(std::move(comm), &release);
    };
    RuntimeWorld world(o);
    ASSERT_TRUE(world.InitOk());
    std::vector<float> in(8, 1.0f), out(8), later(8);
    auto h = world[0].Enqueue(AllReduce("layer1.grad", in.data(), out.data(), 8));
    auto h1 = world[1].Enqueue(AllReduce("layer1.grad", in.data(), out.data(), 8));
    ASSERT_TRUE(h.ok() && h1.ok());
    const absl::Status s = WaitFor(h);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    const std::string prefix = "allreduce of tensor 'layer1.grad' (bucket ";
    EXPECT_EQ(s.message().substr(0, prefix.size()), prefix) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), ") timed out on the data plane: rank 0: "
                                               "collective #")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), " made no progress for 500ms (BRAID_TIMEOUT_S); "
                                               "waiting for a message from rank 1")) << s;
    // Later work on the poisoned data plane fails with the error that names the tensor.
    auto h2 = world[0].Enqueue(AllReduce("layer2.grad", in.data(), later.data(), 8));
    auto h3 = world[1].Enqueue(AllReduce("layer2.grad", in.data(), later.data(), 8));
    // So does one no other rank submits: it fails at once with the same error, not after
    // negotiating for the peer that stopped (Note [Poisoned data plane]).
    std::vector<float> solo(8);
    auto h4 = world[0].Enqueue(AllReduce("only.rank0", in.data(), solo.data(), 8));
    ASSERT_TRUE(h4.ok());
    EXPECT_EQ(WaitFor(h4), s);
    release.Notify();
    EXPECT_EQ(WaitFor(h2), s);
    // The stalled rank times out in turn, and its later collective, which rank 0 never
    // submitted, fails with that error at once (not at WaitFor's 30 s).
    const absl::Time released = absl::Now();
    const absl::Status s1 = WaitFor(h1);
    EXPECT_EQ(s1.code(), absl::StatusCode::kDeadlineExceeded) << s1;
    EXPECT_TRUE(absl::StrContains(s1.message(), "stalled rank released")) << s1;
    EXPECT_EQ(WaitFor(h3), s1);
    EXPECT_LT(absl::Now() - released, absl::Seconds(10));
    world.Shutdown();
  }
}

// Note [Threads and locks]: each running rank adds braid-loop, braid-coord-rx and
// braid-heartbeat, as many as docs/architecture.md says, and takes them all away at shutdown.
TEST(RuntimeTest, EachRankRunsTheThreadsTheArchitecturePageStates) {
  const int stated = testing::StatedThreadsPerRank(BRAID_ARCHITECTURE_DOC);
  ASSERT_EQ(stated, 3) << "docs/architecture.md";
  ASSERT_EQ(testing::BraidThreads(), 0);
  RuntimeWorld world(WorldOf(3));
  ASSERT_TRUE(world.InitOk());
  std::map<std::string, int> names = testing::ThreadNames();
  for (const char* n : {"braid-loop", "braid-coord-rx", "braid-heartbeat"}) {
    EXPECT_EQ(names[n], 3) << n << ": one per rank";
  }
  EXPECT_EQ(testing::BraidThreads(), 3 * stated);
  world.Shutdown();
  EXPECT_EQ(testing::BraidThreads(), 0) << "every thread joined at shutdown";
}

}  // namespace
// Note [Loop thread affinity]: `auto` binds only where two or more ranks share a host and
// the process may run on as many CPUs, spreading the local ranks over the allowed CPUs;
// `none` never binds; a number binds there whatever the world.
TEST(LoopAffinityTest, AutoSpreadsTheLocalRanksOverTheAllowedCpusWhenThereIsRoom) {
  const std::vector<int> two = {0, 1}, many = {2, 3, 5, 7, 11, 13, 17, 19};
  EXPECT_EQ(ChooseLoopCpu("auto", two, 0, 2), 0);
  EXPECT_EQ(ChooseLoopCpu("auto", two, 1, 2), 1);
  EXPECT_EQ(ChooseLoopCpu("auto", many, 0, 4), 2);
  EXPECT_EQ(ChooseLoopCpu("auto", many, 1, 4), 5);
  EXPECT_EQ(ChooseLoopCpu("auto", many, 3, 4), 17);
  EXPECT_EQ(ChooseLoopCpu("auto", many, 7, 8), 19);
  EXPECT_EQ(ChooseLoopCpu("auto", two, 0, 1), -1) << "alone on its host";
  EXPECT_EQ(ChooseLoopCpu("auto", two, 2, 3), -1) << "more ranks than CPUs";
  EXPECT_EQ(ChooseLoopCpu("auto", {4}, 1, 2), -1) << "a launcher bound it to one CPU";
  EXPECT_EQ(ChooseLoopCpu("auto", {}, 0, 2), -1) << "the CPUs could not be read";
  EXPECT_EQ(ChooseLoopCpu("none", many, 1, 4), -1);
  EXPECT_EQ(ChooseLoopCpu("3", two, 0, 1), 3);
}

TEST(LoopAffinityTest, BindsAThreadWhereItIsAllowedAndNamesACpuItCannotHave) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  int got = -1;
  std::thread t([&] {
    ASSERT_TRUE(BindThread(pthread_self(), allowed.back()).ok());
    got = sched_getcpu();
  });
  t.join();
  EXPECT_EQ(got, allowed.back());
  const absl::Status s = BindThread(pthread_self(), 1023);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(s.message(), "cannot bind braid-loop to CPU 1023")) << s;
}

}  // namespace braid
