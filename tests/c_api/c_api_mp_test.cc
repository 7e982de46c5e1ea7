// Runs the C examples (examples/c) and C test programs as real jobs: a braid-coordinator
// process on 127.0.0.1 port 0 and 2 (or 4) rank processes talking over UCX shared memory,
// each rank exec'ing the binary. Every wait has a deadline; survivors are killed when it
// passes. The test process itself never touches gRPC or UCX, so forking it is safe.
//
// BRAID_COORDINATOR_BIN, BRAID_EXAMPLE_BLOCKING, BRAID_EXAMPLE_ASYNC,
// BRAID_COMPRESSION_STATS_RANK and BRAID_PROCESS_SETS_RANK are the binaries' paths (set by
// CMake / Bazel).
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/secret.h"
#include "gtest/gtest.h"
#include "tests/testing/fork_ranks.h"

namespace {

using braid::testing::RankExit;
using braid::testing::RunRanks;
using braid::testing::RunRanksOptions;

constexpr absl::Duration kStartDeadline = absl::Seconds(30);
constexpr absl::Duration kJobDeadline = absl::Seconds(120);

// braid-coordinator in a child process for the lifetime of this object.
class Coordinator {
 public:
  explicit Coordinator(int world_size) {
    const std::string dir = braid::testing::MakeTempDir("braid_c_api_");
    if (dir.empty()) return;
    const std::string port_file = dir + "/port";
    const std::string size = std::to_string(world_size);
    // The job's secret: the coordinator and the ranks inherit it.
    setenv("BRAID_JOB_SECRET", braid::RandomSecret().c_str(), 1);
    fflush(stdout);
    fflush(stderr);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      execl(BRAID_COORDINATOR_BIN, BRAID_COORDINATOR_BIN, "--bind", "127.0.0.1", "--port", "0",
            "--size", size.c_str(), "--port-file", port_file.c_str(), "--register-timeout",
            "60", static_cast<char*>(nullptr));
      perror("exec " BRAID_COORDINATOR_BIN);
      _exit(127);
    }
    if (pid_ < 0) return;
    // The coordinator renames the port file into place once it listens.
    const absl::Time deadline = absl::Now() + kStartDeadline;
    while (absl::Now() < deadline) {
      std::ifstream f(port_file);
      int port = 0;
      std::string text;
      if (f >> text && absl::SimpleAtoi(text, &port) && port > 0) {
        address_ = absl::StrCat("127.0.0.1:", port);
        break;
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {  // it died
        pid_ = -1;
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));  // no file-change notification worth the code
    }
    unlink(port_file.c_str());
    rmdir(dir.c_str());
  }
  ~Coordinator() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

// Runs `binary` as `ranks` processes; with a coordinator address, as a braid job of that
// size, else each alone (no launcher variables: a world of one).
std::vector<RankExit> RunExample(const char* binary, int ranks, const std::string& coordinator) {
  RunRanksOptions o;
  o.ranks = ranks;
  o.deadline = kJobDeadline;
  return RunRanks(o, [&](int rank) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (const char* v : {"BRAID_COORDINATOR", "BRAID_RANK", "BRAID_SIZE", "BRAID_LOCAL_RANK",
                          "BRAID_LOCAL_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID",
                          "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) {
      unsetenv(v);
    }
    if (!coordinator.empty()) {
      setenv("BRAID_COORDINATOR", coordinator.c_str(), 1);
      setenv("BRAID_RANK", std::to_string(rank).c_str(), 1);
      setenv("BRAID_SIZE", std::to_string(ranks).c_str(), 1);
    }
    setenv("BRAID_TIMEOUT_S", "30", 1);
    setenv("UCX_TLS", "sm,self", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    execl(binary, binary, static_cast<char*>(nullptr));
    perror(binary);
    return 127;
  });
}

void ExpectAllPassed(const std::vector<RankExit>& exits) {
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung: killed after "
                              << absl::FormatDuration(kJobDeadline);
    EXPECT_EQ(e.signal, 0) << "rank " << e.rank << " died of signal " << e.signal;
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank
                              << " failed (1: wrong values, 2: API error; see its stderr)";
  }
}

void RunJob(const char* binary, int ranks) {
  Coordinator coordinator(ranks);
  ASSERT_FALSE(coordinator.address().empty()) << BRAID_COORDINATOR_BIN << " did not start";
  ExpectAllPassed(RunExample(binary, ranks, coordinator.address()));
}

TEST(CApiExamples, AllReduceBlockingTwoRanks) { RunJob(BRAID_EXAMPLE_BLOCKING, 2); }

TEST(CApiExamples, AllReduceAsyncTwoRanks) { RunJob(BRAID_EXAMPLE_ASYNC, 2); }

// braid_compression_stats() on 2 ranks: an fp16 and a "none" all-reduce of N float32
// elements count exactly 2N and 4N payload bytes of 4N uncompressed (the rank program checks
// every field and exits 1 on a mismatch).
TEST(CApiCompressionStats, ExactByteCountsTwoRanks) {
  RunJob(BRAID_COMPRESSION_STATS_RANK, 2);
}

// Process sets through the C API on 4 ranks, {0, 1} and {2, 3} (the rank program checks each
// value exactly and exits 1 on a mismatch): all-reduces in each rank's own set (sum 3 and 7,
// average 1.5 and 3.5), set sizes, ranks and members, INVALID_ARGUMENT naming the set for a
// rank outside it, a removed set failing its pending collective and every later call, its id
// reused by the next set added.
TEST(CApiProcessSets, FourRanksTwoSets) { RunJob(BRAID_PROCESS_SETS_RANK, 4); }

// Without any launcher variable each example is a world of one with a private coordinator.
TEST(CApiExamples, WorldOfOneNeedsNoLauncher) {
  ExpectAllPassed(RunExample(BRAID_EXAMPLE_BLOCKING, 1, ""));
  ExpectAllPassed(RunExample(BRAID_EXAMPLE_ASYNC, 1, ""));
}

}  // namespace
