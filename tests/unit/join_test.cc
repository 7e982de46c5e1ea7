// join() for uneven inputs (Note [Join], coordinator/negotiation.h): the coordinator's join
// logic driven with plain messages, then the real runtime with ranks as threads of one
// process (tests/testing/runtime_world.h), results against references computed here.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/negotiation.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/runtime_world.h"

namespace braid {
namespace {

// ---- the negotiation table -----------------------------------------------------------------

proto::Request Req(const std::string& name, std::vector<int64_t> shape,
                   proto::Collective coll = proto::ALLREDUCE, proto::ReduceOp op = proto::SUM) {
  proto::Request r;
  r.set_name(name);
  r.set_collective(coll);
  r.set_dtype(proto::FLOAT32);
  for (int64_t d : shape) r.add_shape(d);
  r.set_reduce_op(op);
  r.set_compression(coll == proto::ALLREDUCE ? "none" : "");
  return r;
}

proto::Request Join() { return Req("braid.join", {}, proto::JOIN); }

std::vector<proto::Response> Submit(coordinator::NegotiationTable& t, int rank,
                                    std::vector<proto::Request> reqs) {
  proto::RequestList l;
  l.set_rank(rank);
  for (auto& r : reqs) *l.add_requests() = std::move(r);
  return t.Submit(rank, l);
}

TEST(JoinNegotiationTest, AJoinedRankCountsAsReadyAndGetsTheShape) {
  coordinator::NegotiationTable t(3);
  EXPECT_TRUE(Submit(t, 2, {Join()}).empty()) << "the join waits for every rank";
  EXPECT_EQ(t.joined_ranks(), (std::vector<int>{2}));
  EXPECT_TRUE(t.PendingTensors().empty())
      << "a join waiting for the others is no pending tensor: never a stall";
  EXPECT_TRUE(Submit(t, 0, {Req("g", {2, 3})}).empty()) << "rank 1 has not submitted 'g'";
  auto pending = t.PendingTensors();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].ready_ranks, (std::vector<int>{0, 2})) << "a joined rank is ready";
  EXPECT_EQ(pending[0].missing_ranks, (std::vector<int>{1}));
  auto ready = Submit(t, 1, {Req("g", {2, 3})});
  ASSERT_EQ(ready.size(), 1u);
  const proto::Response& r = ready[0];
  EXPECT_EQ(r.type(), proto::Response::OK) << r.error_message();
  EXPECT_EQ(r.names(0), "g");
  EXPECT_EQ(std::vector<int>(r.joined_ranks().begin(), r.joined_ranks().end()),
            (std::vector<int>{2}));
  ASSERT_EQ(r.shapes_size(), 1);
  EXPECT_EQ(std::vector<int64_t>(r.shapes(0).dims().begin(), r.shapes(0).dims().end()),
            (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.tensor_sizes(0), 6);
}

TEST(JoinNegotiationTest, JoiningCompletesWhatWaitedForTheJoiner) {
  coordinator::NegotiationTable t(3);
  EXPECT_TRUE(Submit(t, 0, {Req("b", {4}), Req("a", {5})}).empty());
  EXPECT_TRUE(Submit(t, 1, {Req("a", {5}), Req("b", {4})}).empty());
  auto ready = Submit(t, 2, {Join()});
  ASSERT_EQ(ready.size(), 2u) << "both tensors waited only for rank 2";
  EXPECT_EQ(ready[0].names(0), "a") << "in the table's order, the same on every rank";
  EXPECT_EQ(ready[1].names(0), "b");
  for (const auto& r : ready) {
    EXPECT_EQ(r.type(), proto::Response::OK);
    ASSERT_EQ(r.joined_ranks_size(), 1);
    EXPECT_EQ(r.joined_ranks(0), 2);
  }
  EXPECT_TRUE(t.PendingTensors().empty());
}

TEST(JoinNegotiationTest, EveryRankJoinedAnswersTheLastJoinerThenANewRoundIsNormal) {
  coordinator::NegotiationTable t(3);
  EXPECT_TRUE(Submit(t, 1, {Join()}).empty());
  EXPECT_TRUE(Submit(t, 0, {Join()}).empty());
  auto ready = Submit(t, 2, {Join()});
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), proto::Response::OK);
  EXPECT_EQ(ready[0].collective(), proto::JOIN);
  EXPECT_EQ(ready[0].names(0), "braid.join");
  EXPECT_EQ(ready[0].last_joined_rank(), 2);
  EXPECT_TRUE(t.joined_ranks().empty());
  // The next round: nobody joined, a tensor waits for every rank and names no joined rank.
  EXPECT_TRUE(Submit(t, 0, {Req("x", {1})}).empty());
  EXPECT_TRUE(Submit(t, 1, {Req("x", {1})}).empty());
  ready = Submit(t, 2, {Req("x", {1})});
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].joined_ranks_size(), 0);
  EXPECT_EQ(ready[0].shapes_size(), 0);
  // And a second join round answers its own last joiner.
  EXPECT_TRUE(Submit(t, 2, {Join()}).empty());
  EXPECT_TRUE(Submit(t, 0, {Join()}).empty());
  ready = Submit(t, 1, {Join()});
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].last_joined_rank(), 1);
}

TEST(JoinNegotiationTest, OtherCollectivesFailNamingTheJoinedRank) {
  coordinator::NegotiationTable t(3);
  Submit(t, 1, {Join()});
  Submit(t, 0, {Req("rows", {2, 3}, proto::ALLGATHER)});
  auto ready = Submit(t, 2, {Req("rows", {1, 3}, proto::ALLGATHER)});
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), proto::Response::ERROR);
  EXPECT_EQ(ready[0].error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(ready[0].error_message(),
            "tensor 'rows': allgather is not supported while rank 1 has joined (join() for "
            "uneven inputs covers allreduce and barrier only: a joined rank has no data to "
            "contribute)");
  // A barrier is fine.
  Submit(t, 0, {Req("b", {}, proto::BARRIER)});
  ready = Submit(t, 2, {Req("b", {}, proto::BARRIER)});
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type(), proto::Response::OK);
  EXPECT_EQ(ready[0].joined_ranks(0), 1);
}

TEST(JoinNegotiationTest, FusedTensorsShareTheirJoinedRanksAndCarryEveryShape) {
  coordinator::NegotiationTable t(2, /*fusion_threshold_bytes=*/1 << 20);
  Submit(t, 1, {Join()});
  auto ready = Submit(t, 0, {Req("a", {2}), Req("b", {3, 1})});
  ASSERT_EQ(ready.size(), 1u) << "fused into one bucket";
  ASSERT_EQ(ready[0].names_size(), 2);
  ASSERT_EQ(ready[0].shapes_size(), 2);
  EXPECT_EQ(ready[0].shapes(1).dims_size(), 2);
  EXPECT_EQ(ready[0].shapes(1).dims(0), 3);
}

TEST(JoinNegotiationTest, JoiningTwiceAndARankGoneWithoutJoiningAreErrors) {
  coordinator::NegotiationTable t(3);
  Submit(t, 0, {Join()});
  auto twice = Submit(t, 0, {Join()});
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_EQ(twice[0].error_code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  auto gone = t.FailTensorsWaitingFor({2});
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].names(0), "braid.join");
  EXPECT_EQ(gone[0].error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(gone[0].error_message(),
            "join 'braid.join' can never complete: rank 2 shut down without joining");
  EXPECT_TRUE(t.joined_ranks().empty());
}

// ---- the runtime ---------------------------------------------------------------------------

using testing::RuntimeWorld;
using testing::WorldOf;

absl::StatusOr<std::shared_ptr<Handle>> EnqueueJoin(Runtime& rt) {
  CollectiveRequest r;
  r.name = "braid.join";
  r.collective = Collective::kJoin;
  return rt.Enqueue(r);
}

int32_t LastJoiner(const Handle& h) {
  int32_t v = -1;
  EXPECT_EQ(h.output().size(), sizeof(v));
  if (h.output().size() == sizeof(v)) std::memcpy(&v, h.output().data(), sizeof(v));
  return v;
}

// Rank `short_rank` has `steps - 3` batches, the others `steps`; each step all-reduces one
// tensor per op. The result of step s on a rank with data: the ranks that still have data
// reduced, the joined one contributing the op's identity; an average divides by the world.
void RunUneven(int size, int short_rank, const std::string& compression) {
  RuntimeWorld w(WorldOf(size));
  ASSERT_TRUE(w.InitOk());
  constexpr int kSteps = 5, kShort = 3, kN = 7;
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  auto value = [](int rank, int step, int i) {
    return static_cast<float>((rank + 1) * 0.5 + step * 0.25 - i * 0.125);
  };
  std::vector<int32_t> last(size, -2);
  w.Run([&](int rank, Runtime& rt) {
    const int my_steps = rank == short_rank ? kSteps - kShort : kSteps;
    for (int step = 0; step < my_steps; ++step) {
      for (ReduceOp op : ops) {
        std::vector<float> in(kN), out(kN);
        for (int i = 0; i < kN; ++i) in[i] = value(rank, step, i);
        CollectiveRequest r;
        r.name = absl::StrCat("t", static_cast<int>(op));
        r.shape = {kN};
        r.input = in.data();
        r.output = out.data();
        r.op = op;
        if (op == ReduceOp::kSum || op == ReduceOp::kAverage) r.compression = compression;
        auto h = rt.Enqueue(r);
        ASSERT_TRUE(h.ok()) << h.status();
        ASSERT_TRUE((*h)->Wait(absl::Seconds(30)).ok()) << (*h)->status();
        for (int i = 0; i < kN; ++i) {
          // The reference: only ranks with data at this step, the identity for the others.
          double sum = 0, prod = 1, mn = INFINITY, mx = -INFINITY;
          for (int p = 0; p < size; ++p) {
            if (p == short_rank && step >= kSteps - kShort) continue;
            const double v = value(p, step, i);
            sum += v, prod *= v, mn = std::min(mn, v), mx = std::max(mx, v);
          }
          double want = op == ReduceOp::kSum       ? sum
                        : op == ReduceOp::kAverage ? sum / size  // the whole world size
                        : op == ReduceOp::kMin     ? mn
                        : op == ReduceOp::kMax     ? mx
                                                   : prod;
          // fp16 carries 11 significant bits: a relative error of 2^-11 per rounding.
          const double tol = compression == "fp16" ? 4e-3 : 1e-5;
          EXPECT_NEAR(out[i], want, tol * std::max(1.0, std::abs(want)))
              << "rank " << rank << " step " << step << " op " << ReduceOpName(op) << " i " << i;
        }
      }
    }
    auto h = EnqueueJoin(rt);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE((*h)->Wait(absl::Seconds(30)).ok()) << (*h)->status();
    last[rank] = LastJoiner(**h);
  });
  // The short rank joined first; the others joined in any order, so the last joiner is one
  // of them, the same on every rank.
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(last[r], last[0]) << "rank " << r;
  }
  EXPECT_NE(last[0], short_rank);
  EXPECT_GE(last[0], 0);
  EXPECT_LT(last[0], size);
  // After the join round, a collective is normal again: every rank's data counts.
  w.Run([&](int rank, Runtime& rt) {
    float in = static_cast<float>(rank + 1), out = 0;
    CollectiveRequest r;
    r.name = "after";
    r.shape = {1};
    r.input = &in;
    r.output = &out;
    r.op = ReduceOp::kSum;
    auto h = rt.Enqueue(r);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*h)->Wait(absl::Seconds(30)).ok()) << (*h)->status();
    EXPECT_EQ(out, size * (size + 1) / 2.0f);
  });
}

TEST(JoinRuntimeTest, TwoRanksOneShortEveryOpMatchesTheReference) { RunUneven(2, 1, ""); }
TEST(JoinRuntimeTest, ThreeRanksOneShortEveryOpMatchesTheReference) { RunUneven(3, 0, ""); }
TEST(JoinRuntimeTest, ThreeRanksOneShortUnderFp16) { RunUneven(3, 2, "fp16"); }

TEST(JoinRuntimeTest, TheLastJoinerIsTheRankThatJoinedLast) {
  RuntimeWorld w(WorldOf(3));
  ASSERT_TRUE(w.InitOk());
  // Ranks 0 and 2 join first (their joins are negotiating); rank 1 joins after.
  auto h0 = EnqueueJoin(w[0]);
  auto h2 = EnqueueJoin(w[2]);
  ASSERT_TRUE(h0.ok() && h2.ok());
  // Rank 1 still works alone: its all-reduce completes with the others' identity.
  float in = 3, out = 0;
  CollectiveRequest r;
  r.name = "alone";
  r.shape = {1};
  r.input = &in;
  r.output = &out;
  r.op = ReduceOp::kAverage;
  auto h = w[1].Enqueue(r);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(absl::Seconds(30)).ok()) << (*h)->status();
  EXPECT_FLOAT_EQ(out, 1.0f) << "3 / world size 3";
  EXPECT_FALSE((*h0)->Poll()) << "rank 1 has not joined yet";
  auto h1 = EnqueueJoin(w[1]);
  ASSERT_TRUE(h1.ok());
  for (auto* hh : {&h0, &h1, &h2}) {
    ASSERT_TRUE((**hh)->Wait(absl::Seconds(30)).ok()) << (**hh)->status();
    EXPECT_EQ(LastJoiner(***hh), 1);
  }
}

TEST(JoinRuntimeTest, AnAllGatherWhileARankJoinedFailsNamingIt) {
  RuntimeWorld w(WorldOf(2));
  ASSERT_TRUE(w.InitOk());
  auto joined = EnqueueJoin(w[1]);
  ASSERT_TRUE(joined.ok());
  float in[2] = {1, 2};
  CollectiveRequest r;
  r.name = "rows";
  r.collective = Collective::kAllGather;
  r.shape = {2};
  r.input = in;
  auto h = w[0].Enqueue(r);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->Wait(absl::Seconds(30)),
            absl::FailedPreconditionError(
                "tensor 'rows': allgather is not supported while rank 1 has joined (join() for "
                "uneven inputs covers allreduce and barrier only: a joined rank has no data to "
                "contribute)"));
  auto h0 = EnqueueJoin(w[0]);
  ASSERT_TRUE(h0.ok());
  ASSERT_TRUE((*h0)->Wait(absl::Seconds(30)).ok()) << (*h0)->status();
  ASSERT_TRUE((*joined)->Wait(absl::Seconds(30)).ok()) << (*joined)->status();
  EXPECT_EQ(LastJoiner(**h0), 0);
}

}  // namespace
}  // namespace braid
