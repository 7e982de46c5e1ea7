// The coordinator's memory stays flat over a long job whose tensors change shape: the real
// braid-coordinator process (127.0.0.1, port 0) driven by a load client speaking the wire
// protocol as a rank does. Tensor "grad" cycles through 64 shapes (every step changes its
// response-cache entry: the old one is evicted and kept as retired until the rank reports it
// applied the eviction) and "bias" keeps one (a cache hit every step, sent as its id). The
// coordinator's resident memory may grow by less than 5 MiB from step 2,000 to step 20,000.
//
// BRAID_MEMORY_TEST_OMIT_APPLIED=1 leaves out the applied sequence (as a client that predates
// it does), to see what the bound saves.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/braid.grpc.pb.h"

extern char** environ;

namespace braid {
namespace {

// braid-coordinator in its own process, its address read from its first line of output;
// stopped with SIGTERM.
class CoordinatorDaemon {
 public:
  CoordinatorDaemon() {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    std::vector<std::string> args = {BRAID_COORDINATOR_PATH, "--port", "0", "--size", "1"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    std::string line;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline && (line.empty() || line.back() != '\n')) {
      pollfd p{out[0], POLLIN, 0};
      if (poll(&p, 1, 100) != 1) continue;
      char c;
      if (read(out[0], &c, 1) != 1) break;
      line.push_back(c);
    }
    close(out[0]);
    const std::string prefix = "braid-coordinator listening on ";
    if (line.rfind(prefix, 0) == 0 && line.back() == '\n') {
      address_ = line.substr(prefix.size(), line.size() - prefix.size() - 1);
    }
  }
  ~CoordinatorDaemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
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

TEST(CoordinatorMemoryTest, StaysFlatWhileATensorCyclesThroughShapes) {
  const bool report_applied = std::getenv("BRAID_MEMORY_TEST_OMIT_APPLIED") == nullptr;
  CoordinatorDaemon daemon;
  ASSERT_FALSE(daemon.address().empty()) << "braid-coordinator did not start";
  auto channel = grpc::CreateChannel(daemon.address(), grpc::InsecureChannelCredentials());
  auto stub = proto::Coordinator::NewStub(channel);

  grpc::ClientContext reg_ctx;
  reg_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  reg_ctx.set_wait_for_ready(true);
  proto::RegisterRequest reg;
  reg.set_rank(0);
  reg.set_size(1);
  reg.set_local_rank(0);
  reg.set_local_size(1);
  reg.set_host("load-client");
  reg.set_pid(getpid());
  proto::RegisterResponse registered;
  ASSERT_TRUE(stub->Register(&reg_ctx, reg, &registered).ok());

  grpc::ClientContext ctx;
  auto stream = stub->Negotiate(&ctx);
  proto::RequestList hello;
  hello.set_rank(0);
  ASSERT_TRUE(stream->Write(hello));

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
    ASSERT_TRUE(stream->Write(out)) << "step " << step;
    size_t answered = 0;
    while (answered < step_requests.size()) {
      proto::ResponseList in;
      ASSERT_TRUE(stream->Read(&in)) << "step " << step;
      ASSERT_TRUE(in.abort_message().empty()) << in.abort_message();
      for (const proto::Response& resp : in.responses()) {
        ASSERT_EQ(resp.type(), proto::Response::OK) << resp.error_message();
        for (int i = 0; i < resp.names_size(); ++i) {
          ++answered;
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
  if (report_applied) EXPECT_LT(growth, 5 * 1024) << "KiB";
  proto::RequestList bye;
  bye.set_rank(0);
  bye.set_shutdown(true);
  stream->Write(bye);
  stream->WritesDone();
  proto::ResponseList rest;
  while (stream->Read(&rest)) {
  }
  stream->Finish();
}

}  // namespace
}  // namespace braid
