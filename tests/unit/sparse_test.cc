// Unit tests of the sparsifying compressors (scalecomp, topk, randomk) with ranks as threads
// (thread_world.h): results against a reference written here from sparse.h's equations
// (full-sort top-k, dense loops), on every rank and step; the cyclic leader; the low-pass
// filtered memory against ErrorFeedback; ties; non-finite input failing on every rank with
// the memory kept; payload counts.
//
// Inputs and β keep every sum exact (tests/testing/sparse_reference.h), so results must match
// the reference bit for bit.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/error_feedback.h"
#include "compression/registry.h"
#include "compression/sparse.h"
#include "compression/sparse_core.h"
#include "gtest/gtest.h"
#include "tests/testing/local_world.h"
#include "tests/testing/sparse_reference.h"
#include "tests/unit/thread_world.h"

namespace braid::compression {
namespace {

using braid::testing::Dyadic;
using braid::testing::InputFn;
using braid::testing::RefTopK;
using braid::testing::ThreadWorld;

using Reference = braid::testing::SparseReference;

// What one rank saw at one step.
struct RankStep {
  absl::Status status;
  std::vector<std::vector<float>> out;  // per tensor
  std::vector<uint64_t> payload;        // per tensor
  uint64_t sent = 0;                    // transport bytes this rank sent (local_transport)
};

struct Job {
  std::string spec;
  int ranks = 2;
  int steps = 1;
  ReduceOp op = ReduceOp::kAverage;
  std::vector<size_t> sizes = {1000, 0, 37};
  InputFn input = Dyadic;
  // The in-process transport (CollectiveCommunicator's algorithms, counting the bytes each
  // rank sends) instead of thread_world.h's stand-in.
  bool local_transport = false;
};

// Runs job.steps reductions of one bucket on every rank; a failed step does not advance the
// step counter (as the compression stage counts only completed reductions).
std::vector<std::vector<RankStep>> RunJob(const Job& job) {
  std::vector<std::vector<RankStep>> result(job.steps, std::vector<RankStep>(job.ranks));
  auto body = [&](int rank, transport::Communicator& comm) {
    auto c = CreateCompressor(ParseCompressionSpec(job.spec).value());
    ASSERT_TRUE(c.ok()) << c.status();
    const size_t nt = job.sizes.size();
    std::vector<std::vector<float>> data(nt);
    std::vector<std::vector<int64_t>> shapes(nt);
    std::vector<std::string> names(nt);
    int64_t counter = 0;
    for (int step = 0; step < job.steps; ++step) {
      std::vector<TensorView> views;
      for (size_t t = 0; t < nt; ++t) {
        names[t] = std::string(1, static_cast<char>('a' + t));
        shapes[t] = {static_cast<int64_t>(job.sizes[t])};
        data[t].resize(job.sizes[t]);
        for (size_t i = 0; i < job.sizes[t]; ++i) data[t][i] = job.input(rank, step, t, i);
        views.push_back({names[t], shapes[t], data[t].data(), data[t].size()});
      }
      std::vector<int64_t> steps(nt, counter);
      RankStep& r = result[step][rank];
      r.payload.assign(nt, 99);
      StepContext ctx;
      ctx.op = job.op;
      ctx.steps = steps;
      ctx.payload_bytes = absl::MakeSpan(r.payload);
      const uint64_t sent_before = comm.stats().bytes_sent;
      r.status = (*c)->Reduce(views, comm, ctx);
      r.sent = comm.stats().bytes_sent - sent_before;
      if (r.status.ok()) ++counter;
      r.out = data;
    }
  };
  if (job.local_transport) {
    braid::testing::RunLocalWorld(job.ranks, transport::CollectiveOptions{}, body);
  } else {
    ThreadWorld(job.ranks).Run(body);
  }
  return result;
}

// The first step's results (by value: safe to iterate over).
std::vector<RankStep> FirstStep(const Job& job) { return RunJob(job)[0]; }

std::vector<float> Flat(const std::vector<std::vector<float>>& per_tensor) {
  std::vector<float> f;
  for (const auto& v : per_tensor) f.insert(f.end(), v.begin(), v.end());
  return f;
}

void ExpectMatches(const Job& job, const Reference& ref) {
  const auto got = RunJob(job);
  Reference r = ref;
  r.average = job.op == ReduceOp::kAverage;
  const auto want = r.Run(job.ranks, job.steps, job.sizes, job.input);
  for (int step = 0; step < job.steps; ++step) {
    for (int r = 0; r < job.ranks; ++r) {
      const RankStep& rs = got[step][r];
      ASSERT_TRUE(rs.status.ok()) << job.spec << " step " << step << " rank " << r << ": "
                                  << rs.status;
      const std::vector<float> flat = Flat(rs.out);
      size_t bad = 0;
      for (size_t i = 0; i < flat.size(); ++i) {
        if (flat[i] != want[step][i] && ++bad <= 3) {
          ADD_FAILURE() << job.spec << " on " << job.ranks << " ranks, step " << step << " rank "
                        << r << " element " << i << ": " << flat[i] << ", want " << want[step][i];
        }
      }
      ASSERT_EQ(bad, 0u);
    }
  }
}

class ScaleCompWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(ScaleCompWorldTest, MatchesTheReferenceOnEveryRankAndStep) {
  const int n = GetParam();
  Job job;
  job.ranks = n;
  job.steps = 2 * n + 1;  // every rank leads twice
  Reference ref;
  job.spec = "scalecomp:ratio=10";
  ref.ratio = 10;
  ExpectMatches(job, ref);
  job.spec = "scalecomp:ratio=7,beta=0.5";
  ref.ratio = 7;
  ref.beta = 0.5f;
  ExpectMatches(job, ref);
  job.spec = "scalecomp:ratio=4,granularity=tensor";
  job.op = ReduceOp::kSum;
  ref = Reference{};
  ref.ratio = 4;
  ref.per_tensor = true;
  ExpectMatches(job, ref);
  job.spec = "scalecomp:ratio=20,leader=0";
  ref = Reference{};
  ref.ratio = 20;
  ref.fixed_leader = 0;
  ExpectMatches(job, ref);
}

TEST_P(ScaleCompWorldTest, TopKBaselineMatchesItsReference) {
  const int n = GetParam();
  Job job;
  job.ranks = n;
  job.steps = 3;
  job.spec = "topk:ratio=10,beta=0.5";
  Reference ref;
  ref.ratio = 10;
  ref.beta = 0.5f;
  ref.topk = true;
  ExpectMatches(job, ref);
}

// Over the real collective algorithms, with values above SparseBucket's
// kBandwidthOptimalMinBytes (reduce-scatter + all-gather instead of recursive doubling):
// still the reference's results, bit for bit, on every rank.
TEST_P(ScaleCompWorldTest, LargeBucketOverTheTransportMatchesTheReference) {
  Job job;
  job.ranks = GetParam();
  job.steps = job.ranks + 1;
  job.sizes = {30000, 0, 10037};  // k = 4004 values: 16 KB
  job.local_transport = true;
  job.spec = "scalecomp:ratio=10";
  Reference ref;
  ref.ratio = 10;
  ExpectMatches(job, ref);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScaleCompWorldTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat(i.param, "ranks");
                         });

// Each rank's gradient is largest at its own 8 positions: the output's support names the
// leader of each step.
TEST(ScaleCompTest, LeaderRotatesCyclically) {
  Job job;
  job.ranks = 3;
  job.steps = 7;
  job.sizes = {800};
  job.input = [](int rank, int, size_t, size_t i) {
    return i / 8 == static_cast<size_t>(rank) ? 4.0f : 1.0f / 256;
  };
  for (const char* spec : {"scalecomp:ratio=100", "scalecomp:ratio=100,leader=2"}) {
    job.spec = spec;
    const auto got = RunJob(job);
    for (int step = 0; step < job.steps; ++step) {
      const int leader = std::string(spec).find("leader=2") != std::string::npos ? 2 : step % 3;
      for (int r = 0; r < 3; ++r) {
        const std::vector<float>& out = got[step][r].out[0];
        for (size_t i = 0; i < out.size(); ++i) {
          const bool led = i / 8 == static_cast<size_t>(leader);
          ASSERT_EQ(out[i] != 0.0f, led) << spec << " step " << step << " rank " << r << " i " << i;
        }
      }
    }
  }
  job.spec = "scalecomp:leader=3";  // not a rank of 3: the same error everywhere, no hang
  job.steps = 1;
  for (const RankStep& r : FirstStep(job)) {
    EXPECT_EQ(r.status, absl::InvalidArgumentError("compression 'scalecomp:leader=3': leader 3 "
                                                   "is not a rank of a world of size 3"));
  }
}

// With the same input on every rank, scalecomp and topk are the plain top-k sparsifier.
TEST(ScaleCompTest, IdenticalInputsGivePlainTopK) {
  for (int n : {1, 2, 4}) {
    Job job;
    job.ranks = n;
    job.sizes = {5000};
    job.input = [](int, int step, size_t t, size_t i) { return Dyadic(0, step, t, i); };
    std::vector<float> x(5000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = Dyadic(0, 0, 0, i);
    std::vector<float> want(x.size(), 0.0f);
    for (size_t i : RefTopK(x, 50)) want[i] = x[i];
    for (const char* spec : {"scalecomp", "topk", "scalecomp:granularity=tensor"}) {
      job.spec = spec;
      for (const RankStep& r : FirstStep(job)) EXPECT_EQ(r.out[0], want) << spec << " n=" << n;
    }
  }
}

TEST(ScaleCompTest, TiesGoToTheLowestIndices) {
  Job job;
  job.ranks = 2;
  job.sizes = {1000};
  job.spec = "scalecomp:ratio=100";
  job.input = [](int rank, int, size_t, size_t i) { return (i % 2 ? -0.5f : 0.5f) * (rank + 1); };
  for (const RankStep& r : FirstStep(job)) {
    for (size_t i = 0; i < 1000; ++i) {
      const float want = i < 10 ? (i % 2 ? -0.75f : 0.75f) : 0.0f;  // mean of 0.5 and 1
      ASSERT_EQ(r.out[0][i], want) << i;
    }
  }
}

// SparseBucket's fused memory update is ErrorFeedback::Update with sent = p at the selected
// indices and 0 elsewhere, bit for bit, and follows m <- (1 - β)m + β(p - sent) step by step,
// on gradients that are not dyadic.
TEST(ScaleCompTest, MemoryIsErrorFeedbackWithTheLowPassFilter) {
  for (float beta : {1.0f, 0.3f}) {
    SparseOptions o;
    o.ratio = 20;
    o.beta = beta;
    SparseBucket bucket(o, "test");
    ErrorFeedback ef(beta);
    std::mt19937 gen(5);
    std::normal_distribution<float> d;
    std::vector<float> filtered(2000, 0.0f);
    for (int step = 0; step < 6; ++step) {
      std::vector<float> g(2000);
      for (float& v : g) v = d(gen);
      std::vector<float> p = g, q = g;
      std::vector<int64_t> shape = {2000};
      std::vector<TensorView> views = {{"w", shape, p.data(), p.size()}};
      ASSERT_TRUE(bucket.Begin(views, device::HostDevice()).ok());
      std::vector<uint64_t> sent;
      ASSERT_EQ(bucket.SelectTopK(views, &sent), 0);
      ASSERT_EQ(sent.size(), 100u);
      ef.Apply("w", q.data(), q.size());
      std::vector<float> gathered(sent.size());
      bucket.Gather(views, sent, gathered.data());
      for (size_t i = 0; i < sent.size(); ++i) ASSERT_EQ(gathered[i], q[sent[i]]) << "p = g + m";
      std::vector<float> sparse(2000, 0.0f);
      for (uint64_t i : sent) sparse[i] = q[i];
      std::vector<float> before = filtered;
      for (size_t i = 0; i < 2000; ++i) {
        filtered[i] = (1.0f - beta) * before[i] + beta * (q[i] - sparse[i]);
      }
      bucket.UpdateMemoryAndClear(views, sent);
      ef.Update("w", q.data(), sparse.data(), q.size());
      const std::vector<float>& m = bucket.memory().residual("w");
      ASSERT_EQ(m, ef.residual("w")) << "beta " << beta << " step " << step;
      ASSERT_EQ(m, filtered) << "beta " << beta << " step " << step;
      ASSERT_EQ(p, std::vector<float>(2000, 0.0f)) << "the tensor is cleared for the result";
    }
  }
}

// A NaN or an infinity on one rank: every rank fails that step with the same message naming
// the tensor and the rank, nobody waits, and the memory stays as it was: the next step gives
// what it would have given had the bad step never been submitted.
TEST(ScaleCompTest, NonFiniteInputFailsOnEveryRankAndKeepsTheMemory) {
  for (const char* spec : {"scalecomp:ratio=10", "topk:ratio=10", "randomk:ratio=10"}) {
    for (int bad_rank : {1, 2}) {  // step 1's leader is rank 1
      Job job;
      job.spec = spec;
      job.ranks = 3;
      job.steps = 3;
      job.input = [bad_rank](int rank, int step, size_t t, size_t i) {
        if (step == 1 && rank == bad_rank && t == 2 && i == 5) return bad_rank == 1 ? NAN : -INFINITY;
        return Dyadic(rank, step, t, i);
      };
      const auto got = RunJob(job);
      const bool leader = std::string(spec).rfind("scalecomp", 0) == 0 && bad_rank == 1;
      const std::string want = absl::StrCat(
          "compression '", spec, "': non-finite gradient (NaN or Inf) in tensor 'c' on rank ",
          bad_rank, leader ? " (the leader)" : "",
          "; every rank rejects this step and keeps its error-feedback memory");
      for (int r = 0; r < 3; ++r) {
        EXPECT_TRUE(got[0][r].status.ok());
        EXPECT_EQ(got[1][r].status, absl::InvalidArgumentError(want)) << spec << " rank " << r;
        EXPECT_TRUE(got[2][r].status.ok()) << got[2][r].status;
      }
      Job clean = job;  // the same job without the bad step
      clean.steps = 2;
      clean.input = [](int rank, int step, size_t t, size_t i) {
        return Dyadic(rank, step == 0 ? 0 : 2, t, i);
      };
      const auto ok = RunJob(clean);
      for (int r = 0; r < 3; ++r) EXPECT_EQ(got[2][r].out, ok[1][r].out) << spec << " rank " << r;
    }
  }
}

TEST(ScaleCompTest, PayloadIsTheValuesEachRankContributes) {
  Job job;
  job.ranks = 2;
  job.sizes = {1000, 0, 37};  // k = ceil(1037 / 10) = 104
  job.input = [](int rank, int, size_t t, size_t i) {  // positive: no sum cancels to zero
    return std::fabs(Dyadic(rank, 0, t, i)) + 1.0f;
  };
  for (const char* spec : {"scalecomp:ratio=10", "randomk:ratio=10", "topk:ratio=10"}) {
    job.spec = spec;
    const uint64_t per_index = std::string(spec) == "topk:ratio=10" ? 8 : 4;
    for (const RankStep& r : FirstStep(job)) {
      ASSERT_EQ(r.payload.size(), 3u);
      EXPECT_EQ(r.payload[1], 0u) << spec;
      EXPECT_EQ(r.payload[0] + r.payload[2], 104 * per_index) << spec;
      size_t in_a = 0, in_c = 0;  // nonzero outputs show where the indices fell
      for (float v : r.out[0]) in_a += v != 0.0f;
      for (float v : r.out[2]) in_c += v != 0.0f;
      if (per_index == 4) {
        EXPECT_EQ(r.payload[0], 4 * in_a) << spec;
        EXPECT_EQ(r.payload[2], 4 * in_c) << spec;
      }
    }
  }
}

// The payload per rank is the same at any world size, and the bytes each rank sends stay at
// most 3x the payload (averaged over the leaders; an uncompressed ring's grow as 2(n-1)/n
// times the data): the leader's indices go down a binomial tree ((n-1)/n of a payload per
// rank on average) and the values are summed by a reduce-scatter and an all-gather
// (2(n-1)/n), where recursive doubling would send log2(n) payloads (3 at 8 ranks, 3.9 in all).
TEST(ScaleCompTest, BytesSentStayUnderThreeTimesThePayloadUpToEightRanks) {
  Job job;
  job.sizes = {24000};  // k = 2400: 9,600 bytes of values (> 8 KiB), 4-byte indices
  job.spec = "scalecomp:ratio=10";
  job.local_transport = true;
  job.input = [](int rank, int step, size_t, size_t i) {
    return static_cast<float>((i * 2654435761u + rank * 97 + step * 13) % 1000) / 1000.0f;
  };
  for (int n : {2, 3, 4, 5, 6, 8}) {
    job.ranks = n;
    job.steps = n;  // every rank leads once
    const auto got = RunJob(job);
    uint64_t sent = 0;
    for (const auto& step : got) {
      for (const RankStep& r : step) {
        ASSERT_TRUE(r.status.ok()) << r.status;
        ASSERT_EQ(r.payload[0], 2400u * 4) << n << " ranks";
        sent += r.sent;
      }
    }
    const double per_rank = static_cast<double>(sent) / (n * n);
    // The values carry n status words; the index broadcast has a header word.
    const double payload = 2400.0 * 4;
    const double exact = (n - 1.0) / n * (2401 * 4) + 2.0 * (n - 1.0) / n * ((2400 + n) * 4);
    EXPECT_LE(per_rank, 3 * payload) << n << " ranks";
    EXPECT_NEAR(per_rank, exact, 8.0 * n) << n << " ranks";
  }
}

// randomk: the same k indices on every rank, one in each stratum, changing with the step; the
// values are the mean of every rank's p there.
TEST(ScaleCompTest, RandomKSharesStratifiedIndices) {
  Job job;
  job.ranks = 3;
  job.steps = 2;
  job.sizes = {1000};
  job.spec = "randomk:ratio=50";  // k = 20 strata of 50
  job.input = [](int rank, int step, size_t, size_t i) {
    return 1.0f + static_cast<float>((rank * 7 + step * 3 + i) % 16) / 16.0f;  // positive
  };
  const auto got = RunJob(job);
  std::vector<size_t> first;
  for (int step = 0; step < 2; ++step) {
    std::vector<size_t> support;
    for (size_t i = 0; i < 1000; ++i) {
      if (got[step][0].out[0][i] != 0.0f) support.push_back(i);
    }
    ASSERT_EQ(support.size(), 20u);
    for (size_t j = 0; j < 20; ++j) EXPECT_EQ(support[j] / 50, j) << "one index per stratum";
    for (int r = 0; r < 3; ++r) EXPECT_EQ(got[step][r].out, got[step][0].out) << "rank " << r;
    if (step == 0) {
      first = support;
      for (size_t i : support) {
        float sum = 0;
        for (int r = 0; r < 3; ++r) sum += job.input(r, 0, 0, i);
        EXPECT_EQ(got[0][0].out[0][i], sum / 3.0f) << i;
      }
    } else {
      EXPECT_NE(support, first) << "new indices each step";
    }
  }
  EXPECT_EQ(FirstStep(job)[0].out, got[0][0].out) << "same seed, same step: same indices";
}

// granularity=tensor: a tensor's result does not depend on what else is in its bucket.
TEST(ScaleCompTest, TensorGranularityDoesNotDependOnTheBucket) {
  Job both;
  both.ranks = 2;
  both.steps = 3;
  both.spec = "scalecomp:ratio=8,granularity=tensor";
  both.sizes = {600, 90};
  Job alone = both;
  alone.sizes = {600};
  const auto fused = RunJob(both);
  const auto single = RunJob(alone);
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < 2; ++r) EXPECT_EQ(fused[step][r].out[0], single[step][r].out[0]);
  }
}

}  // namespace
}  // namespace braid::compression
