// Starts the ranks of one job, on this host or over ssh on others, and supervises them:
// prefixed output, signal forwarding, failure propagation, bounded teardown. Used by
// braidrun's main.cc.
#ifndef BRAID_TOOLS_BRAIDRUN_LAUNCHER_H_
#define BRAID_TOOLS_BRAIDRUN_LAUNCHER_H_

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tools/braidrun/discovery.h"

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
  // The host as placed (-H, --hostfile, the discovery script): elastic growth counts the
  // ranks per host by it, and the blacklist names it.
  std::string host;
};

// Note [Lost ranks]
// The coordinator declares a rank lost when it falls silent past the heartbeat timeout or its
// connection closes without a goodbye. A rank that died ends the job by its exit (below), but
// one stopped (SIGSTOP), hung in the kernel or cut off from the coordinator never exits, and
// in a job of fixed size (every braidrun job) nothing can go on without it: braidrun waited
// for it for ever. So the coordinator braidrun hosts tells it of each lost rank (posted to a
// LostRanks), and a rank still running LaunchSpec::lost_grace later fails the job as a
// failing rank does: braidrun says why, sends SIGTERM to every rank (with SIGCONT, so a
// stopped one acts on it), SIGKILL failure_grace later, and exits 1. The grace lets a rank
// that died be reaped and reported for what it died of first.
class LostRanks {
 public:
  LostRanks();  // an eventfd; fd() < 0 if none could be made (then nothing is reported)
  ~LostRanks();
  LostRanks(const LostRanks&) = delete;
  LostRanks& operator=(const LostRanks&) = delete;

  // Any thread, at once: `rank` was declared lost for `why`.
  void Post(int rank, const std::string& why);
  // Readable while posts wait to be taken.
  int fd() const { return fd_; }
  // The posts since the last call, in order.
  std::vector<std::pair<int, std::string>> Take();

 private:
  const int fd_;
  absl::Mutex mu_;
  std::vector<std::pair<int, std::string>> posted_ ABSL_GUARDED_BY(mu_);
};

// Note [Elastic braidrun]
// Under --min-np/--max-np braidrun runs an elastic job (Note [Elastic membership] in
// coordinator/service.h): a rank that fails or is declared lost does not end the job while at
// least min_np ranks still run. braidrun kills a rank declared lost at once (SIGKILL to its
// process group; a remote rank's ssh), so that it is gone before the next membership forms,
// and the coordinator sizes that membership by the ranks still running. Below min_np the job
// fails: the survivors' registrations fail with the reason (they exit with it), and braidrun
// sends SIGTERM to whoever still runs failure_grace later, then exits 1. A rank that exits 0
// has finished training; the job's code is 0 once every rank ended, the failed ones aside.
// With --host-discovery-script, braidrun re-runs the script every --discovery-interval and
// starts a rank on each free slot of a listed host (up to --max-np), except on a host whose
// rank failed within its blacklist cool-down; the running ranks learn of the newcomers from
// their heartbeats (HeartbeatResponse.ranks_waiting) and end the membership at their next
// commit (braid.torch.elastic's HostsUpdatedInterrupt), so that the next one takes them in.
// The ranks of a host that leaves the script's output (or is listed with fewer slots) in two
// outputs in a row are drained, the newest first, as long as --min-np ranks stay: they count
// no more, the heartbeats' ranks_leaving ends the membership at the next commit, and their
// registration for the next one is refused (ElasticWorld::Admit gives the reason): they exit
// 0, which does not end the job. A drained rank not refused yet stays after all when a loss
// would leave fewer than --min-np. Once another rank exited 0 the job
// is finishing: it grows no more, no membership forms again (a late registration fails with
// that reason), and a rank that fails then no longer fails the job.
class ElasticWorld {
 public:
  explicit ElasticWorld(int running) : running_(running) {}
  // The next membership's size; once below --min-np, the reason the job fails.
  absl::StatusOr<int> Size() const;
  void SetRunning(int running);
  // Process `worker` (BRAID_WORKER) is drained, for `why`. Stay(worker) undoes that unless
  // its registration was refused already (false then: it is leaving for good).
  void Leave(int worker, const std::string& why);
  bool Stay(int worker);
  bool Leaving(int worker) const;
  // A registration of `worker`: nullopt admits it; else why it leaves (it is refused, and
  // Stay no longer undoes that).
  std::optional<std::string> Admit(int worker);
  void Fail(const std::string& why);

 private:
  mutable absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> leaving_ ABSL_GUARDED_BY(mu_);
  std::set<int> refused_ ABSL_GUARDED_BY(mu_);
  std::string failed_ ABSL_GUARDED_BY(mu_);
};

// Note [Ranks die with their launcher]: each local rank's descriptor kLauncherPipeFd is the
// read end of a pipe whose only write end braidrun holds (runtime/launcher_watch.h).
inline constexpr int kLauncherPipeFd = 3;

struct LaunchSpec {
  std::vector<RankSpec> ranks;
  // Note [Lost ranks]: the coordinator's reports, and how long a lost rank may still run.
  LostRanks* lost_ranks = nullptr;
  absl::Duration lost_grace = absl::Seconds(1);
  // Note [Elastic braidrun]: > 0 makes the job elastic, never below this many ranks; `world`
  // is told how many run (and given the reason when too few do). Lost ranks are posted by
  // braidrun's number for them (BRAID_WORKER), which is the index in `ranks`.
  int min_np = 0;
  ElasticWorld* world = nullptr;
  // Growth (Note [Elastic braidrun]): with `discovery`, a host with more slots than running
  // ranks gets new ones (while fewer than max_np run and the host is not blacklisted), each
  // made by make_rank(worker, host), worker being its index after the ranks above.
  HostDiscovery* discovery = nullptr;
  int max_np = 0;
  std::function<RankSpec(int worker, const std::string& host)> make_rank;
  // A host whose rank failed or was lost is not given new ranks for this long (doubling
  // with each further failure: Blacklist in discovery.h).
  absl::Duration blacklist_cooldown = absl::Seconds(60);
  // The read end of the launcher pipe (Note [Ranks die with their launcher]), dup'ed to
  // kLauncherPipeFd in every local rank; -1: none.
  int launcher_pipe = -1;
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
