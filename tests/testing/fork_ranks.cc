#include "tests/testing/fork_ranks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "absl/time/clock.h"

namespace braid::testing {

std::vector<RankExit> RunRanks(const RunRanksOptions& opts, const std::function<int(int)>& body) {
  std::vector<RankExit> exits(opts.ranks);
  std::vector<pid_t> pids(opts.ranks, -1);
  absl::Time start = absl::Now();
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < opts.ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      code = body(r);
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    pids[r] = pid;
    exits[r].rank = r;
    exits[r].pid = pid;
  }
  if (opts.after_start) opts.after_start(pids);
  int remaining = opts.ranks;
  absl::Time deadline = start + opts.deadline;
  while (remaining > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (auto& e : exits) {
        if (e.pid != pid) continue;
        e.elapsed = absl::Now() - start;
        if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
        --remaining;
      }
      continue;
    }
    if (absl::Now() > deadline) {
      for (auto& e : exits) {
        if (e.exit_code == -1 && e.signal == 0) {
          e.timed_out = true;
          kill(e.pid, SIGKILL);
        }
      }
      deadline = absl::InfiniteFuture();  // reap the killed ones next
    }
    absl::SleepFor(absl::Milliseconds(2));  // waitpid has no timeout; a short nap bounds reaping delay
  }
  return exits;
}

std::string MakeTempDir(const std::string& prefix) {
  const char* base = getenv("TEST_TMPDIR");
  std::string templ = std::string(base ? base : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  return dir ? std::string(dir) : std::string();
}

}  // namespace braid::testing
