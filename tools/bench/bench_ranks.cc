#include "tools/bench/bench_ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace braid::bench {

std::string DescribeWait(int wstatus) {
  if (WIFEXITED(wstatus)) return absl::StrCat("exit code ", WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wstatus), " (", strsignal(WTERMSIG(wstatus)),
                        ")");
  }
  return absl::StrCat("wait status ", wstatus);
}

// SIGCHLD is blocked before fork so sigtimedwait() sees every exit without a sleep loop; the
// children restore the mask at once.
RanksRun RunRanks(const RanksOptions& opts, const std::function<int(int rank)>& body) {
  using Clock = std::chrono::steady_clock;
  const char* prog = opts.prog.c_str();

  sigset_t chld, old_mask;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old_mask);

  std::fflush(stdout);
  std::fflush(stderr);
  RanksRun run;
  run.ends.resize(static_cast<size_t>(std::max(opts.ranks, 0)));
  std::vector<pid_t> pids(run.ends.size(), -1);
  int live = 0;
  for (int r = 0; r < opts.ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      // A lost tcp peer must surface as the Communicator's Unavailable, not kill the rank.
      signal(SIGPIPE, SIG_IGN);
      _exit(body(r));
    }
    if (pid < 0) {
      std::fprintf(stderr, "%s: fork for rank %d: %s\n", prog, r, std::strerror(errno));
      run.fork_failed = true;
      break;
    }
    pids[static_cast<size_t>(r)] = pid;
    ++live;
  }

  // After a failure the others get a short grace to fail on their own (the Communicator should
  // notice a lost peer), then they are killed; past the deadline everything is killed.
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(opts.deadline);
  std::optional<Clock::time_point> kill_at;
  if (run.fork_failed) kill_at = Clock::now();
  bool killed = false;
  while (live > 0) {
    int wstatus = 0;
    pid_t pid;
    while (live > 0 && (pid = waitpid(-1, &wstatus, WNOHANG)) > 0) {
      auto it = std::find(pids.begin(), pids.end(), pid);
      if (it == pids.end()) continue;
      RankEnd& end = run.ends[static_cast<size_t>(it - pids.begin())];
      --live;
      end.exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 2;
      end.how = DescribeWait(wstatus);
      if (*end.exit_code == 2 && !kill_at) {
        kill_at = Clock::now() + absl::ToChronoNanoseconds(opts.grace_after_failure);
      }
    }
    if (live == 0) break;
    auto now = Clock::now();
    if (!killed && (now >= deadline || (kill_at && now >= *kill_at))) {
      if (now >= deadline) {
        std::fprintf(stderr, "%s: deadline of %s passed; killing the ranks left\n", prog,
                     absl::FormatDuration(opts.deadline).c_str());
      }
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] > 0 && !run.ends[r].exit_code) kill(pids[r], SIGKILL);
      }
      killed = true;
    }
    // Sleep until a child exits (SIGCHLD), the grace runs out or the deadline passes; once the
    // rest are killed only their reaping is left, so wake once a second until it is done.
    auto wake = killed ? now + std::chrono::seconds(1) : deadline;
    if (kill_at && !killed) wake = std::min(wake, *kill_at);
    auto wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now).count();
    wait_ns = std::max<int64_t>(wait_ns, 1000000);
    timespec ts{static_cast<time_t>(wait_ns / 1000000000), static_cast<long>(wait_ns % 1000000000)};
    sigtimedwait(&chld, nullptr, &ts);
  }
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  return run;
}

int ReportRanks(const RanksRun& run, const std::string& prog, const char* exit1_note) {
  int result = run.fork_failed ? 2 : 0;
  for (size_t r = 0; r < run.ends.size(); ++r) {
    const RankEnd& end = run.ends[r];
    if (!end.exit_code || *end.exit_code == 0) continue;
    std::fprintf(stderr, "%s: rank %zu failed: %s%s\n", prog.c_str(), r, end.how.c_str(),
                 *end.exit_code == 1 ? exit1_note : "");
    result = std::max(result, *end.exit_code == 1 ? 1 : 2);
  }
  return result;
}

}  // namespace braid::bench
