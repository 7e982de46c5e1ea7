// The coordinator load generator (tools/bench/coordinator_sim.h) against a real coordinator
// (gRPC on 127.0.0.1, port 0) with 16 simulated ranks, each a real client on its own
// connection: every rank gets back exactly the tensors it submitted, step after step, with
// the response cache on, off and evicting every step, and with fusion.
#include "tools/bench/coordinator_sim.h"

#include <algorithm>
#include <memory>

#include "coordinator/server.h"
#include "gtest/gtest.h"

namespace braid::bench {
namespace {

constexpr int kRanks = 16;
constexpr int kTensors = 24;
constexpr int kWarmup = 1;
constexpr int kSteps = 3;

SimResult Simulate(int cache_capacity, int64_t fusion_threshold_bytes) {
  coordinator::ServerOptions so;
  auto server = coordinator::StartCoordinator(so);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return {};
  SimOptions o;
  o.address = (*server)->address();
  o.ranks = kRanks;
  o.tensors = kTensors;
  o.warmup = kWarmup;
  o.steps = kSteps;
  o.batches = 3;
  o.cache_capacity = cache_capacity;
  o.fusion_threshold_bytes = fusion_threshold_bytes;
  o.timeout = absl::Seconds(60);
  int timed_start = 0, timed_end = 0;
  o.on_timed_start = [&] { ++timed_start; };
  o.on_timed_end = [&] { ++timed_end; };
  auto result = RunSimulation(o);
  EXPECT_TRUE(result.ok()) << result.status();
  (*server)->Shutdown(absl::Seconds(1));
  if (!result.ok()) return {};
  EXPECT_EQ(timed_start, 1);
  EXPECT_EQ(timed_end, 1);
  EXPECT_EQ(result->step_times.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(result->steps_per_second, 0);
  return *result;
}

void ExpectEveryTensorBack(const SimResult& r) {
  ASSERT_EQ(r.names_received.size(), static_cast<size_t>(kRanks));
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(r.names_received[rank], kTensors * (kWarmup + kSteps)) << "rank " << rank;
    EXPECT_EQ(r.errors[rank], 0) << "rank " << rank << ": " << r.first_error;
  }
}

TEST(CoordinatorSimTest, NoFusionOneResponsePerTensorWithCache) {
  SimResult r = Simulate(/*cache_capacity=*/1024, /*fusion_threshold_bytes=*/0);
  ExpectEveryTensorBack(r);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(r.responses_received[rank], kTensors * (kWarmup + kSteps)) << "rank " << rank;
  }
}

TEST(CoordinatorSimTest, NoCache) {
  SimResult r = Simulate(/*cache_capacity=*/0, /*fusion_threshold_bytes=*/0);
  ExpectEveryTensorBack(r);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(r.responses_received[rank], kTensors * (kWarmup + kSteps)) << "rank " << rank;
  }
}

// A cache smaller than a step evicts on every step: ranks send ids evicted meanwhile, which
// the coordinator still resolves.
TEST(CoordinatorSimTest, CacheEvictingEveryStep) {
  SimResult r = Simulate(/*cache_capacity=*/5, /*fusion_threshold_bytes=*/0);
  ExpectEveryTensorBack(r);
}

// Fused: every rank receives the same buckets (one stream, one order), fewer than tensors.
TEST(CoordinatorSimTest, FusedBucketsSameOnEveryRank) {
  SimResult r = Simulate(/*cache_capacity=*/1024, /*fusion_threshold_bytes=*/64 << 20);
  ExpectEveryTensorBack(r);
  ASSERT_FALSE(r.responses_received.empty());
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(r.responses_received[rank], r.responses_received[0]) << "rank " << rank;
  }
  EXPECT_LT(r.responses_received[0], kTensors * (kWarmup + kSteps));
  EXPECT_GE(r.responses_received[0], kWarmup + kSteps);
}

TEST(CoordinatorSimTest, TensorSizesDeterministic) {
  EXPECT_EQ(SimTensorSizes(50, 7), SimTensorSizes(50, 7));
  EXPECT_NE(SimTensorSizes(50, 7), SimTensorSizes(50, 8));
  for (int64_t s : SimTensorSizes(50, 7)) {
    EXPECT_GE(s, 64);
    EXPECT_LE(s, 4 << 20);
  }
}

}  // namespace
}  // namespace braid::bench
