// Starts the ranks of one job, on this host or over ssh on others, and supervises them:
// prefixed output, signal forwarding, failure propagation, bounded teardown. Used by
// braidrun's main.cc.
#ifndef BRAID_TOOLS_BRAIDRUN_LAUNCHER_H_
#define BRAID_TOOLS_BRAIDRUN_LAUNCHER_H_

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace braid::braidrun {

// One rank: the process braidrun starts for it.
struct RankSpec {
  // argv[0] is looked up in PATH (posix_spawnp). For a remote rank: ssh's argv (SshArgv).
  std::vector<std::string> argv;
  // Its environment ("NAME=value" entries). For a remote rank: ssh's own.
  std::vector<std::string> env;
  // Empty: this host (stdin is /dev/null). Else the host the rank runs on, through ssh,
  // whose stdin is a pipe from braidrun: `stdin_preamble` first, then one control line per
  // signal sent to the rank (Note [Remote ranks] in tools/braidrun/remote.h).
  std::string remote_host;
  std::string stdin_preamble;
};

struct LaunchSpec {
  std::vector<RankSpec> ranks;
  // After a rank fails: SIGTERM to the others, SIGKILL after this long.
  absl::Duration failure_grace = absl::Seconds(3);
  // After SIGINT/SIGTERM/SIGHUP to braidrun: SIGINT to the ranks, SIGKILL after this long.
  absl::Duration interrupt_grace = absl::Seconds(5);
  // After SIGKILL: how long to wait for a rank to be reaped before giving up on it.
  absl::Duration kill_wait = absl::Seconds(5);
  // After every rank exited: how long to wait for their output pipes to reach end of file
  // (a rank's leftover child may hold them open; it is killed first).
  absl::Duration drain_timeout = absl::Seconds(2);
  bool verbose = false;
  // Called with each rank's process group once it started, and once the group is gone
  // (the rank reaped and nothing left in its group): braidrun's watchdog (watchdog.h).
  std::function<void(pid_t)> group_started;
  std::function<void(pid_t)> group_gone;
};

// The signals braidrun handles: they must be blocked in every thread (call before any thread
// starts, gRPC's included) and are read from the signalfd returned by BlockSignals().
// SIGINT and SIGHUP are left alone when braidrun inherited them ignored (nohup, a
// non-interactive shell's background job).
struct SignalSetup {
  int signal_fd = -1;
  sigset_t handled;
};
SignalSetup BlockSignals();

// Runs the job to its end and returns braidrun's exit code: 0 when every rank exited 0;
// else the code of the first rank that failed (128+N when it died of signal N; for a remote
// rank its ssh's code: the rank's status, or 255 when the connection failed or was lost),
// 127/126 when the command cannot be started, 128+N when braidrun itself got signal N.
int RunRanks(const LaunchSpec& spec, const SignalSetup& signals);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_LAUNCHER_H_
