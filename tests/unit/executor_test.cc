// The executor alone (runtime/executor.h), in one process: ranks as threads over the
// in-process transport, the table of collectives in flight a plain map of the test's own.
// No coordinator and no controller: the buckets are the test's.
#include "runtime/executor.h"

#include <cstring>
#include <memory>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "transport/channels.h"

namespace braid {
namespace {

// InFlight over a map: what the controller keeps, without negotiation.
class Table final : public InFlight {
 public:
  std::shared_ptr<Handle> Add(CollectiveRequest req, const compression::CompressionMethod* m) {
    TensorEntry e;
    e.handle = std::make_shared<Handle>();
    e.method = m;
    std::string name = req.name;
    e.req = std::move(req);
    auto handle = e.handle;
    entries_.emplace(name, std::move(e));
    return handle;
  }
  TensorEntry* Find(const std::string& name) override {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
  }
  void Finish(const std::vector<std::string>& names, const absl::Status& s) override {
    for (const std::string& name : names) {
      auto it = entries_.find(name);
      if (it == entries_.end()) continue;
      it->second.handle->Complete(s);
      entries_.erase(it);
    }
  }
  void Abort(const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    aborted_ = s;
  }
  absl::Status aborted() const {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }
  size_t size() const { return entries_.size(); }

 private:
  absl::node_hash_map<std::string, TensorEntry> entries_;
  mutable absl::Mutex mu_;
  absl::Status aborted_;
};

// fn(rank, channels) on `size` threads over the in-process world split into a data and a
// control channel per rank (transport/channels.h), as the runtime has them.
void RunChannelWorld(int size,
                     const std::function<void(int rank, transport::Channels& channels)>& fn) {
  std::vector<transport::Channels> world = transport::CreateLocalChannels(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r, world[r]); });
  for (std::thread& t : threads) t.join();
}

// One rank's executor and what it runs with.
struct RankParts {
  explicit RankParts(transport::Channels& channels) : stage(compression::StageOptions{}) {
    planes.Add(MemoryKind::kHost, channels.data.get());
    Executor::Parts p;
    p.planes = &planes;
    p.control = channels.control.get();
    p.stage = &stage;
    p.ledger = &ledger;
    p.in_flight = &table;
    executor = std::make_unique<Executor>(p);
  }
  DataPlaneRegistry planes;
  compression::CompressionStage stage;
  StatisticsLedger ledger;
  Table table;
  std::unique_ptr<Executor> executor;
};

CollectiveRequest AllReduceOf(const std::string& name, std::vector<float>& values) {
  CollectiveRequest r;
  r.name = name;
  r.collective = Collective::kAllReduce;
  r.dtype = DataType::kFloat32;
  r.op = ReduceOp::kSum;
  r.shape = {static_cast<int64_t>(values.size())};
  r.input = values.data();
  r.output = values.data();
  return r;
}

TEST(ExecutorTest, AFusedAllReduceBucketSumsEveryTensorAndCompletesItsHandles) {
  RunChannelWorld(3, [](int rank, transport::Channels& comm) {
    RankParts parts(comm);
    std::vector<float> x = {1.0f * rank, 2.0f, 3.0f};
    std::vector<float> y = {10.0f + rank, -1.0f};
    const compression::CompressionMethod* none = &parts.stage.none();
    auto hx = parts.table.Add(AllReduceOf("x", x), none);
    auto hy = parts.table.Add(AllReduceOf("y", y), none);
    Bucket b;
    b.id = 7;
    b.collective = Collective::kAllReduce;
    b.names = {"x", "y"};
    parts.executor->Run(b);
    EXPECT_TRUE(hx->status().ok()) << hx->status();
    EXPECT_TRUE(hy->status().ok()) << hy->status();
    EXPECT_EQ(x, (std::vector<float>{3.0f, 6.0f, 9.0f}));
    EXPECT_EQ(y, (std::vector<float>{33.0f, -3.0f}));
    EXPECT_EQ(parts.table.size(), 0u);
    EXPECT_GT(parts.executor->stats().bytes_sent, 0u);
  });
}

TEST(ExecutorTest, AnErrorBucketFailsEveryNamedHandleAndSendsNothing) {
  RunChannelWorld(2, [](int rank, transport::Channels& comm) {
    RankParts parts(comm);
    std::vector<float> x = {1.0f}, y = {2.0f};
    auto hx = parts.table.Add(AllReduceOf("x", x), &parts.stage.none());
    auto hy = parts.table.Add(AllReduceOf("y", y), &parts.stage.none());
    Bucket b;
    b.names = {"x", "y"};
    b.error = absl::InvalidArgumentError("tensor 'x' failed on rank 1: because");
    parts.executor->Run(b);
    EXPECT_EQ(hx->status(), b.error);
    EXPECT_EQ(hy->status(), b.error);
    EXPECT_EQ(x[0], 1.0f);
    EXPECT_EQ(parts.executor->stats().bytes_sent, 0u);
  });
}

TEST(ExecutorTest, ABucketNamingATensorThisRankNeverSubmittedAbortsTheJob) {
  RunChannelWorld(1, [](int rank, transport::Channels& comm) {
    RankParts parts(comm);
    Bucket b;
    b.names = {"ghost"};
    parts.executor->Run(b);
    EXPECT_EQ(parts.table.aborted(),
              absl::InternalError("rank 0 was told to run 'ghost', which it never submitted"));
  });
}

TEST(ExecutorTest, AJoinedRankTakesPartWithTheIdentity) {
  RunChannelWorld(2, [](int rank, transport::Channels& comm) {
    RankParts parts(comm);
    std::vector<float> x = {5.0f, 6.0f};
    std::shared_ptr<Handle> h;
    if (rank == 0) h = parts.table.Add(AllReduceOf("x", x), &parts.stage.none());
    Bucket b;
    b.collective = Collective::kAllReduce;
    b.names = {"x"};
    b.joined_ranks = {1};
    b.shapes = {{2}};
    b.dtype = DataType::kFloat32;
    b.op = ReduceOp::kSum;
    parts.executor->Run(b);
    EXPECT_TRUE(parts.table.aborted().ok()) << parts.table.aborted();
    if (rank == 0) {
      EXPECT_TRUE(h->status().ok()) << h->status();
      EXPECT_EQ(x, (std::vector<float>{5.0f, 6.0f}));  // rank 1 added zeros
    }
  });
}

TEST(ExecutorTest, AnAllToAllExchangesItsSplitsThenItsRows) {
  RunChannelWorld(2, [](int rank, transport::Channels& comm) {
    RankParts parts(comm);
    // Rank 0 sends 1 row to rank 0 and 2 to rank 1; rank 1 sends 3 rows to 0 and none to 1.
    std::vector<int32_t> in = rank == 0 ? std::vector<int32_t>{0, 1, 2}
                                        : std::vector<int32_t>{10, 11, 12};
    CollectiveRequest r;
    r.name = "a2a";
    r.collective = Collective::kAllToAll;
    r.dtype = DataType::kInt32;
    r.shape = {3};
    r.input = in.data();
    r.splits = rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 0};
    auto h = parts.table.Add(r, nullptr);
    Bucket b;
    b.collective = Collective::kAllToAll;
    b.names = {"a2a"};
    parts.executor->Run(b);
    ASSERT_TRUE(h->status().ok()) << h->status();
    const std::vector<int32_t> want = rank == 0 ? std::vector<int32_t>{0, 10, 11, 12}
                                                : std::vector<int32_t>{1, 2};
    ASSERT_EQ(h->output_shape(), (std::vector<int64_t>{static_cast<int64_t>(want.size())}));
    std::vector<int32_t> got(want.size());
    std::memcpy(got.data(), h->output().data(), got.size() * sizeof(int32_t));
    EXPECT_EQ(got, want);
    // Note [Channels]: the split exchange went over the control channel (one all-to-all of
    // an int64 per peer), the rows over the data plane.
    EXPECT_EQ(comm.control->stats().collectives, 1u);
    EXPECT_EQ(comm.control->stats().bytes_sent, sizeof(int64_t));
    EXPECT_EQ(comm.data->stats().collectives, 1u);
    EXPECT_EQ(comm.data->stats().bytes_sent, (rank == 0 ? 2u : 3u) * sizeof(int32_t));  // to the peer
  });
}

TEST(ExecutorTest, TheFirstDataPlaneTimeoutIsKept) {
  RunChannelWorld(1, [](int rank, transport::Channels& comm) {
    RankParts parts(comm);
    const absl::Status first = absl::DeadlineExceededError("first");
    EXPECT_EQ(parts.executor->FirstTimeout(first), first);
    EXPECT_EQ(parts.executor->FirstTimeout(absl::DeadlineExceededError("second")), first);
  });
}

}  // namespace
}  // namespace braid
