// An error never changes which step a rank's data is reduced with (Note [Resynchronization]
// in coordinator/negotiation.h, Note [Barrier order] in runtime/loop.cc), through the whole
// runtime of every rank (queue, negotiation, fast path, pipeline) in one process, with the
// fast path off and on. Each step's all-reduce carries values that name the step, so a call
// paired with another rank's other step gives a sum that is wrong, not just late.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/runtime_world.h"

namespace braid {
namespace {

using testing::RuntimeWorld;
using testing::RuntimeWorldOptions;

constexpr int64_t kN = 4;

CollectiveRequest AllReduce(const std::string& name, const float* in, float* out) {
  CollectiveRequest r;
  r.name = name;
  r.shape = {kN};
  r.input = in;
  r.output = out;
  r.op = ReduceOp::kSum;
  return r;
}

CollectiveRequest Barrier(const std::string& name) {
  CollectiveRequest r;
  r.name = name;
  r.collective = Collective::kBarrier;
  return r;
}

absl::Status WaitFor(const absl::StatusOr<std::shared_ptr<Handle>>& h) {
  if (!h.ok()) return h.status();
  return (*h)->Wait(absl::Seconds(10));
}

// Rank r's value at step k, and the sum of two ranks' values at step k.
float Value(int rank, int step) { return static_cast<float>(100 * step + rank + 1); }
std::vector<float> Sum(int step) {
  return std::vector<float>(kN, Value(0, step) + Value(1, step));
}

class ResyncTest : public ::testing::TestWithParam<bool> {
 protected:
  RuntimeWorldOptions Options() const {
    RuntimeWorldOptions o;
    o.size = 2;
    o.settings.set_fast_path(GetParam() ? 1 : 0);
    // A fault costs about a second: negotiation deadline 1 s, fast-path fallback 0.25 s.
    o.settings.set_negotiation_timeout_ms(1000);
    o.settings.set_stall_check_ms(500);
    return o;
  }
};

// Runs `name` at `step` on this rank and checks it returns the step's exact sum.
void ExpectStep(Runtime& rt, int rank, const std::string& name, int step) {
  std::vector<float> x(kN, Value(rank, step)), y(kN);
  absl::Status s = WaitFor(rt.Enqueue(AllReduce(name, x.data(), y.data())));
  ASSERT_TRUE(s.ok()) << name << " at step " << step << " on rank " << rank << ": " << s;
  EXPECT_EQ(y, Sum(step)) << name << " at step " << step << " on rank " << rank;
}

// The ranks call one step's tensor under different names ('g' on rank 0, 'h' on rank 1):
// both fail at the negotiation deadline. Rank 1's next 'g' could be its late call of the
// failed step or its next step's: braid does not guess, so the job is out of step and 'g'
// fails on both ranks, step after step, naming the deadline, until a barrier; then it pairs
// step for step again.
// (Before, rank 1's next 'g' took the failed step's error and rank 0's paired with rank 1's
// step after: rank 0 got 100·5+1 + 100·6+2 where 100·5+1 + 100·5+2 was right.)
TEST_P(ResyncTest, ANameThatDiffersForOneStepNeverShiftsLaterSteps) {
  RuntimeWorld world(Options());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    for (int k = 0; k < 3; ++k) ExpectStep(rt, rank, "g", k);
    std::vector<float> x(kN, Value(rank, 3)), y(kN);
    absl::Status s = WaitFor(rt.Enqueue(AllReduce(rank == 0 ? "g" : "h", x.data(), y.data())));
    // Its own deadline, or the other's first (the job is then out of step: the fast path
    // sends rank 0's cached 'g' to the coordinator only after its fallback).
    EXPECT_TRUE(s.code() == absl::StatusCode::kDeadlineExceeded ||
                s.code() == absl::StatusCode::kFailedPrecondition)
        << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "BRAID_NEGOTIATION_TIMEOUT_S")) << s;
    for (int k = 4; k < 7; ++k) {
      std::vector<float> xk(kN, Value(rank, k)), yk(kN);
      s = WaitFor(rt.Enqueue(AllReduce("g", xk.data(), yk.data())));
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << "step " << k << ": " << s;
      EXPECT_TRUE(absl::StrContains(
          s.message(), absl::StrCat("tensor 'g' was not run on rank ", rank,
                                    ": the ranks are out of step since a collective waited "
                                    "out the negotiation deadline")))
          << s;
    }
    ASSERT_TRUE(WaitFor(rt.Enqueue(Barrier("resync"))).ok());
    for (int k = 7; k < 10; ++k) {
      ExpectStep(rt, rank, "g", k);
      ExpectStep(rt, rank, "h", k);
    }
  });
}

// Rank 1 skips step 3's 'g' and both ranks go on to a barrier: rank 0's 'g', still waiting
// when the barrier completes, fails at once naming the ranks and the barrier (no deadline
// to wait out), instead of pairing with rank 1's 'g' of step 4. Under the fast path the
// barrier waits until rank 0's cached 'g' left the ranks' vote (Note [Barrier order]).
TEST_P(ResyncTest, ACallOneRankSkippedBeforeABarrierFailsInsteadOfPairingAfterIt) {
  RuntimeWorld world(Options());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    for (int k = 0; k < 3; ++k) ExpectStep(rt, rank, "g", k);
    std::vector<float> x(kN, Value(rank, 3)), y(kN);
    absl::StatusOr<std::shared_ptr<Handle>> skipped;
    if (rank == 0) skipped = rt.Enqueue(AllReduce("g", x.data(), y.data()));
    const absl::Time start = absl::Now();
    ASSERT_TRUE(WaitFor(rt.Enqueue(Barrier("resync"))).ok());
    if (rank == 0) {
      EXPECT_EQ(WaitFor(skipped),
                absl::InvalidArgumentError(
                    "tensor 'g' was submitted by rank 0 but not by rank 1 before barrier "
                    "'resync', which every rank has passed: it can never pair (a rank skipped "
                    "it or called it under another name)"));
      EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "no negotiation deadline waited";
    }
    for (int k = 4; k < 7; ++k) ExpectStep(rt, rank, "g", k);
  });
}

// A C++ caller may enqueue a barrier and go on without waiting: rank 0's 'x' enqueued after
// its barrier is not negotiated before the barrier completed, so it cannot pair with rank 1's
// 'x' from before the barrier (which fails, as above); it pairs with rank 1's next 'x'.
TEST_P(ResyncTest, ACallEnqueuedAfterABarrierWaitsForIt) {
  RuntimeWorld world(Options());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    for (int k = 0; k < 3; ++k) ExpectStep(rt, rank, "x", k);
    std::vector<float> x(kN, Value(rank, 4)), y(kN);
    if (rank == 0) {
      auto barrier = rt.Enqueue(Barrier("b"));
      auto after = rt.Enqueue(AllReduce("x", x.data(), y.data()));
      ASSERT_TRUE(WaitFor(barrier).ok());
      ASSERT_TRUE(WaitFor(after).ok());
      EXPECT_EQ(y, Sum(4));
    } else {
      std::vector<float> x3(kN, Value(rank, 3)), y3(kN);
      auto before = rt.Enqueue(AllReduce("x", x3.data(), y3.data()));
      ASSERT_TRUE(WaitFor(rt.Enqueue(Barrier("b"))).ok());
      EXPECT_EQ(WaitFor(before).code(), absl::StatusCode::kInvalidArgument);
      ASSERT_TRUE(WaitFor(rt.Enqueue(AllReduce("x", x.data(), y.data()))).ok());
      EXPECT_EQ(y, Sum(4));
    }
    for (int k = 5; k < 8; ++k) ExpectStep(rt, rank, "x", k);
  });
}

INSTANTIATE_TEST_SUITE_P(FastPath, ResyncTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "FastPathOn" : "FastPathOff";
                         });

}  // namespace
}  // namespace braid
