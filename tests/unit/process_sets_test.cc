// Process sets' pure parts (Note [Process sets] in control/process_sets.h): the table of sets,
// the coordinator's negotiation within sets and of the changes of the sets, the fast path's
// agreement on a set's cached tensors, and a set's channels over the world's point-to-point
// layer.
#include "control/process_sets.h"

#include <string>
#include <thread>
#include <vector>

#include "coordinator/negotiation.h"
#include "gtest/gtest.h"
#include "runtime/fast_path.h"
#include "tests/testing/negotiation_world.h"
#include "transport/channels.h"

namespace braid {
namespace {

TEST(ProcessSetTableTest, IdsAreTheLowestFreeOnesAndDuplicatesAreRefused) {
  ProcessSetTable t(4);
  EXPECT_EQ(*t.Find(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*t.Add({0, 1}), 1);
  EXPECT_EQ(*t.Add({2, 3}), 2);
  EXPECT_EQ(t.Add({0, 1}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(t.Add({0, 1, 2, 3}).status().code(), absl::StatusCode::kAlreadyExists);  // world
  EXPECT_EQ(t.Add({1, 0}).status().code(), absl::StatusCode::kInvalidArgument);  // unsorted
  EXPECT_EQ(t.Add({0, 4}).status().code(), absl::StatusCode::kInvalidArgument);  // outside
  EXPECT_EQ(t.Add({}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(t.Remove(1).ok());
  EXPECT_EQ(t.Find(1), nullptr);
  EXPECT_EQ(*t.Add({1, 3}), 1);  // reused
  EXPECT_EQ(t.Remove(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Remove(9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SetRank({1, 3}, 3), 1);
  EXPECT_EQ(SetRank({1, 3}, 2), -1);
  EXPECT_EQ(QualifiedName(0, "g"), "g");
  EXPECT_EQ(QualifiedName(2, "g"), "ps2/g");
}

TEST(ProcessSetTableTest, AtMostMaxSetsAtOnce) {
  ProcessSetTable t(64);
  for (int i = 0; i < kMaxProcessSets; ++i) ASSERT_TRUE(t.Add({i}).ok()) << i;
  EXPECT_EQ(t.Add({40}).status().code(), absl::StatusCode::kFailedPrecondition);
}

proto::Request Req(const std::string& name, int32_t set, std::vector<int64_t> shape = {4},
                   proto::Collective coll = proto::ALLREDUCE) {
  proto::Request r;
  r.set_name(name);
  r.set_collective(coll);
  r.set_dtype(proto::FLOAT32);
  for (int64_t d : shape) r.add_shape(d);
  r.set_reduce_op(proto::SUM);
  r.set_process_set_id(set);
  return r;
}

proto::Request Add(const std::string& name, std::vector<int> ranks, bool members_only = false) {
  proto::Request r = Req(name, 0, {}, proto::PROCESS_SET_ADD);
  for (int x : ranks) r.add_process_set_ranks(x);
  r.set_members_only(members_only);
  return r;
}

proto::Request Remove(const std::string& name, int32_t id) {
  proto::Request r = Req(name, 0, {}, proto::PROCESS_SET_REMOVE);
  r.set_target_process_set_id(id);
  return r;
}

// The coordinator's table, with what each rank receives: the common order and its replies.
struct World : testing::NegotiationWorld {
  explicit World(int n) : NegotiationWorld(n, /*replies=*/true) {}
};

TEST(ProcessSetNegotiationTest, ReadyWhenEveryMemberAskedAndOnlyMembersMayAsk) {
  World w(4);
  w.SendAll({0, 1, 2, 3}, Add("process_set.change.0", {1, 3}));
  ASSERT_EQ(w.inbox[0].size(), 1u);
  EXPECT_EQ(w.inbox[0][0].type(), proto::Response::OK) << w.inbox[0][0].error_message();
  EXPECT_EQ(w.inbox[0][0].target_process_set_id(), 1);
  EXPECT_EQ(w.inbox[2][0].process_set_ranks_size(), 2);
  w.Send(1, {Req("ps1/g", 1)});
  EXPECT_EQ(w.inbox[0].size(), 1u);  // rank 3 has not asked
  auto pending = w.table.PendingTensors();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].missing_ranks, (std::vector<int>{3}));  // not 0 and 2
  w.Send(2, {Req("ps1/g", 1)});  // not a member: refused to it alone
  ASSERT_EQ(w.inbox[2].size(), 2u);
  EXPECT_EQ(w.inbox[2][1].error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(w.inbox[2][1].error_message().find("rank 2 is not in process set 1"),
            std::string::npos) << w.inbox[2][1].error_message();
  w.Send(3, {Req("ps1/g", 1)});
  ASSERT_EQ(w.inbox[1].size(), 2u);
  EXPECT_EQ(w.inbox[1][1].type(), proto::Response::OK);
  EXPECT_EQ(w.inbox[1][1].process_set_id(), 1);  // ranks 0 and 2 skip it
  EXPECT_EQ(w.table.process_set_counts().at(1).negotiated, 1);
}

TEST(ProcessSetNegotiationTest, AllGatherFirstDimsListTheSetsRanksOnly) {
  World w(4);
  w.SendAll({0, 1, 2, 3}, Add("process_set.change.0", {0, 2, 3}));
  w.Send(0, {Req("ps1/ag", 1, {1, 2}, proto::ALLGATHER)});
  w.Send(2, {Req("ps1/ag", 1, {3, 2}, proto::ALLGATHER)});
  w.Send(3, {Req("ps1/ag", 1, {5, 2}, proto::ALLGATHER)});
  const proto::Response& r = w.inbox[1].back();
  ASSERT_EQ(r.type(), proto::Response::OK) << r.error_message();
  EXPECT_EQ(std::vector<int64_t>(r.first_dims().begin(), r.first_dims().end()),
            (std::vector<int64_t>{1, 3, 5}));
}

TEST(ProcessSetNegotiationTest, MismatchedChangesFailOnEveryRankNamingWhatEachAsked) {
  World w(3);
  w.Send(0, {Add("process_set.change.0", {0, 1})});
  w.Send(1, {Add("process_set.change.0", {0, 1})});
  w.Send(2, {Remove("process_set.change.0", 1)});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(w.inbox[r].size(), 1u);
    const proto::Response& resp = w.inbox[r][0];
    EXPECT_EQ(resp.type(), proto::Response::ERROR);
    EXPECT_NE(resp.error_message().find("add_process_set([0, 1]) on ranks 0, 1"),
              std::string::npos) << resp.error_message();
    EXPECT_NE(resp.error_message().find("remove_process_set(1) on rank 2"), std::string::npos);
  }
  EXPECT_TRUE(w.table.process_sets().sets().empty());
}

TEST(ProcessSetNegotiationTest, RemovingASetFailsItsPendingCollectivesNamingIt) {
  World w(3);
  w.SendAll({0, 1, 2}, Add("process_set.change.0", {0, 1}));
  w.Send(0, {Req("ps1/g", 1)});
  w.SendAll({0, 1, 2}, Remove("process_set.change.1", 1));
  bool failed = false;
  for (const proto::Response& r : w.inbox[0]) {
    if (r.names(0) == "ps1/g") {
      failed = r.type() == proto::Response::ERROR &&
               r.error_message().find("process set 1 [0, 1]") != std::string::npos;
    }
  }
  EXPECT_TRUE(failed);
  EXPECT_TRUE(w.table.PendingTensors().empty());
  EXPECT_EQ(w.table.process_sets().Find(1), nullptr);
  w.Send(1, {Req("ps1/g", 1)});  // the set is gone
  EXPECT_NE(w.inbox[1].back().error_message().find("does not exist"), std::string::npos);
}

TEST(ProcessSetNegotiationTest, MembersOnlyAddsAgreeAmongTheMembersAndReuseAnExistingSet) {
  World w(4);
  w.SendAll({1, 2}, Add("process_set.new_group.1,2.0", {1, 2}, true));
  ASSERT_EQ(w.inbox[0].size(), 1u);  // every rank learns of it
  EXPECT_EQ(w.inbox[0][0].target_process_set_id(), 1);
  w.SendAll({1, 2}, Add("process_set.new_group.1,2.1", {1, 2}, true));
  EXPECT_EQ(w.inbox[3].back().target_process_set_id(), 1);  // the same set again
  w.Send(0, {Add("process_set.new_group.1,2.2", {1, 2}, true)});  // not a member
  EXPECT_EQ(w.inbox[0].back().type(), proto::Response::ERROR);
}

TEST(ProcessSetNegotiationTest, JoinIsPerSet) {
  World w(3);
  w.SendAll({0, 1, 2}, Add("process_set.change.0", {0, 1}));
  proto::Request join = Req("ps1/braid.join", 1, {0}, proto::JOIN);
  w.Send(1, {join});
  w.Send(0, {Req("ps1/g", 1)});  // ready: rank 1 joined the set
  const proto::Response& r = w.inbox[2].back();
  ASSERT_EQ(r.names(0), "ps1/g");
  EXPECT_EQ(std::vector<int>(r.joined_ranks().begin(), r.joined_ranks().end()),
            (std::vector<int>{1}));
  w.Send(0, {Req("world", 0)});
  w.Send(1, {Req("world", 0)});
  EXPECT_NE(w.inbox[0].back().names(0), "world");  // rank 2 has not asked: no world join
  w.Send(0, {join});
  EXPECT_EQ(w.inbox[2].back().collective(), proto::JOIN);
  EXPECT_EQ(w.inbox[2].back().process_set_id(), 1);
}

// A negotiation deadline in one set puts that set's ranks out of step, not a disjoint set's;
// a barrier of the set resynchronizes them.
TEST(ProcessSetNegotiationTest, ADeadlineInOneSetLeavesADisjointSetRunning) {
  World w(4);
  w.SendAll({0, 1, 2, 3}, Add("process_set.change.0", {0, 1}));
  w.SendAll({0, 1, 2, 3}, Add("process_set.change.1", {2, 3}));
  w.Send(0, {Req("ps1/x", 1)});
  w.table.ExpireOlderThan(absl::ZeroDuration(), absl::Now() + absl::Seconds(1));
  w.TakeReplies();
  EXPECT_EQ(w.inbox[0].back().error_code(),
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(w.table.out_of_step());
  w.SendAll({2, 3}, Req("ps2/y", 2));  // the disjoint set goes on
  EXPECT_EQ(w.inbox[2].back().names(0), "ps2/y");
  EXPECT_EQ(w.inbox[2].back().type(), proto::Response::OK) << w.inbox[2].back().error_message();
  w.Send(1, {Req("ps1/z", 1)});  // the set that expired is out of step
  EXPECT_EQ(w.inbox[1].back().error_code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(w.inbox[1].back().error_message().find("a set holding ranks 0, 1"),
            std::string::npos) << w.inbox[1].back().error_message();
  w.Send(3, {Req("w", 0)});  // so is the whole job's set, which holds them
  EXPECT_EQ(w.inbox[3].back().error_code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  w.SendAll({0, 1}, Req("ps1/barrier", 1, {0}, proto::BARRIER));
  EXPECT_FALSE(w.table.out_of_step());
  w.SendAll({0, 1}, Req("ps1/z2", 1));
  EXPECT_EQ(w.inbox[0].back().names(0), "ps1/z2");
  EXPECT_EQ(w.inbox[0].back().type(), proto::Response::OK);
}

// A rank outside a set caches its tensors from the response, so every cache is the same and
// the slot is agreed when the set's members, and only they, voted it ready.
TEST(ProcessSetFastPathTest, ASetsSlotIsReadyWhenEveryMemberMarksIt) {
  proto::Request g = Req("ps1/g", 1);
  proto::Response resp;
  resp.add_names("ps1/g");
  resp.set_collective(proto::ALLREDUCE);
  resp.set_dtype(proto::FLOAT32);
  resp.set_reduce_op(proto::SUM);
  resp.set_process_set_id(1);
  resp.add_tensor_sizes(4);
  FastPathCache member, outside;
  member.Insert(5, "ps1/g", g.SerializeAsString(), resp);
  outside.InsertOutside(5, resp, 0);
  EXPECT_EQ(member.digest(), outside.digest());
  EXPECT_EQ(RequestBytes(member.Find(5)->request), RequestBytes(outside.Find(5)->request));
  EXPECT_EQ(outside.Lookup("ps1/g", g.SerializeAsString()), 0);
  EXPECT_EQ(PlanFastBuckets({5}, member, 1 << 20), PlanFastBuckets({5}, outside, 1 << 20));
  auto votes = [&](const std::vector<int>& ready_ranks) {
    std::vector<uint64_t> gathered;
    for (int rank = 0; rank < 3; ++rank) {
      Vote v;
      v.cache_size = 1;
      v.digest = member.digest();
      v.ready.assign(1, 0);
      v.invalidate = v.ready;
      for (int r : ready_ranks) {
        if (r == rank) SetBit(&v.ready, 0);
      }
      auto words = EncodeVote(v);
      gathered.insert(gathered.end(), words.begin(), words.end());
    }
    return gathered;
  };
  ProcessSetRanks ranks = [](int32_t id) -> std::optional<std::vector<int>> {
    if (id == 1) return std::vector<int>{0, 2};
    return std::nullopt;
  };
  auto a = Agree(votes({0, 2}), 3, outside, 0, ranks);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ready, (std::vector<int32_t>{5}));
  a = Agree(votes({0}), 3, outside, 0, ranks);
  EXPECT_TRUE(a->ready.empty());
  a = Agree(votes({0, 2}), 3, outside, 0, [](int32_t) { return std::nullopt; });  // removed
  EXPECT_TRUE(a->ready.empty());
}

// Two disjoint sets reduce at once over one in-process world, and a set overlapping both
// after them: every result exact, the world's channels untouched.
TEST(ProcessSetChannelsTest, DisjointAndOverlappingSetsOverOneLayer) {
  std::vector<transport::Channels> world = transport::CreateLocalChannels(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      const std::vector<int> pair = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
      transport::Channels mine = world[r].subset(r % 2 == 0 ? 1 : 2, pair);
      EXPECT_EQ(mine.data->rank(), r / 2);
      EXPECT_EQ(mine.data->size(), 2);
      std::vector<float> x(300, 1.0f + r);
      for (int step = 0; step < 5; ++step) {
        ASSERT_TRUE(mine.data->AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32,
                                         ReduceOp::kSum).ok());
      }
      const float pair_sum = r % 2 == 0 ? 1 + 3 : 2 + 4;
      EXPECT_EQ(x[0], pair_sum * 16);  // summed 5 times over 2 ranks
      std::vector<float> y(7, 1.0f);
      if (r != 0) {
        transport::Channels upper = world[r].subset(3, {1, 2, 3});
        ASSERT_TRUE(upper.control->Barrier().ok());
        ASSERT_TRUE(upper.data->AllReduce(y.data(), y.data(), y.size(), DataType::kFloat32,
                                          ReduceOp::kSum).ok());
        EXPECT_EQ(y[6], 3.0f);
      }
      ASSERT_TRUE(world[r].data->AllReduce(y.data(), y.data(), 1, DataType::kFloat32,
                                           ReduceOp::kSum).ok());
      EXPECT_EQ(y[0], 1.0f + 3 * 3);  // rank 0's 1 and the others' 3
      EXPECT_EQ(world[r].data->stats().collectives, 1u);
    });
  }
  for (std::thread& t : threads) t.join();
}

// A set's timeout names the ranks of the job, not their positions in the set.
TEST(ProcessSetChannelsTest, TimeoutsNameTheJobsRanks) {
  transport::CollectiveOptions o;
  o.timeout = absl::Milliseconds(200);
  std::vector<transport::Channels> world = transport::CreateLocalChannels(4, o);
  transport::Channels set = world[1].subset(1, {1, 3});  // rank 3 never calls
  absl::Status s = set.control->Barrier();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("rank 1: collective #0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("rank 3"), std::string::npos) << s;
}

}  // namespace
}  // namespace braid
