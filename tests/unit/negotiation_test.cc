// The coordinator's negotiation and rendezvous logic, driven with plain messages through an
// in-process fake of the streams: every ResponseList goes to every simulated rank's inbox.
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/negotiation.h"
#include "coordinator/rendezvous.h"
#include "gtest/gtest.h"

namespace braid::coordinator {
namespace {

proto::Request Req(const std::string& name, std::vector<int64_t> shape,
                   proto::DataType dtype = proto::FLOAT32,
                   proto::Collective coll = proto::ALLREDUCE) {
  proto::Request r;
  r.set_name(name);
  r.set_collective(coll);
  r.set_dtype(dtype);
  for (int64_t d : shape) r.add_shape(d);
  r.set_reduce_op(proto::SUM);
  return r;
}

// The fake transport: what the service would push to each rank's stream.
struct FakeWorld {
  explicit FakeWorld(int n) : table(n), inbox(n) {}
  void Send(int rank, std::vector<proto::Request> reqs) {
    proto::RequestList l;
    l.set_rank(rank);
    for (auto& r : reqs) *l.add_requests() = std::move(r);
    for (const proto::Response& resp : table.Submit(rank, l)) {
      for (auto& box : inbox) box.push_back(resp);
    }
  }
  NegotiationTable table;
  std::vector<std::vector<proto::Response>> inbox;
};

TEST(NegotiationTest, ReadyOnlyWhenEveryRankAsked) {
  FakeWorld w(3);
  w.Send(0, {Req("a", {4})});
  w.Send(2, {Req("a", {4})});
  EXPECT_TRUE(w.inbox[0].empty());
  auto pending = w.table.PendingTensors();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].name, "a");
  EXPECT_EQ(pending[0].ready_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(pending[0].missing_ranks, (std::vector<int>{1}));
  w.Send(1, {Req("a", {4})});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(w.inbox[r].size(), 1u);
    EXPECT_EQ(w.inbox[r][0].type(), proto::Response::OK);
    EXPECT_EQ(w.inbox[r][0].names(0), "a");
  }
  EXPECT_TRUE(w.table.PendingTensors().empty());
  EXPECT_EQ(w.table.tensors_negotiated(), 1);
}

TEST(NegotiationTest, EveryRankGetsTheSameOrderWhateverItsSubmissionOrder) {
  const int kRanks = 4, kTensors = 50;
  FakeWorld w(kRanks);
  std::vector<std::vector<std::string>> orders(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    for (int t = 0; t < kTensors; ++t) orders[r].push_back(absl::StrCat("t", t));
    std::mt19937 rng(r);
    std::shuffle(orders[r].begin(), orders[r].end(), rng);
  }
  // Interleave the ranks' submissions one tensor at a time, in batches of varying size.
  for (int t = 0; t < kTensors; ++t) {
    for (int r = 0; r < kRanks; ++r) {
      const std::string& name = orders[r][t];
      w.Send(r, {Req(name, {static_cast<int64_t>(name.size())})});  // same shape on every rank
    }
  }
  ASSERT_EQ(w.inbox[0].size(), static_cast<size_t>(kTensors));
  std::vector<std::string> seen;
  for (const auto& resp : w.inbox[0]) {
    EXPECT_EQ(resp.type(), proto::Response::OK) << resp.error_message();
    seen.push_back(resp.names(0));
  }
  for (int r = 1; r < kRanks; ++r) {
    ASSERT_EQ(w.inbox[r].size(), w.inbox[0].size());
    for (size_t i = 0; i < w.inbox[r].size(); ++i) EXPECT_EQ(w.inbox[r][i].names(0), seen[i]);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "a tensor ran twice";
}

TEST(NegotiationTest, ShapeMismatchNamesTensorAndEveryRanksShape) {
  FakeWorld w(3);
  w.Send(0, {Req("w", {2, 3})});
  w.Send(1, {Req("w", {3, 2})});
  w.Send(2, {Req("w", {2, 3})});
  ASSERT_EQ(w.inbox[1].size(), 1u);
  const auto& r = w.inbox[1][0];
  EXPECT_EQ(r.type(), proto::Response::ERROR);
  EXPECT_EQ(r.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r.error_message(),
            "tensor 'w': shape differs across ranks: [2, 3] on ranks 0, 2; [3, 2] on rank 1");
}

TEST(NegotiationTest, DtypeMismatchMessage) {
  FakeWorld w(2);
  w.Send(0, {Req("x", {4}, proto::FLOAT32)});
  w.Send(1, {Req("x", {4}, proto::INT32)});
  EXPECT_EQ(w.inbox[0][0].error_message(),
            "tensor 'x': dtype differs across ranks: float32 on rank 0; int32 on rank 1");
}

TEST(NegotiationTest, CollectiveOpRootAndCompressionMismatches) {
  {
    FakeWorld w(2);
    w.Send(0, {Req("c", {4})});
    w.Send(1, {Req("c", {4}, proto::FLOAT32, proto::BROADCAST)});
    EXPECT_EQ(w.inbox[0][0].error_message(),
              "tensor 'c': collective differs across ranks: allreduce on rank 0; broadcast on rank 1");
  }
  {
    FakeWorld w(2);
    auto a = Req("op", {4});
    auto b = a;
    b.set_reduce_op(proto::MAX);
    w.Send(0, {a});
    w.Send(1, {b});
    EXPECT_EQ(w.inbox[0][0].error_message(),
              "tensor 'op': reduce op differs across ranks: sum on rank 0; max on rank 1");
  }
  {
    FakeWorld w(2);
    auto a = Req("b", {4}, proto::FLOAT32, proto::BROADCAST);
    auto b = a;
    b.set_root_rank(1);
    w.Send(0, {a});
    w.Send(1, {b});
    EXPECT_EQ(w.inbox[0][0].error_message(),
              "tensor 'b': root rank differs across ranks: 0 on rank 0; 1 on rank 1");
  }
  {
    FakeWorld w(2);
    auto a = Req("g", {4});
    auto b = a;
    b.set_compression("fp16");
    w.Send(0, {a});
    w.Send(1, {b});
    EXPECT_EQ(w.inbox[1][0].error_message(),
              "tensor 'g': compression differs across ranks: none on rank 0; fp16 on rank 1");
  }
  {
    FakeWorld w(2);
    auto a = Req("r", {4}, proto::FLOAT32, proto::BROADCAST);
    a.set_root_rank(5);
    w.Send(0, {a});
    w.Send(1, {a});
    EXPECT_EQ(w.inbox[1][0].error_message(),
              "tensor 'r': broadcast root rank 5 is not a rank of a world of size 2");
  }
  {
    FakeWorld w(2);
    auto a = Req("avg", {4}, proto::INT32);
    a.set_reduce_op(proto::AVERAGE);
    w.Send(0, {a});
    w.Send(1, {a});
    EXPECT_EQ(w.inbox[1][0].error_message(),
              "tensor 'avg': reduce op average is defined for floating-point types only, got "
              "int32; use sum and divide");
  }
}

TEST(NegotiationTest, AllGatherAgreesOnTrailingShapeAndReportsFirstDims) {
  FakeWorld w(3);
  w.Send(0, {Req("g", {1, 5}, proto::FLOAT32, proto::ALLGATHER)});
  w.Send(1, {Req("g", {4, 5}, proto::FLOAT32, proto::ALLGATHER)});
  w.Send(2, {Req("g", {0, 5}, proto::FLOAT32, proto::ALLGATHER)});
  ASSERT_EQ(w.inbox[0][0].type(), proto::Response::OK) << w.inbox[0][0].error_message();
  EXPECT_EQ(std::vector<int64_t>(w.inbox[0][0].first_dims().begin(), w.inbox[0][0].first_dims().end()),
            (std::vector<int64_t>{1, 4, 0}));
  FakeWorld bad(2);
  bad.Send(0, {Req("h", {2, 5}, proto::FLOAT32, proto::ALLGATHER)});
  bad.Send(1, {Req("h", {2, 6}, proto::FLOAT32, proto::ALLGATHER)});
  EXPECT_EQ(bad.inbox[0][0].error_message(),
            "tensor 'h': trailing shape differs across ranks: [?, 5] on rank 0; [?, 6] on rank 1");
}

TEST(NegotiationTest, SameRankTwiceIsAlreadyExists) {
  FakeWorld w(2);
  w.Send(0, {Req("d", {1})});
  w.Send(0, {Req("d", {1})});
  ASSERT_EQ(w.inbox[0].size(), 1u);
  EXPECT_EQ(w.inbox[0][0].error_code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(w.inbox[0][0].error_message(),
            "tensor 'd': rank 0 submitted it twice before it was negotiated");
}

proto::RegisterRequest Reg(int rank, const std::string& host, int64_t pid) {
  proto::RegisterRequest r;
  r.set_rank(rank);
  r.set_host(host);
  r.set_pid(pid);
  r.set_local_rank(-1);
  return r;
}

TEST(RendezvousTest, AssignsFreeRanksInRegistrationOrderAndLocalRanksByHost) {
  // Registration order: pid 10 (asks rank 2), pid 11, pid 12, pid 13 (asks rank 0).
  auto out = AssignRanks({Reg(2, "a", 10), Reg(-1, "b", 11), Reg(-1, "a", 12), Reg(0, "b", 13)}, 4);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].rank(), 2);
  EXPECT_EQ((*out)[1].rank(), 1);
  EXPECT_EQ((*out)[2].rank(), 3);
  EXPECT_EQ((*out)[3].rank(), 0);
  // Host a has ranks 2, 3; host b has ranks 0, 1.
  EXPECT_EQ((*out)[0].local_rank(), 0);
  EXPECT_EQ((*out)[2].local_rank(), 1);
  EXPECT_EQ((*out)[3].local_rank(), 0);
  EXPECT_EQ((*out)[1].local_rank(), 1);
  for (const auto& r : *out) {
    EXPECT_EQ(r.local_size(), 2);
    EXPECT_EQ(r.size(), 4);
    ASSERT_EQ(r.peers_size(), 4);
    EXPECT_EQ(r.peers(0).pid(), 13);
    EXPECT_EQ(r.peers(3).pid(), 12);
  }
}

TEST(RendezvousTest, DuplicateAndOutOfRangeRanksAreRejected) {
  auto dup = AssignRanks({Reg(1, "a", 10), Reg(1, "b", 11)}, 2);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dup.status().message(), "rank 1 claimed twice: by pid 10 on a and by pid 11 on b");
  auto out = AssignRanks({Reg(0, "a", 10), Reg(2, "a", 11)}, 2);
  EXPECT_EQ(out.status().message(), "rank 2 (pid 11 on a) is outside a world of size 2");
}

}  // namespace
}  // namespace braid::coordinator
