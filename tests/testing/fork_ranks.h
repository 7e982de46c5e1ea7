// Runs one function as N real processes (ranks) for multi-process tests and benchmarks.
// The parent forks before anything initialises UCX (UCX state does not survive a fork: fork first, then ucp_init) and
// waits for every child under a deadline, killing the survivors when it passes.
#ifndef BRAID_TESTS_TESTING_FORK_RANKS_H_
#define BRAID_TESTS_TESTING_FORK_RANKS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace braid::testing {

struct RankExit {
  int rank = -1;
  pid_t pid = -1;
  int exit_code = -1;     // WEXITSTATUS, or -1 if killed by a signal
  int signal = 0;         // terminating signal, 0 if exited
  absl::Duration elapsed; // from fork to exit
  bool timed_out = false; // killed by RunRanks at the deadline
};

struct RunRanksOptions {
  int ranks = 1;
  absl::Duration deadline = absl::Seconds(120);
  // Called in the parent after every child started, with their pids (e.g. to kill one).
  std::function<void(const std::vector<pid_t>&)> after_start;
};

// Forks `opts.ranks` children; child r runs body(r) and _exits with its return value.
// Returns one RankExit per rank, in rank order.
std::vector<RankExit> RunRanks(const RunRanksOptions& opts, const std::function<int(int)>& body);

// A fresh, empty directory under $TEST_TMPDIR or /tmp.
std::string MakeTempDir(const std::string& prefix);

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_FORK_RANKS_H_
