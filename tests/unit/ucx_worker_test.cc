// Two-phase creation of the UCX communicator (OpenUcxWorker, then ConnectUcx) in one
// process: what a worker publishes, and how ConnectUcx rejects a peer list that does not fit.
// Connecting real peers is tested with real processes in tests/mp/transport_mp_test.cc.
#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "transport/ucx_communicator.h"

namespace braid::transport {
namespace {

UcxOptions Options(int rank, int size) {
  UcxOptions o;
  o.rank = rank;
  o.size = size;
  return o;
}

TEST(UcxWorkerTest, SelfNamesThisProcessAndAWorkerAddress) {
  auto worker = OpenUcxWorker(Options(0, 1));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const PeerAddress& self = (*worker)->self();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(self.host, host);
  EXPECT_EQ(self.pid, getpid());
  EXPECT_FALSE(self.address.empty());
}

TEST(UcxWorkerTest, OpenRejectsARankOutsideTheWorld) {
  for (auto [rank, size] : {std::pair{2, 2}, std::pair{5, 3}}) {
    auto worker = OpenUcxWorker(Options(rank, size));
    ASSERT_FALSE(worker.ok());
    EXPECT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(worker.status().message(),
              absl::StrCat("invalid rank ", rank, " for world size ", size));
  }
}

// rank < 0 / size < 1: assigned at registration; ConnectUcx learns them from the peer list.
TEST(UcxWorkerTest, AWorkerOpenedBeforeItsRankFindsItselfInThePeers) {
  auto worker = OpenUcxWorker(Options(-1, 0));
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<PeerAddress> peers = {(*worker)->self()};
  auto comm = ConnectUcx(*std::move(worker), peers);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->rank(), 0);
  EXPECT_EQ((*comm)->size(), 1);

  auto stranger = OpenUcxWorker(Options(-1, 0));
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  PeerAddress other = (*stranger)->self();
  other.address += "x";  // nobody's address
  auto refused = ConnectUcx(*std::move(stranger), {other});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "ConnectUcx: no peer holds this worker's own address");
}

TEST(UcxWorkerTest, ConnectOneRankWorldAndReduce) {
  auto worker = OpenUcxWorker(Options(0, 1));
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<PeerAddress> peers = {(*worker)->self()};
  auto comm = ConnectUcx(*std::move(worker), peers);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->rank(), 0);
  EXPECT_EQ((*comm)->size(), 1);
  float in[3] = {1.5f, -2.0f, 3.0f}, out[3] = {0, 0, 0};
  ASSERT_TRUE((*comm)->AllReduce(in, out, 3, DataType::kFloat32, ReduceOp::kAverage).ok());
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 3.0f);
}

TEST(UcxWorkerTest, ConnectRejectsAPeerListOfTheWrongSize) {
  auto worker = OpenUcxWorker(Options(1, 3));
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<PeerAddress> peers = {(*worker)->self(), (*worker)->self()};
  auto comm = ConnectUcx(*std::move(worker), peers);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.status().message(),
            "ConnectUcx needs one PeerAddress per rank: got 2 for world size 3");
}

TEST(UcxWorkerTest, ConnectRejectsAListWhoseOwnEntryIsAnotherWorker) {
  auto worker = OpenUcxWorker(Options(0, 2));
  ASSERT_TRUE(worker.ok()) << worker.status();
  PeerAddress other = (*worker)->self();
  other.address += "x";
  std::vector<PeerAddress> peers = {other, (*worker)->self()};
  auto comm = ConnectUcx(*std::move(worker), peers);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.status().message(),
            "ConnectUcx: peers[0] is not this rank's own worker address");
}

TEST(UcxWorkerTest, ConnectRejectsANullWorker) {
  auto comm = ConnectUcx(nullptr, {});
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UcxWorkerTest, CreateNeedsAStoreForSeveralRanks) {
  auto comm = CreateUcxCommunicator(Options(0, 2));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.status().message(), "UcxOptions.store is required when size > 1");
}

// Note [Pieces across hosts]: a job on several hosts cuts 16 KiB pieces on every rank, one
// host keeps chunk_bytes; an explicit chunk_bytes below the cap, or a cap of 0, is kept.
TEST(UcxWorkerTest, PiecesAreSmallOnlyWhenTheJobSpansHosts) {
  UcxOptions o;
  ASSERT_EQ(o.chunk_bytes, 256u * 1024);
  const std::vector<PeerAddress> one_host = {{"h0", 1, "a"}, {"h0", 2, "b"}, {"h0", 3, "c"}};
  const std::vector<PeerAddress> two_hosts = {{"h0", 1, "a"}, {"h0", 2, "b"}, {"h1", 3, "c"}};
  EXPECT_EQ(PipelineChunkBytes(o, one_host), 256u * 1024);
  EXPECT_EQ(PipelineChunkBytes(o, two_hosts), 16u * 1024);
  EXPECT_EQ(PipelineChunkBytes(o, {{"h0", 1, "a"}}), 256u * 1024);
  o.chunk_bytes = 4096;
  EXPECT_EQ(PipelineChunkBytes(o, two_hosts), 4096u);
  o.chunk_bytes = 1 << 20;
  o.chunk_bytes_across_hosts = 0;
  EXPECT_EQ(PipelineChunkBytes(o, two_hosts), 1u << 20);
}

}  // namespace
}  // namespace braid::transport
