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
#include "tests/testing/negotiation_world.h"

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
using FakeWorld = testing::NegotiationWorld;

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
    EXPECT_TRUE(r.homogeneous());
  }
}

TEST(RendezvousTest, HomogeneousOnlyWhenEveryHostRunsAsManyRanks) {
  // Host a runs 2 ranks, host b 1: not homogeneous (Horovod's is_homogeneous()).
  auto out = AssignRanks({Reg(-1, "a", 10), Reg(-1, "a", 11), Reg(-1, "b", 12)}, 3);
  ASSERT_TRUE(out.ok()) << out.status();
  for (const auto& r : *out) EXPECT_FALSE(r.homogeneous());
  auto one = AssignRanks({Reg(-1, "a", 10)}, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE((*one)[0].homogeneous());
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

namespace braid::coordinator {
namespace {

// A fake world whose ranks keep a response-cache mirror and send ids when they can, as the
// runtime does.
struct CachingWorld {
  CachingWorld(int n, int capacity) : table(n, 0, capacity), mirror(n), lists(n) {}
  // Every rank submits `reqs`; returns the responses rank 0 received, and counts the full
  // requests that were sent.
  std::vector<proto::Response> Step(const std::vector<proto::Request>& reqs) {
    std::vector<proto::Response> got;
    for (int r = 0; r < static_cast<int>(mirror.size()); ++r) {
      proto::RequestList l;
      l.set_rank(r);
      for (const auto& q : reqs) {
        auto it = mirror[r].find(q.name());
        if (it != mirror[r].end() && it->second.second == q.SerializeAsString()) {
          l.add_cached_ids(it->second.first);
        } else {
          *l.add_requests() = q;
          ++full_requests;
        }
      }
      auto ready = table.Submit(r, l);
      auto evicted = table.TakeEvictions();
      for (auto& m : mirror) {
        for (const auto& resp : ready) {
          for (int i = 0; i < resp.cache_ids_size(); ++i) {
            if (resp.cache_ids(i) == 0) continue;
            for (const auto& q : reqs) {
              if (q.name() == resp.names(i)) m[q.name()] = {resp.cache_ids(i), q.SerializeAsString()};
            }
          }
        }
        for (int32_t id : evicted) {
          for (auto it = m.begin(); it != m.end(); ++it) {
            if (it->second.first == id) { m.erase(it); break; }
          }
        }
      }
      got.insert(got.end(), ready.begin(), ready.end());
    }
    return got;
  }
  NegotiationTable table;
  std::vector<std::map<std::string, std::pair<int32_t, std::string>>> mirror;
  std::vector<int> lists;
  int full_requests = 0;
};

TEST(ResponseCacheTest, SecondStepTravelsAsIdsAndGivesTheSameResponses) {
  CachingWorld w(2, 16);
  std::vector<proto::Request> step{Req("a", {4}), Req("b", {8}), Req("c", {2})};
  auto first = w.Step(step);
  EXPECT_EQ(w.full_requests, 6);
  auto second = w.Step(step);
  EXPECT_EQ(w.full_requests, 6) << "the second step must send ids only";
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].type(), proto::Response::OK);
    EXPECT_EQ(first[i].names(0), second[i].names(0));
    EXPECT_EQ(first[i].tensor_sizes(0), second[i].tensor_sizes(0));
  }
}

TEST(ResponseCacheTest, ChangedMetadataIsRenegotiatedNotMisapplied) {
  CachingWorld w(2, 16);
  w.Step({Req("a", {4})});
  auto changed = w.Step({Req("a", {6})});
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].type(), proto::Response::OK);
  EXPECT_EQ(changed[0].tensor_sizes(0), 6);
  EXPECT_EQ(w.full_requests, 4);
  // A rank whose metadata changed while the other's did not: a mismatch, reported.
  proto::RequestList l0, l1;
  l0.set_rank(0);
  l0.add_cached_ids(w.mirror[0]["a"].first);
  l1.set_rank(1);
  *l1.add_requests() = Req("a", {7});
  EXPECT_TRUE(w.table.Submit(0, l0).empty());
  auto err = w.table.Submit(1, l1);
  ASSERT_EQ(err.size(), 1u);
  EXPECT_EQ(err[0].error_message(), "tensor 'a': shape differs across ranks: [6] on rank 0; [7] on rank 1");
}

TEST(ResponseCacheTest, MoreNamesThanCapacityEvictLeastRecentlyUsedEverywhere) {
  CachingWorld w(3, 2);
  std::vector<proto::Request> step;
  for (int i = 0; i < 5; ++i) step.push_back(Req(absl::StrCat("t", i), {i + 1}));
  for (int s = 0; s < 3; ++s) {
    auto got = w.Step(step);
    ASSERT_EQ(got.size(), 5u);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].type(), proto::Response::OK) << got[i].error_message();
    }
    for (const auto& m : w.mirror) EXPECT_LE(m.size(), 2u);
    EXPECT_EQ(w.mirror[0], w.mirror[1]);
    EXPECT_EQ(w.mirror[1], w.mirror[2]);
  }
}

TEST(ResponseCacheTest, AnIdEvictedInFlightStillResolves) {
  CachingWorld w(2, 1);
  w.Step({Req("x", {3})});
  const int32_t old_id = w.mirror[1]["x"].first;
  w.Step({Req("y", {5})});  // evicts x everywhere
  EXPECT_EQ(w.mirror[1].count("x"), 0u);
  // Rank 1 had sent x's id before it saw the eviction; rank 0 sends the full request.
  proto::RequestList l0, l1;
  l0.set_rank(0);
  *l0.add_requests() = Req("x", {3});
  l1.set_rank(1);
  l1.add_cached_ids(old_id);
  EXPECT_TRUE(w.table.Submit(0, l0).empty());
  auto got = w.table.Submit(1, l1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type(), proto::Response::OK) << got[0].error_message();
  EXPECT_EQ(got[0].names(0), "x");
}

}  // namespace
}  // namespace braid::coordinator

namespace braid::coordinator {
namespace {

// A rank's id can arrive after many more evictions (its requests of a step go out in
// batches while other tensors complete): it must still resolve. Seen with 4 ranks.
TEST(ResponseCacheTest, AnIdStillResolvesAfterManyLaterEvictions) {
  CachingWorld w(2, 1);
  w.Step({Req("x", {3})});
  const int32_t old_id = w.mirror[1]["x"].first;
  for (int i = 0; i < 5; ++i) w.Step({Req(absl::StrCat("y", i), {i + 1})});  // 5 evictions
  proto::RequestList l0, l1;
  l0.set_rank(0);
  *l0.add_requests() = Req("x", {3});
  l1.set_rank(1);
  l1.add_cached_ids(old_id);
  EXPECT_TRUE(w.table.Submit(0, l0).empty());
  auto got = w.table.Submit(1, l1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type(), proto::Response::OK) << got[0].error_message();
  EXPECT_EQ(got[0].names(0), "x");
}

}  // namespace
}  // namespace braid::coordinator
