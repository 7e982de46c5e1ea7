// Note [Ranks die with braidrun]
// A rank must not outlive its launcher: a braidrun killed with SIGKILL (an out-of-memory kill,
// a scheduler's `kill -9`, a test harness killing its process group) has no chance to stop
// its ranks, and orphaned ranks keep their GPUs, ports and files. PR_SET_PDEATHSIG cannot be
// set through posix_spawn (which braidrun must use: it holds gRPC threads), and it would
// reach only the rank's own process, not what the rank started (`sh -c 'python ...'`).
// So braidrun forks a watchdog before it starts any thread: a small process in a session of
// its own (a signal to braidrun's process group does not reach it) that holds the read end
// of a pipe whose only write end is braidrun's. braidrun tells it the process group of
// every rank it starts (each rank leads its own group) and of every rank it reaps. When
// braidrun ends without saying goodbye, whatever killed it, the pipe reaches end of file:
// the watchdog sends SIGTERM to every group still listed, SIGKILL to what is left after
// kGrace, and exits. On a normal end braidrun says goodbye and the watchdog exits quietly.
#ifndef BRAID_TOOLS_BRAIDRUN_WATCHDOG_H_
#define BRAID_TOOLS_BRAIDRUN_WATCHDOG_H_

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid::braidrun {

class Watchdog {
 public:
  // After SIGTERM, how long the ranks' groups get before SIGKILL.
  static constexpr absl::Duration kGrace = absl::Seconds(2);

  // Forks the watchdog. Call while braidrun has one thread: the child runs only
  // async-signal-safe calls, but a fork must still not copy another thread's held locks.
  static absl::StatusOr<Watchdog> Start();
  Watchdog(Watchdog&& other) noexcept;
  Watchdog& operator=(Watchdog&&) = delete;
  // Says goodbye (the watchdog exits without signalling anything).
  ~Watchdog();

  pid_t pid() const { return pid_; }
  // A rank's process group to stop if braidrun dies.
  void Watch(pid_t group);
  // A rank that was reaped: its group id may be reused, so it is no longer signalled.
  void Forget(pid_t group);

 private:
  Watchdog(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void Send(int64_t record);

  pid_t pid_ = -1;
  int fd_ = -1;  // write end of the pipe; close-on-exec, so no rank inherits it
};

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_WATCHDOG_H_
