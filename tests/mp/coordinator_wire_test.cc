// The real braid-coordinator process (127.0.0.1, port 0) driven by a client speaking the
// wire protocol as a rank does:
//  - its memory stays flat over a long job whose tensors change shape: tensor "grad" cycles
//    through 64 shapes (every step changes its response-cache entry: the old one is evicted
//    and kept as retired until the rank reports it applied the eviction) and "bias" keeps one
//    (a cache hit every step, sent as its id); resident memory may grow by less than 5 MiB
//    from step 2,000 to step 20,000. BRAID_MEMORY_TEST_OMIT_APPLIED=1 leaves out the applied
//    sequence (as a client that predates it does), to see what the bound saves;
//  - malformed requests (sizes that overflow, names and specs over their limits, unknown
//    enum values) are answered with errors naming the field, and a list far above gRPC's
//    default 4 MiB is negotiated: the stream is never closed on the client.
// Every call carries the job secret, and the stream this rank's token (Note [Who may join] in
// coordinator/admission.h), as a rank's client adds them.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/credentials.h"
#include "gtest/gtest.h"
#include "proto/braid.grpc.pb.h"
#include "tests/testing/coordinator_binary.h"

namespace braid {
namespace {

constexpr char kSecret[] = "the-job-secret-of-the-wire-test";

// braid-coordinator for a world of one, with the secret kSecret.
class CoordinatorDaemon : public braid::testing::CoordinatorBinary {
 public:
  CoordinatorDaemon() : CoordinatorBinary(BRAID_COORDINATOR_PATH, {"--size", "1"}, kSecret) {}
};

// Resident memory of `pid` in KiB (VmRSS), or -1.
int64_t RssKiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

proto::Request Allreduce(const std::string& name, std::vector<int64_t> shape) {
  proto::Request r;
  r.set_name(name);
  r.set_collective(proto::ALLREDUCE);
  r.set_dtype(proto::FLOAT32);
  r.set_reduce_op(proto::AVERAGE);
  for (int64_t d : shape) r.add_shape(d);
  return r;
}

// A rank of a world of one over the wire: registered, its stream open.
class WireRank {
 public:
  explicit WireRank(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);  // as the runtime's client (common/limits.h)
    args.SetMaxSendMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = proto::Coordinator::NewStub(channel_);
  }
  ::testing::AssertionResult Start();
  // Sends `out` and reads lists until `want` names were answered: the responses.
  std::vector<proto::Response> Step(const proto::RequestList& out, size_t want,
                                    std::vector<proto::ResponseList>* lists = nullptr);
  void Stop();

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<proto::RequestList, proto::ResponseList>> stream_;
};

::testing::AssertionResult WireRank::Start() {
  grpc::ClientContext reg_ctx;
  reg_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  reg_ctx.set_wait_for_ready(true);
  coordinator::AddCallCredentials(&reg_ctx, kSecret);
  proto::RegisterRequest reg;
  reg.set_rank(0);
  reg.set_size(1);
  reg.set_local_rank(0);
  reg.set_local_size(1);
  reg.set_host("load-client");
  reg.set_pid(getpid());
  proto::RegisterResponse registered;
  grpc::Status st = stub_->Register(&reg_ctx, reg, &registered);
  if (!st.ok()) return ::testing::AssertionFailure() << "Register: " << st.error_message();
  coordinator::AddCallCredentials(&ctx_, kSecret, registered.rank_token());
  stream_ = stub_->Negotiate(&ctx_);
  proto::RequestList hello;
  hello.set_rank(0);
  if (!stream_->Write(hello)) return ::testing::AssertionFailure() << "no stream";
  return ::testing::AssertionSuccess();
}

std::vector<proto::Response> WireRank::Step(const proto::RequestList& out, size_t want,
                                            std::vector<proto::ResponseList>* lists) {
  std::vector<proto::Response> got;
  EXPECT_TRUE(stream_->Write(out));
  size_t answered = 0;
  while (answered < want) {
    proto::ResponseList in;
    if (!stream_->Read(&in)) {
      ADD_FAILURE() << "the coordinator closed the stream";
      break;
    }
    EXPECT_TRUE(in.abort_message().empty()) << in.abort_message();
    for (const proto::Response& r : in.responses()) {
      answered += static_cast<size_t>(r.names_size());
      got.push_back(r);
    }
    if (lists != nullptr) lists->push_back(std::move(in));
  }
  return got;
}

void WireRank::Stop() {
  proto::RequestList bye;
  bye.set_rank(0);
  bye.set_shutdown(true);
  stream_->Write(bye);
  stream_->WritesDone();
  proto::ResponseList rest;
  while (stream_->Read(&rest)) {
  }
  stream_->Finish();
}

TEST(CoordinatorWireTest, MemoryStaysFlatWhileATensorCyclesThroughShapes) {
  const bool report_applied = std::getenv("BRAID_MEMORY_TEST_OMIT_APPLIED") == nullptr;
  CoordinatorDaemon daemon;
  ASSERT_FALSE(daemon.address().empty()) << "braid-coordinator did not start";
  WireRank rank(daemon.address());
  ASSERT_TRUE(rank.Start());

  // This client's mirror of the response cache: name -> (id, request bytes).
  std::map<std::string, std::pair<int32_t, std::string>> cache;
  int64_t applied = 0;
  int64_t rss_at_2000 = -1;
  constexpr int kSteps = 20000;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<proto::Request> step_requests = {
        Allreduce("grad", {step % 64 + 1, 16}), Allreduce("bias", {16})};
    proto::RequestList out;
    out.set_rank(0);
    for (const proto::Request& r : step_requests) {
      auto hit = cache.find(r.name());
      if (hit != cache.end() && hit->second.second == r.SerializeAsString()) {
        out.add_cached_ids(hit->second.first);
      } else {
        *out.add_requests() = r;
      }
    }
    if (report_applied) out.set_applied_sequence(applied);
    std::vector<proto::ResponseList> lists;
    rank.Step(out, step_requests.size(), &lists);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << step;
    for (const proto::ResponseList& in : lists) {
      for (const proto::Response& resp : in.responses()) {
        ASSERT_EQ(resp.type(), proto::Response::OK) << resp.error_message();
        for (int i = 0; i < resp.names_size(); ++i) {
          if (i < resp.cache_ids_size() && resp.cache_ids(i) != 0) {
            for (const proto::Request& r : step_requests) {
              if (r.name() == resp.names(i)) {
                cache[r.name()] = {resp.cache_ids(i), r.SerializeAsString()};
              }
            }
          }
        }
      }
      for (int32_t id : in.evicted_cache_ids()) {
        for (auto it = cache.begin(); it != cache.end(); ++it) {
          if (it->second.first == id) {
            cache.erase(it);
            break;
          }
        }
      }
      applied = std::max(applied, in.sequence());
    }
    if (step == 2000) rss_at_2000 = RssKiB(daemon.pid());
  }
  const int64_t rss_at_end = RssKiB(daemon.pid());
  ASSERT_GT(rss_at_2000, 0);
  const int64_t growth = rss_at_end - rss_at_2000;
  std::printf("coordinator RSS: %lld KiB at step 2000, %lld KiB at step %d: growth %lld KiB%s\n",
              static_cast<long long>(rss_at_2000), static_cast<long long>(rss_at_end), kSteps,
              static_cast<long long>(growth),
              report_applied ? "" : " (applied sequence omitted)");
  if (report_applied) {
    EXPECT_LT(growth, 5 * 1024) << "KiB";
  }
  rank.Stop();
}

// Malformed requests over the wire: each answered with an error naming the field (to this
// rank, which submitted it); a list of 6 MB is negotiated; the stream stays open for a
// valid request after them.
TEST(CoordinatorWireTest, MalformedRequestsAreNamedErrorsAndTheStreamStaysOpen) {
  CoordinatorDaemon daemon;
  ASSERT_FALSE(daemon.address().empty()) << "braid-coordinator did not start";
  WireRank rank(daemon.address());
  ASSERT_TRUE(rank.Start());
  auto with = [](const std::string& name, std::vector<int64_t> shape) {
    return Allreduce(name, std::move(shape));
  };
  proto::Request dtype = with("dtype", {4});
  dtype.set_dtype(static_cast<proto::DataType>(42));
  proto::Request coll = with("coll", {4});
  coll.set_collective(static_cast<proto::Collective>(17));
  proto::Request spec = with("spec", {4});
  spec.set_compression(std::string(300, 's'));
  proto::Request pattern = with("pattern", {4});
  pattern.set_compression_pattern(std::string(300, 'p'));
  const std::vector<std::pair<proto::Request, std::string>> cases = {
      {with("neg", {-1}), "the shape[0] is negative: -1"},
      {with("prod", {int64_t{1} << 40, int64_t{1} << 40}), "the product of the shape overflows"},
      {with("bytes", {int64_t{1} << 47}), "exceed the limit of a tensor, 2^48 bytes"},
      {with("dims", std::vector<int64_t>(65, 1)), "the shape has 65 dimensions"},
      {with(std::string(2000, 'n'), {4}), "the name is 2000 bytes long"},
      {with("", {4}), "the name is empty"},
      {dtype, "unknown dtype 42"},
      {coll, "unknown collective 17"},
      {spec, "the compression spec is 300 bytes long"},
      {pattern, "the compression pattern is 300 bytes long"},
  };
  for (const auto& [request, want] : cases) {
    proto::RequestList out;
    out.set_rank(0);
    *out.add_requests() = request;
    auto got = rank.Step(out, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].type(), proto::Response::ERROR);
    EXPECT_EQ(got[0].error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(got[0].error_message().find(want), std::string::npos) << got[0].error_message();
  }
  // 6,000 requests of 1,000-byte names: a 6 MB list, and as much in answers.
  proto::RequestList big;
  big.set_rank(0);
  for (int i = 0; i < 6000; ++i) {
    *big.add_requests() = with(absl::StrCat(i, std::string(1000 - std::to_string(i).size(), 'x')), {4});
  }
  ASSERT_GT(big.ByteSizeLong(), size_t{5} << 20);  // above gRPC's 4 MiB default
  auto answers = rank.Step(big, 6000);
  size_t ok = 0;
  for (const proto::Response& r : answers) {
    if (r.type() == proto::Response::OK) ok += r.names_size();
  }
  EXPECT_EQ(ok, 6000u);
  proto::RequestList fine;
  fine.set_rank(0);
  *fine.add_requests() = with("fine", {4});
  auto last = rank.Step(fine, 1);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].type(), proto::Response::OK);
  rank.Stop();
}

}  // namespace
}  // namespace braid
