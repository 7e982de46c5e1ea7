// Forking the ranks of a one-host benchmark and supervising them, shared by braid-bench and
// braid-compress-bench: one child process per rank (forked before anything touches UCX, which
// does not survive fork), a deadline for the whole run, a short grace after a rank fails so the
// others can notice the lost peer on their own, then SIGKILL for whatever is left.
#ifndef BRAID_TOOLS_BENCH_BENCH_RANKS_H_
#define BRAID_TOOLS_BENCH_BENCH_RANKS_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace braid::bench {

struct RanksOptions {
  int ranks = 0;
  absl::Duration deadline = absl::Minutes(10);  // the whole run; then every rank left is killed
  // How long the others may run on after a rank exits with 2 (an error) before they are killed.
  // Exit code 1 (a wrong result) is a rank that finished normally, so it starts no grace.
  absl::Duration grace_after_failure = absl::Seconds(5);
  std::string prog;  // prefixes the messages on stderr, e.g. "braid-bench"
};

// How one rank ended. exit_code is empty for a rank that was never forked; a rank killed by a
// signal counts as exit code 2.
struct RankEnd {
  std::optional<int> exit_code;
  std::string how;  // "exit code 0", "killed by signal 9 (Killed)", ...
};

struct RanksRun {
  bool fork_failed = false;   // a rank could not be forked; those forked are then killed
  std::vector<RankEnd> ends;  // indexed by rank
};

// Forks opts.ranks children, each running _exit(body(rank)) with the parent's signal mask and
// SIGPIPE ignored, and waits for all of them. stdout and stderr are flushed before the forks so
// nothing buffered is printed twice.
RanksRun RunRanks(const RanksOptions& opts, const std::function<int(int rank)>& body);

// Prints "<prog>: rank R failed: <how><exit1_note>" to stderr for every rank that did not exit 0
// (exit1_note only for exit code 1) and returns the run's exit code: 0, 1 when the worst was a
// wrong result (exit code 1), 2 on an error or a failed fork.
int ReportRanks(const RanksRun& run, const std::string& prog, const char* exit1_note);

// "exit code N", "killed by signal N (name)" or "wait status N", for waitpid()'s status.
std::string DescribeWait(int wstatus);

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_BENCH_RANKS_H_
