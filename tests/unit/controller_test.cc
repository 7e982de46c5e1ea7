// The negotiation controller alone (runtime/controller.h), in one process: ranks as threads,
// each with a client of the in-memory coordinator (coordinator/local_coordinator.h) and a
// control channel over the in-process transport. No executor and no data plane: the test
// plays braid-loop, taking each cycle's buckets and finishing them itself, and checks that
// every rank gets the same buckets in the same order, through the coordinator and through
// the fast path's vote.
#include "runtime/controller.h"

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "coordinator/local_coordinator.h"
#include "gtest/gtest.h"
#include "transport/local_communicator.h"

namespace braid {
namespace {

struct Rank {
  std::unique_ptr<CoordinatorClient> client;
  std::unique_ptr<transport::Communicator> control;
  NegotiationController controller;
  std::vector<Bucket> seen;  // every bucket this rank's cycles produced, in order
};

class ControllerWorld {
 public:
  ControllerWorld(int size, bool fast_path) : coordinator_(Options(size)), ranks_(size) {
    auto comms = transport::CreateLocalCommunicators(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      ranks_[r].control = std::move(comms[r]);
      ranks_[r].client = coordinator_.NewClient();
      threads.emplace_back([this, r, size, fast_path] {
        proto::RegisterRequest req;
        req.set_rank(r);
        req.set_size(size);
        req.set_host("h");
        req.set_pid(r);
        auto reg = ranks_[r].client->Register(req, absl::Seconds(10));
        ASSERT_TRUE(reg.ok()) << reg.status();
        NegotiationController::Parts p;
        p.rank = r;
        p.size = size;
        p.client = ranks_[r].client.get();
        p.control = ranks_[r].control.get();
        transport::Communicator* control = p.control;
        p.abort_data_plane = [control](const absl::Status& s) { control->Abort(s); };
        p.first_timeout = [](const absl::Status& s) { return s; };
        p.fast_path = fast_path;
        p.fusion_threshold = 1 << 20;
        ASSERT_TRUE(ranks_[r].controller.Start(p).ok());
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ~ControllerWorld() {
    for (Rank& r : ranks_) {
      r.controller.RequestStop();
      r.control->Abort(absl::CancelledError("test over"));
      r.controller.EndJob();
      r.client->Close(absl::Milliseconds(100));
    }
    for (Rank& r : ranks_) r.client.reset();
  }

  Rank& rank(int r) { return ranks_[r]; }

  // Plays braid-loop on every rank until `handles` (per rank) are all complete, finishing
  // each bucket as the executor would (OK, or its error). A rank with nothing of its own to
  // wait for still cycles (its failure reports go out in its cycles, its votes are needed)
  // until it is stopped: `stop` ends the job then, for a test's last Drive.
  void Drive(const std::vector<std::vector<std::shared_ptr<Handle>>>& handles,
             bool stop = false) {
    auto done_on = [&](size_t r) {
      for (const auto& h : handles[r]) {
        if (h->status().code() == absl::StatusCode::kUnknown) return false;
      }
      return true;
    };
    auto done = [&] {
      for (size_t r = 0; r < handles.size(); ++r) {
        if (!done_on(r)) return false;
      }
      return true;
    };
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      // Without `stop`, each rank cycles until its own collectives are done (every rank
      // has some: an idle rank's cycle would wait for work); with it, until all are.
      threads.emplace_back([this, r, stop, &done, &done_on] {
        Rank& me = ranks_[r];
        std::deque<Bucket> buckets;
        while (!(stop ? done() : done_on(r)) && me.controller.NextBuckets(&buckets)) {
          for (const Bucket& b : buckets) {
            me.seen.push_back(b);
            me.controller.Finish(b.names, b.error);
          }
          buckets.clear();
          me.controller.CycleDone();
        }
      });
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    EXPECT_TRUE(done()) << "the collectives did not finish within 20 s";
    if (stop || !done()) {
      for (Rank& r : ranks_) {
        r.controller.RequestStop();
        r.control->Abort(absl::CancelledError("test over"));
      }
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  static coordinator::ServiceOptions Options(int size) {
    coordinator::ServiceOptions o;
    o.world_size = size;
    return o;
  }
  coordinator::LocalCoordinator coordinator_;
  std::vector<Rank> ranks_;
};

CollectiveRequest Sum(const std::string& name) {
  CollectiveRequest r;
  r.name = name;
  r.dtype = DataType::kFloat32;
  r.op = ReduceOp::kSum;
  r.shape = {4};
  return r;
}

NegotiationController::Validate Accept() {
  return [](const CollectiveRequest&) -> absl::StatusOr<Accepted> { return Accepted(); };
}

std::string Names(const std::vector<Bucket>& buckets) {
  std::vector<std::string> out;
  for (const Bucket& b : buckets) out.push_back(absl::StrJoin(b.names, "+"));
  return absl::StrJoin(out, " ");
}

class ControllerTest : public ::testing::TestWithParam<bool> {};

TEST_P(ControllerTest, EveryRankGetsTheSameBucketsInTheSameOrderStepAfterStep) {
  const bool fast = GetParam();
  ControllerWorld world(2, fast);
  bool voted = false;
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<std::shared_ptr<Handle>>> handles(2);
    for (int r = 0; r < 2; ++r) {
      // The ranks submit in different orders; the buckets come out in one.
      std::vector<std::string> names = {"w", "b"};
      if (r == 1) std::swap(names[0], names[1]);
      for (const std::string& n : names) {
        auto h = world.rank(r).controller.Submit(Sum(n), Accept());
        ASSERT_TRUE(h.ok()) << h.status();
        handles[r].push_back(*h);
      }
    }
    world.Drive(handles);
    for (int r = 0; r < 2; ++r) {
      for (const auto& h : handles[r]) EXPECT_TRUE(h->status().ok()) << h->status();
    }
    EXPECT_EQ(Names(world.rank(0).seen), Names(world.rank(1).seen));
    for (const Bucket& b : world.rank(0).seen) voted = voted || b.id < 0;
  }
  // The coordinator answered the first step; under the fast path the ranks' vote agrees on
  // the cached tensors of later steps (negative bucket ids), else the coordinator does all.
  EXPECT_EQ(voted, fast) << Names(world.rank(0).seen);
}

TEST_P(ControllerTest, ALocalRefusalFailsTheTensorOnTheRankThatSubmittedItNamingTheRefuser) {
  const bool fast = GetParam();
  ControllerWorld world(2, fast);
  auto mine = world.rank(0).controller.Submit(Sum("g"), Accept());
  ASSERT_TRUE(mine.ok());
  if (!fast) {
    // Rank 0's request reaches the coordinator before rank 1 refuses (the in-process client
    // delivers as it sends), so the refusal finds it submitted by every other rank and fails
    // just that instance (Note [Resynchronization]). Without this cycle the two raced.
    std::deque<Bucket> none;
    ASSERT_TRUE(world.rank(0).controller.NextBuckets(&none));
    world.rank(0).controller.CycleDone();
  }
  auto refused = world.rank(1).controller.Submit(
      Sum("g"), [](const CollectiveRequest&)
                    -> absl::StatusOr<const compression::CompressionMethod*> {
        return absl::InvalidArgumentError("allreduce 'g' on rank 1: no");
      });
  EXPECT_EQ(refused.status(), absl::InvalidArgumentError("allreduce 'g' on rank 1: no"));
  world.Drive({{*mine}, {}}, /*stop=*/true);
  const absl::Status s = (*mine)->status();
  if (!fast || s.code() == absl::StatusCode::kInvalidArgument) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("rank 1"), absl::string_view::npos) << s;
  } else {
    // Under the fast path rank 0's request and rank 1's report leave in the same round, in
    // either order; when the report comes first, rank 0 had not submitted yet as far as the
    // coordinator knows, and the name is poisoned, quoting the refusal.
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("allreduce 'g' on rank 1: no"), absl::string_view::npos) << s;
  }
}

INSTANTIATE_TEST_SUITE_P(FastPath, ControllerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "On" : "Off";
                         });

TEST(ControllerLifecycleTest, CallsBeforeAJobAndAfterItsEndAreRefusedAndItsLeftoversCancelled) {
  NegotiationController idle;
  EXPECT_EQ(idle.CheckRunning(),
            absl::FailedPreconditionError("braid is not initialized: call init() first"));
  EXPECT_EQ(idle.Submit(Sum("x"), Accept()).status(), idle.CheckRunning());
  ControllerWorld world(1, false);
  NegotiationController& c = world.rank(0).controller;
  auto h = c.Submit(Sum("x"), Accept());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(c.Submit(Sum("x"), Accept()).status().code(), absl::StatusCode::kAlreadyExists);
  c.RequestStop();
  c.EndJob();
  EXPECT_EQ((*h)->status(),
            absl::CancelledError("braid was shut down before 'x' completed"));
  EXPECT_EQ(c.CheckRunning(), absl::FailedPreconditionError(
                                  "braid has been shut down: call init() again to start a new "
                                  "job"));
}

}  // namespace
}  // namespace braid
