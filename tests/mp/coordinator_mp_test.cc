// The standalone coordinator as users run it: the real braid-coordinator process on
// 127.0.0.1 (port 0), real rank processes running braid::Runtime over UCX, and braidctl.
// One coordinator runs a job of 2 ranks, then a job of 8: each job's status shows its own
// counters only, registration costs one Register RPC per rank and no key-value RPC, the
// coordinator's thread count is the same with 8 ranks as with 2 (streams cost no thread),
// and `braidctl status --once` follows a job to its end. A job's process sets show in its
// status and in braidctl's text.
#include <dirent.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/secret.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/runtime.h"
#include "tests/testing/coordinator_binary.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/raw_client.h"
#include "tests/testing/runtime_job.h"

namespace braid {
namespace {

using braid::testing::AllReduceOf;
using braid::testing::Checker;
using braid::testing::InitRuntime;
using braid::testing::RankExit;
using braid::testing::RunRanks;
using braid::testing::RunRanksOptions;
using braid::testing::SetRankEnv;
using braid::testing::WaitFor;

// Reads from `fd` until `want` bytes arrived or `deadline` passed; the bytes read.
std::string ReadUntil(int fd, size_t want, absl::Time deadline, char stop = '\0') {
  std::string got;
  while (got.size() < want && absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&p, 1, std::max(ms, 1)) != 1) continue;
    char c;
    if (read(fd, &c, 1) != 1) break;
    got.push_back(c);
    if (stop != '\0' && c == stop) break;
  }
  return got;
}

// braid-coordinator as users run it, for any world size; its job secret is exported as
// BRAID_JOB_SECRET into the test's process, which its ranks and braidctl inherit.
class StandaloneCoordinator : public braid::testing::CoordinatorBinary {
 public:
  StandaloneCoordinator() : CoordinatorBinary(BRAID_COORDINATOR_PATH, {}, RandomSecret()) {}
};

// Threads of process `pid` and, in *names, how many have each name (/proc/PID/task/*/comm).
int ThreadCount(pid_t pid, std::map<std::string, int>* names = nullptr) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    ++n;
    if (names == nullptr) continue;
    std::ifstream comm(absl::StrCat("/proc/", pid, "/task/", e->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    ++(*names)[name];
  }
  closedir(d);
  return n;
}

// Note [Counting threads]: gRPC's own threads come from pools sized by the core count, not by
// the number of calls: its executor grows on demand to two threads per core and keeps them;
// its event engine and timer pools add a thread while busy and retire it when idle. So one
// reading can catch a transient thread. The coordinator's count is the fewest threads seen
// over 20 readings, 10 ms apart, after WarmUp filled the executor.
int SteadyThreadCount(pid_t pid) {
  int fewest = -1;
  for (int i = 0; i < 20; ++i) {
    int n = ThreadCount(pid);
    if (fewest < 0 || n < fewest) fewest = n;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return fewest;
}

std::string RunCommand(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// Fills gRPC's executor pool (Note [Counting threads]): bursts of 40 concurrent status calls
// until a burst adds no executor thread.
void WarmUp(const StandaloneCoordinator& coord) {
  const std::string burst = absl::StrCat("for i in $(seq 40); do ", BRAIDCTL_PATH,
                                         " status --coordinator ", coord.address(),
                                         " >/dev/null & done; wait");
  int before = -1;
  for (int i = 0; i < 10; ++i) {
    int rc = -1;
    RunCommand(burst, &rc);
    std::map<std::string, int> names;
    ThreadCount(coord.pid(), &names);
    if (names["default-executo"] == before) return;
    before = names["default-executo"];
  }
}

struct JobSeen {
  int threads = -1;            // the coordinator's, while every rank negotiates
  std::map<std::string, int> thread_names;
  std::string status_json;     // braidctl status --json, meanwhile
  std::string once_json;       // braidctl status --once --json, started meanwhile
  int once_rc = -1;
};

// Runs a job of `size` ranks, each doing `tensors` all-reduces, on the coordinator at
// `address`. While every rank is in the job (registered, stream open, work done) the
// parent looks at the coordinator; then the ranks shut down. With `assigned_ranks` the
// ranks know only the world size (no BRAID_RANK): the coordinator numbers them, and each
// finds its own data-plane address among the peers.
JobSeen RunJobOf(int size, int tensors, const StandaloneCoordinator& coord,
                 bool assigned_ranks = false) {
  int ready[2], go[2];
  EXPECT_EQ(pipe(ready), 0);
  EXPECT_EQ(pipe(go), 0);
  const std::string braidctl =
      absl::StrCat(BRAIDCTL_PATH, " status --json --coordinator ", coord.address());
  JobSeen seen;
  RunRanksOptions o;
  o.ranks = size;
  o.deadline = absl::Seconds(120);
  o.after_start = [&](const std::vector<pid_t>&) {
    // Each rank writes its rank as it knows it: every rank of the world, once.
    std::string got = ReadUntil(ready[0], size, absl::Now() + absl::Seconds(60));
    std::sort(got.begin(), got.end());
    std::string want;
    for (int r = 0; r < size; ++r) want.push_back(static_cast<char>('0' + r));
    EXPECT_EQ(got, want) << "ranks ready";
    seen.threads = SteadyThreadCount(coord.pid());
    ThreadCount(coord.pid(), &seen.thread_names);
    int rc = -1;
    seen.status_json = RunCommand(braidctl, &rc);
    EXPECT_EQ(rc, 0) << seen.status_json;
    // Follows this job to its end: started now, it returns once the ranks have left.
    FILE* once = popen((braidctl + " --once").c_str(), "r");
    std::string go_bytes(size, 'g');
    EXPECT_EQ(write(go[1], go_bytes.data(), go_bytes.size()), static_cast<ssize_t>(size));
    char buf[4096];
    size_t n;
    while (once != nullptr && (n = fread(buf, 1, sizeof(buf), once)) > 0) seen.once_json.append(buf, n);
    int st = once != nullptr ? pclose(once) : -1;
    seen.once_rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  auto exits = RunRanks(o, [&](int rank) {
    SetRankEnv(coord.address(), rank, size);
    if (assigned_ranks) unsetenv("BRAID_RANK");
    Checker c{rank};
    Runtime rt;
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    const int my_rank = *rt.rank();
    std::vector<float> a(16, 1.0f), b(16);
    for (int t = 0; t < tensors; ++t) {
      if (c.Ok(WaitFor(rt.Enqueue(AllReduceOf(absl::StrCat("t", t), a.data(), b.data(), 16,
                                              ReduceOp::kSum))),
               "all-reduce")) {
        c.Expect(b[0] == static_cast<float>(size), absl::StrCat("sum ", b[0]));
      }
    }
    const char me = static_cast<char>('0' + my_rank);
    c.Expect(write(ready[1], &me, 1) == 1, "ready");
    c.Expect(ReadUntil(go[0], 1, absl::Now() + absl::Seconds(60)) == "g", "go");
    c.Ok(rt.Shutdown(), "shutdown");
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " of " << size;
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank << " of " << size;
  }
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
  return seen;
}

TEST(StandaloneCoordinatorTest, TwoJobsInTurnEachShowOnlyTheirOwnCountersAndThreadsStayFlat) {
  StandaloneCoordinator coord;
  ASSERT_FALSE(coord.address().empty()) << "braid-coordinator did not start";

  WarmUp(coord);

  // Job 1: 2 ranks numbered by the coordinator, 3 tensors.
  JobSeen first = RunJobOf(2, 3, coord, /*assigned_ranks=*/true);
  auto s1 = nlohmann::json::parse(first.status_json, nullptr, false);
  ASSERT_TRUE(s1.is_object()) << first.status_json;
  EXPECT_EQ(s1["job_id"], "1");  // int64 fields are strings in proto3 JSON
  EXPECT_EQ(s1["phase"], "JOB_RUNNING");
  EXPECT_EQ(s1["size"], 2);
  EXPECT_EQ(s1["register_rpcs"], "2");
  EXPECT_EQ(s1["kv_rpcs"], "0");
  EXPECT_EQ(s1["tensors_negotiated"], "3");
  EXPECT_EQ(s1["ranks"].size(), 2u);
  EXPECT_EQ(first.once_rc, 0) << first.once_json;
  auto end1 = nlohmann::json::parse(first.once_json, nullptr, false);
  ASSERT_TRUE(end1.is_object()) << first.once_json;
  EXPECT_EQ(end1["job_id"], "1");
  EXPECT_EQ(end1["phase"], "JOB_ENDED");
  EXPECT_EQ(end1["job_state"], "ended");
  EXPECT_EQ(end1["ranks"][1]["state"], "shut down");

  // Between jobs, --once reports the ended job at once.
  int rc = -1;
  std::string between = RunCommand(
      absl::StrCat(BRAIDCTL_PATH, " status --json --once --coordinator ", coord.address()), &rc);
  EXPECT_EQ(rc, 0) << between;
  auto b = nlohmann::json::parse(between, nullptr, false);
  ASSERT_TRUE(b.is_object()) << between;
  EXPECT_EQ(b["job_id"], "1");
  EXPECT_EQ(b["tensors_negotiated"], "3");

  // Job 2 on the same coordinator: 8 ranks, 5 tensors. Nothing of job 1 shows.
  JobSeen second = RunJobOf(8, 5, coord);
  auto s2 = nlohmann::json::parse(second.status_json, nullptr, false);
  ASSERT_TRUE(s2.is_object()) << second.status_json;
  EXPECT_EQ(s2["job_id"], "2");
  EXPECT_EQ(s2["size"], 8);
  EXPECT_EQ(s2["register_rpcs"], "8");  // one Register per rank, the peers inside
  EXPECT_EQ(s2["kv_rpcs"], "0");        // no key-value round trips
  EXPECT_EQ(s2["tensors_negotiated"], "5");
  EXPECT_EQ(s2["bytes_negotiated"], std::to_string(5 * 16 * 4));
  ASSERT_EQ(s2["compression"].size(), 1u) << second.status_json;
  EXPECT_EQ(s2["compression"][0]["tensors"], "5");
  EXPECT_EQ(s2["ranks"].size(), 8u);
  for (const auto& r : s2["ranks"]) EXPECT_EQ(r["state"], "negotiating");
  EXPECT_EQ(second.once_rc, 0) << second.once_json;
  auto end2 = nlohmann::json::parse(second.once_json, nullptr, false);
  ASSERT_TRUE(end2.is_object()) << second.once_json;
  EXPECT_EQ(end2["job_id"], "2");
  EXPECT_EQ(end2["phase"], "JOB_ENDED");
  EXPECT_EQ(end2["register_rpcs"], "8");

  // Streams cost no thread: 8 ranks, as many coordinator threads as with 2.
  auto names = [](const JobSeen& j) {
    std::string out;
    for (const auto& [name, n] : j.thread_names) out += absl::StrCat(name, " x", n, "; ");
    return out;
  };
  EXPECT_GT(first.threads, 0);
  // gRPC's default executor starts threads on demand, whatever the streams (up to twice the
  // cores, gRPC's own rule), so a loaded machine may see one more in either job: it is
  // compared apart, within that bound; every other thread exactly.
  auto pool = [](const JobSeen& j) {
    auto it = j.thread_names.find("default-executo");
    return it == j.thread_names.end() ? 0 : it->second;
  };
  auto others = [&](const JobSeen& j) {
    int n = 0;
    for (const auto& [name, count] : j.thread_names) n += count;
    return n - pool(j);
  };
  EXPECT_EQ(others(second), others(first)) << "2 ranks: " << names(first) << "\n8 ranks: "
                                           << names(second);
  EXPECT_LE(pool(second),
            std::max(pool(first), 2 * static_cast<int>(std::thread::hardware_concurrency())))
      << names(second);
}

// Note [Process sets] (control/process_sets.h): a job's sets in its status and in braidctl's
// text. Three ranks speak the wire protocol as a rank's runtime does (RawClient, in the forked
// children only; nothing runs on a data plane): every rank adds set {0, 1}, which negotiates
// 'x' and then waits for rank 1's 'late' (rank 0 submitted it); the world negotiates 'w'.
// While they wait, braidctl status shows set 1 with its ranks and counts (--json: the Status
// response; text: its row of the PROCESS SET table) and 'late' under ps1/late.
TEST(StandaloneCoordinatorTest, StatusShowsTheJobsProcessSetsAndTheirPendingTensors) {
  StandaloneCoordinator coord;
  ASSERT_FALSE(coord.address().empty()) << "braid-coordinator did not start";
  const int size = 3;
  const std::string secret = getenv("BRAID_JOB_SECRET");
  const std::string braidctl =
      absl::StrCat(BRAIDCTL_PATH, " status --coordinator ", coord.address());
  int rc = -1;
  std::string forming = RunCommand(braidctl, &rc);
  EXPECT_EQ(rc, 0) << forming;
  EXPECT_EQ(forming.find("PROCESS SET"), std::string::npos) << forming;  // a job without sets

  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  std::string json, text;
  int json_rc = -1, text_rc = -1;
  RunRanksOptions o;
  o.ranks = size;
  o.deadline = absl::Seconds(60);
  o.after_start = [&](const std::vector<pid_t>&) {
    EXPECT_EQ(ReadUntil(ready[0], size, absl::Now() + absl::Seconds(30)), std::string(size, 'r'));
    json = RunCommand(braidctl + " --json", &json_rc);
    text = RunCommand(braidctl, &text_rc);
    const std::string go_bytes(size, 'g');
    EXPECT_EQ(write(go[1], go_bytes.data(), go_bytes.size()), static_cast<ssize_t>(size));
  };
  auto exits = RunRanks(o, [&](int rank) {
    Checker c{rank};
    testing::RawClient client(coord.address());
    proto::RegisterRequest reg_req;
    reg_req.set_rank(rank);
    reg_req.set_size(size);
    reg_req.set_host("wire");
    reg_req.set_pid(getpid());
    proto::RegisterResponse reg;
    grpc::Status registered = client.Register(secret, reg_req, &reg, 30);
    if (!c.Expect(registered.ok(), "register: " + registered.error_message())) return 1;
    auto s = client.Negotiate(secret, reg.rank_token());
    proto::RequestList hello;
    hello.set_rank(rank);
    c.Expect(s->stream->Write(hello), "hello");
    // Reads until every response named in `names` came (each rank receives every response).
    auto await = [&](std::set<std::string> names) {
      proto::ResponseList m;
      while (!names.empty() && s->stream->Read(&m)) {
        for (const proto::Response& r : m.responses()) {
          c.Expect(r.type() == proto::Response::OK, "response: " + r.error_message());
          for (const std::string& n : r.names()) names.erase(n);
        }
      }
      return names.empty();
    };
    auto request = [](const std::string& name, int32_t set) {
      proto::Request r;
      r.set_name(name);
      r.set_collective(proto::ALLREDUCE);
      r.set_dtype(proto::FLOAT32);
      r.add_shape(4);
      r.set_compression("none");
      r.set_process_set_id(set);
      return r;
    };
    proto::RequestList add;
    add.set_rank(rank);
    proto::Request* change = add.add_requests();
    change->set_name("process_set.change.0");  // as the runtime names it
    change->set_collective(proto::PROCESS_SET_ADD);
    change->add_process_set_ranks(0);
    change->add_process_set_ranks(1);
    c.Expect(s->stream->Write(add), "add the set");
    if (!c.Expect(await({"process_set.change.0"}), "set added")) return 1;
    proto::RequestList l;
    l.set_rank(rank);
    if (rank < 2) *l.add_requests() = request("ps1/x", 1);
    if (rank == 0) *l.add_requests() = request("ps1/late", 1);
    *l.add_requests() = request("w", 0);
    c.Expect(s->stream->Write(l), "requests");
    c.Expect(await({"ps1/x", "w"}), "x and w negotiated");
    c.Expect(client.Heartbeat(secret, reg.rank_token(), rank).ok(), "heartbeat");
    c.Expect(write(ready[1], "r", 1) == 1, "ready");
    c.Expect(ReadUntil(go[0], 1, absl::Now() + absl::Seconds(30)) == "g", "go");
    proto::RequestList bye;
    bye.set_rank(rank);
    bye.set_shutdown(true);
    s->stream->Write(bye);
    s->stream->WritesDone();
    proto::ResponseList m;
    while (s->stream->Read(&m)) {
    }
    s->stream->Finish();
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank;
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank;
  }
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);

  EXPECT_EQ(json_rc, 0) << json;
  auto st = nlohmann::json::parse(json, nullptr, false);
  ASSERT_TRUE(st.is_object()) << json;
  ASSERT_EQ(st["process_sets"].size(), 1u) << json;  // the world's is not listed
  const auto& set = st["process_sets"][0];
  EXPECT_EQ(set["id"], 1) << json;
  EXPECT_EQ(set["ranks"], nlohmann::json::array({0, 1})) << json;
  EXPECT_EQ(set["tensors_negotiated"], "1") << json;  // int64: a string in proto3 JSON
  EXPECT_EQ(set["tensors_pending"], "1") << json;
  EXPECT_EQ(st["tensors_pending"], "1") << json;
  EXPECT_EQ(text_rc, 0) << text;
  EXPECT_NE(text.find("\nPROCESS SET  RANKS                    NEGOTIATED   PENDING\n"
                      "1            0,1                      1            1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nps1/late "), std::string::npos) << text;
}

}  // namespace
}  // namespace braid
