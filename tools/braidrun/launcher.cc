#include "tools/braidrun/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/braidrun/line_prefixer.h"
#include "tools/braidrun/remote.h"

namespace braid::braidrun {
namespace {

// Writes all of `data` to fd; false when the reader is gone (EPIPE, EBADF, ...). Copes with a
// non-blocking descriptor inherited from the shell.
bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
      continue;
    }
    return false;
  }
  return true;
}

void Say(const std::string& msg) {
  std::string line = absl::StrCat("braidrun: ", msg, "\n");
  WriteAll(STDERR_FILENO, line.data(), line.size());
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

// "exited with code 7" / "was killed by signal 9 (SIGKILL)"
std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        SignalName(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended with status ", status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool Failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

// One output pipe of a rank.
struct Stream {
  int fd = -1;       // read end (ours), -1 once at end of file
  int target = -1;   // STDOUT_FILENO or STDERR_FILENO
  LinePrefixer prefixer;
  Stream(int rank, int target_fd) : target(target_fd), prefixer(RankPrefix(rank)) {}
};

struct Rank {
  int index = 0;
  const RankSpec* spec = nullptr;
  pid_t pid = -1;  // also its process group: each rank (or its ssh) leads its own group
  bool running = false;
  int status = 0;
  int control = -1;  // remote ranks: the write end of ssh's stdin (Note [Remote ranks])
  // Note [Lost ranks]: when the coordinator's declaration stops being news, and why it came.
  std::optional<absl::Time> lost_deadline;
  std::string lost_why;
  bool lost_ended = false;
  // Elastic: drained (its host left the discovery output): no longer counted as a member.
  bool leaving = false;
  bool kept = false;  // its host left the output, but it stays for --min-np (said once)
  Stream out, err;
  Rank(int r, const RankSpec* s)
      : index(r), spec(s), out(r, STDOUT_FILENO), err(r, STDERR_FILENO) {}
  // Elastic (Note [Elastic braidrun]): its rank changes with each membership, so braidrun
  // names it by its BRAID_WORKER, "worker 3".
  bool elastic = false;
  bool remote() const { return !spec->remote_host.empty(); }
  // "rank 3" or "rank 3 (on node7)", for messages.
  std::string Name() const {
    const char* what = elastic ? "worker " : "rank ";
    return remote() ? absl::StrCat(what, index, " (on ", spec->remote_host, ")")
                    : absl::StrCat(what, index);
  }
};

// How a rank ended, for braidrun's report. A remote rank's status is its ssh's: the remote
// script exits with the rank's code (128+N for a death by signal N), ssh with 255 when the
// connection failed or broke.
std::string DescribeRankStatus(const Rank& r) {
  const int status = r.status;
  if (!r.remote()) return absl::StrCat(r.Name(), " ", DescribeStatus(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat(r.Name(), ": its ssh ", DescribeStatus(status));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 255) {
    return absl::StrCat(r.Name(), ": lost host ", r.spec->remote_host,
                        ": ssh exited with code 255 (the connection failed or broke; a rank "
                        "that exits with 255 looks the same)");
  }
  if (code > 128 && code < 128 + NSIG) {
    return absl::StrCat(r.Name(), " exited with code ", code, " (128+", code - 128, ": ",
                        SignalName(code - 128), ")");
  }
  return absl::StrCat(r.Name(), " ", DescribeStatus(status));
}

class Supervisor {
 public:
  Supervisor(const LaunchSpec& spec, const SignalSetup& signals)
      : spec_(spec), signals_(signals), blacklist_(spec.blacklist_cooldown) {
    for (size_t r = 0; r < spec.ranks.size(); ++r) {
      ranks_.emplace_back(static_cast<int>(r), &spec.ranks[r]);
      ranks_.back().elastic = spec.min_np > 0;
    }
  }

  int Run() {
    for (Rank& rank : ranks_) {
      if (!Spawn(rank)) break;
    }
    Loop();
    for (Rank& rank : ranks_) {
      CloseStream(rank.out);
      CloseStream(rank.err);
      CloseControl(rank);
    }
    return exit_code_;
  }

 private:
  bool Spawn(Rank& rank) {
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0) return SpawnFailed(rank, errno, "pipe2");
    if (pipe2(err, O_CLOEXEC) != 0 || (rank.remote() && pipe2(in, O_CLOEXEC) != 0)) {
      int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) {
        if (fd >= 0) close(fd);
      }
      return SpawnFailed(rank, e, "pipe2");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (rank.remote()) {
      posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    }
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
    // Nothing but stdio (and a local rank's launcher pipe, Note [Ranks die with their
    // launcher]) reaches a rank: not the coordinator's sockets, not the other ranks' pipes,
    // not descriptors braidrun inherited (like Python's subprocess close_fds=True).
    int first_closed = STDERR_FILENO + 1;
    if (!rank.remote() && spec_.launcher_pipe >= 0) {
      posix_spawn_file_actions_adddup2(&fa, spec_.launcher_pipe, kLauncherPipeFd);
      first_closed = kLauncherPipeFd + 1;
    }
    posix_spawn_file_actions_addclosefrom_np(&fa, first_closed);

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t empty, defaults = signals_.handled;
    sigemptyset(&empty);
    sigaddset(&defaults, SIGPIPE);  // braidrun ignores SIGPIPE; ranks must not inherit that
    // Nor an ignored SIGINT (braidrun started in the background by a non-interactive shell):
    // braidrun stops its ranks with SIGINT first, and a rank that inherited it ignored could
    // not act on it (a shell cannot even trap it) and was SIGKILLed after the grace period.
    // A rank leads its own process group, so the only SIGINT it gets is braidrun's.
    sigaddset(&defaults, SIGINT);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    // Its own process group, so that a signal reaches the rank and everything it started
    // (`sh -c '...; sleep 60'`), and a terminal's Ctrl-C reaches braidrun only (braidrun
    // forwards it once).
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                        POSIX_SPAWN_SETPGROUP);

    std::vector<char*> argv;
    for (const std::string& a : rank.spec->argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const std::string& e : rank.spec->env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    pid_t pid = -1;
    int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(out[1]);
    close(err[1]);
    if (in[0] >= 0) close(in[0]);
    if (rc != 0) {
      close(out[0]);
      close(err[0]);
      if (in[1] >= 0) close(in[1]);
      return SpawnFailed(rank, rc, absl::StrCat("cannot start '", rank.spec->argv[0], "'"));
    }
    if (in[1] >= 0) {
      // The preamble is small (a pipe holds 64 KiB); control lines follow later.
      rank.control = in[1];
      fcntl(rank.control, F_SETFL, fcntl(rank.control, F_GETFL) | O_NONBLOCK);
      if (!WriteAll(rank.control, rank.spec->stdin_preamble.data(),
                    rank.spec->stdin_preamble.size())) {
        CloseControl(rank);
      }
    }
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
    rank.pid = pid;
    rank.running = true;
    if (spec_.group_started) spec_.group_started(pid);  // the rank leads its own group
    rank.out.fd = out[0];
    rank.err.fd = err[0];
    if (spec_.verbose) Say(absl::StrCat(rank.Name(), " started, pid ", pid));
    return true;
  }

  void CloseControl(Rank& rank) {
    if (rank.control < 0) return;
    close(rank.control);
    rank.control = -1;
  }

  // The job cannot start: the ranks already running are stopped like after a rank failure.
  bool SpawnFailed(Rank& rank, int err, const std::string& what) {
    Say(absl::StrCat("rank ", rank.index, ": ", what, ": ", std::strerror(err)));
    if (!exit_code_) {
      exit_code_ = (err == ENOENT) ? 127 : 126;
      Escalate(SIGTERM, spec_.failure_grace, "the job could not start");
    }
    return false;
  }

  int LiveCount() const {
    return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(),
                                          [](const Rank& r) { return r.running; }));
  }

  // Signals the process group of every running rank. A remote rank gets the signal as a
  // control line; SIGKILL also kills its ssh, which ends the remote side too (end of file on
  // the remote script's stdin kills the rank's group).
  void SignalAll(int sig) {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      if (!r.remote() || sig == SIGKILL) kill(-r.pid, sig);
      // A stopped rank acts on SIGTERM or SIGINT only once continued (as shells do for
      // stopped jobs); SIGCONT is harmless to a running one.
      if (!r.remote() && sig != SIGKILL) kill(-r.pid, SIGCONT);
      if (r.remote() && r.control >= 0) {
        const std::string line = RemoteSignalLine(sig);
        if (!WriteAll(r.control, line.data(), line.size())) CloseControl(r);
      }
    }
  }

  // Sends `sig` to the running ranks and arms the SIGKILL deadline `grace` from now.
  void Escalate(int sig, absl::Duration grace, const std::string& why) {
    int live = LiveCount();
    if (live > 0) {
      Say(absl::StrCat(why, ": sending ", SignalName(sig), " to ", live, " rank",
                       live == 1 ? "" : "s", " (SIGKILL in ", absl::FormatDuration(grace), ")"));
      SignalAll(sig);
    }
    absl::Time deadline = absl::Now() + grace;
    if (!kill_deadline_ || deadline < *kill_deadline_) kill_deadline_ = deadline;
  }

  void Reap() {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      pid_t p = waitpid(r.pid, &status, WNOHANG);
      if (p == 0) continue;
      if (p < 0 && errno == EINTR) continue;
      r.running = false;
      r.status = (p == r.pid) ? status : (1 << 8);  // ECHILD: cannot happen; count as failure
      CloseControl(r);
      // Its group number can be reused once nothing is left in it.
      if (spec_.group_gone && kill(-r.pid, 0) != 0 && errno == ESRCH) spec_.group_gone(r.pid);
      OnExit(r);
    }
  }

  void OnExit(Rank& r) {
    const bool failed = Failed(r.status);
    if (elastic() && !exit_code_) return OnElasticExit(r, failed);
    if (failed && !exit_code_) {
      // The first failure is the job's: report it and stop the others.
      exit_code_ = ExitCodeOf(r.status);
      Say(DescribeRankStatus(r));
      Escalate(SIGTERM, spec_.failure_grace, absl::StrCat("rank ", r.index, " failed"));
    } else if (spec_.verbose) {
      Say(absl::StrCat(DescribeRankStatus(r), " (pid ", r.pid, ")"));
    }
  }

  // ---- Note [Elastic braidrun] ----
  bool elastic() const { return spec_.min_np > 0 && spec_.world != nullptr; }

  // A rank that counts for the next membership: running, not declared lost, not leaving.
  static bool IsMember(const Rank& r) { return r.running && !r.lost_deadline && !r.leaving; }
  int Members() const {
    return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), IsMember));
  }

  void OnElasticExit(Rank& r, bool failed) {
    spec_.world->SetRunning(Members());
    if (r.leaving && !r.lost_deadline) {
      // Drained: it is no longer a member, whatever its exit (its host may be going away).
      Say(failed ? DescribeRankStatus(r) : absl::StrCat(r.Name(), " left the job"));
      return;
    }
    if (!failed && !r.lost_deadline) {
      if (!finishing_) {
        // Training is over: no slot gets a new rank, and no membership forms again (a rank
        // started for one that never came fails its init() with this, not trains alone).
        finishing_ = true;
        spec_.world->Fail(absl::StrCat("the elastic job is finishing: ", r.Name(),
                                       " completed (exit code 0); no membership forms again"));
      }
      if (spec_.verbose) Say(absl::StrCat(DescribeRankStatus(r), " (pid ", r.pid, ")"));
      return;
    }
    if (r.lost_deadline) {
      Say(absl::StrCat(r.Name(), " was declared lost (", r.lost_why, ") and ended"));
    } else {
      Say(DescribeRankStatus(r));
    }
    if (!r.lost_deadline) BlacklistHost(r);  // a lost one's host was, when it was declared
    // Once finishing, the ranks that completed decide the job's outcome.
    if (!finishing_) CheckMinNp(absl::StrCat(r.Name(), " ended"));
  }

  // Starts a rank on every free slot of the discovered hosts, up to max_np.
  void Grow() {
    if (spec_.discovery == nullptr) return;
    // Taken whatever happens next: its descriptor stays readable until then.
    if (auto latest = spec_.discovery->Take()) {
      hosts_ = *std::move(latest);
      DrainRemovedHosts();
    }
    if (!elastic() || exit_code_ || finishing_ || !spec_.make_rank) return;
    const absl::Time now = absl::Now();
    for (const HostSlots& h : hosts_) {
      if (blacklist_.Blocked(h.host, now)) continue;
      int on_host = static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [&](auto& r) {
        return r.running && !r.lost_deadline && r.spec->host == h.host;
      }));
      for (; on_host < h.slots && Members() < spec_.max_np; ++on_host) {
        const int worker = static_cast<int>(ranks_.size());
        grown_specs_.push_back(spec_.make_rank(worker, h.host));
        grown_specs_.back().host = h.host;
        Rank& r = ranks_.emplace_back(worker, &grown_specs_.back());
        r.elastic = true;
        Say(absl::StrCat("elastic job: starting worker ", worker, " on ", h.host,
                         " (a free slot)"));
        if (!Spawn(r)) return;
        spec_.world->SetRunning(Members());
      }
    }
  }

  // Horovod's host removal (Note [Elastic membership]): a host the script lists with fewer
  // slots than its ranks, or not at all, in two outputs in a row (one odd output drains
  // nothing) has its newest ranks drained down to its slots. They leave the job at the next
  // commit, as long as --min-np ranks stay.
  void DrainRemovedHosts() {
    if (!elastic() || exit_code_ || finishing_) return;
    std::map<std::string, int> members, slots, short_lists;  // per host
    for (const Rank& r : ranks_) {
      if (IsMember(r) && !r.spec->host.empty()) ++members[r.spec->host];
    }
    for (const HostSlots& h : hosts_) slots.emplace(h.host, h.slots);  // the first line counts
    for (const auto& [host, n] : members) {
      if (slots[host] < n) short_lists[host] = short_lists_[host] + 1;
    }
    short_lists_ = short_lists;  // a host with enough slots again starts afresh
    for (auto it = ranks_.rbegin(); it != ranks_.rend(); ++it) {  // the newest first
      Rank& r = *it;
      if (!IsMember(r) || r.spec->host.empty()) continue;
      const std::string& host = r.spec->host;
      if (short_lists[host] < 2 || members[host] <= slots[host]) {
        if (short_lists[host] == 0) r.kept = false;
        continue;
      }
      const std::string why =
          slots[host] == 0 ? absl::StrCat("host ", host, " is no longer in the discovery output")
                           : absl::StrCat("host ", host, " has ", slots[host],
                                          " slots in the discovery output, fewer than its ranks");
      if (Members() - 1 < spec_.min_np) {
        if (!r.kept) {
          Say(absl::StrCat("elastic job: ", why, ", but ", r.Name(), " stays: fewer than "
                           "--min-np ", spec_.min_np, " ranks would run without it"));
        }
        r.kept = true;
        continue;
      }
      --members[host];
      r.leaving = true;
      spec_.world->Leave(r.index, absl::StrCat(r.Name(), " is drained: ", why));
      spec_.world->SetRunning(Members());
      Say(absl::StrCat("elastic job: ", why, ": ", r.Name(), " leaves the job at the next "
                       "commit"));
    }
  }

  // A drained rank whose re-join was not refused yet stays after all when the job would
  // otherwise go below --min-np (it lost a rank meanwhile).
  void KeepDrainedRanks() {
    for (Rank& r : ranks_) {
      if (Members() >= spec_.min_np) return;
      if (!r.running || r.lost_deadline || !r.leaving || !spec_.world->Stay(r.index)) continue;
      r.leaving = false;
      r.kept = true;
      spec_.world->SetRunning(Members());
      Say(absl::StrCat("elastic job: ", r.Name(), " stays after all: fewer than --min-np ",
                       spec_.min_np, " ranks would run without it"));
    }
  }

  // Below --min-np the job fails: the survivors' registrations fail with the reason, and
  // whoever still runs gets SIGTERM failure_grace later.
  void CheckMinNp(const std::string& what) {
    KeepDrainedRanks();
    const int left = Members();
    if (left >= spec_.min_np) {
      if (left > 0) {
        Say(absl::StrCat("elastic job: ", what, "; ", left, left == 1 ? " rank goes" : " ranks go",
                         " on (--min-np ", spec_.min_np, ")"));
      }
      return;
    }
    const std::string why = absl::StrCat(what, ": ", left, " rank", left == 1 ? "" : "s",
                                         " left, fewer than --min-np ", spec_.min_np);
    exit_code_ = 1;
    Say(absl::StrCat("the elastic job fails: ", why));
    spec_.world->Fail(absl::StrCat("braidrun: the elastic job fails: ", why));
    term_deadline_ = absl::Now() + spec_.failure_grace;
  }

  // Elastic: a rank declared lost is killed at once, before the next membership forms, and
  // its host blacklisted then, before growth could give its slot a new rank.
  void EndLostMember(Rank& r, std::string why) {
    r.lost_deadline = absl::Now();
    r.lost_ended = true;
    r.lost_why = std::move(why);
    kill(-r.pid, SIGKILL);  // a remote rank's ssh: its end kills the remote side
    spec_.world->SetRunning(Members());
    KeepDrainedRanks();  // before the survivors' registrations ask
    Say(absl::StrCat("the coordinator declared ", r.Name(), " lost (", r.lost_why,
                     "): sending it SIGKILL"));
    BlacklistHost(r);
  }

  void BlacklistHost(const Rank& r) {
    if (spec_.discovery == nullptr || r.spec->host.empty()) return;
    const absl::Duration blocked = blacklist_.Failed(r.spec->host, absl::Now());
    Say(absl::StrCat("host ", r.spec->host, " is blacklisted for ",
                     absl::FormatDuration(blocked)));
  }

  // Note [Lost ranks]: the coordinator's declarations, each given lost_grace to be news.
  void TakeLost() {
    for (auto& [rank, why] : spec_.lost_ranks->Take()) {
      if (rank < 0 || rank >= static_cast<int>(ranks_.size())) continue;
      Rank& r = ranks_[rank];
      if (!r.running || r.lost_deadline) continue;
      if (elastic() && !exit_code_) {
        EndLostMember(r, std::move(why));
        continue;
      }
      r.lost_deadline = absl::Now() + spec_.lost_grace;
      r.lost_why = std::move(why);
    }
  }

  // A lost rank that still runs after its grace fails the job (unless it already failed).
  void EndLostRanks(absl::Time now) {
    for (Rank& r : ranks_) {
      if (!r.running || !r.lost_deadline || now < *r.lost_deadline || r.lost_ended) continue;
      r.lost_ended = true;
      if (exit_code_) continue;  // the job is ending already, with its own cause
      exit_code_ = 1;
      Say(absl::StrCat("the coordinator declared ", r.Name(), " lost (", r.lost_why,
                       "), and it still runs ", absl::FormatDuration(spec_.lost_grace),
                       " later (stopped or hung?)"));
      Escalate(SIGTERM, spec_.failure_grace, absl::StrCat("rank ", r.index, " was lost"));
    }
  }

  std::optional<absl::Time> NextLostDeadline() const {
    std::optional<absl::Time> next;
    for (const Rank& r : ranks_) {
      if (r.running && r.lost_deadline && !r.lost_ended && (!next || *r.lost_deadline < *next)) {
        next = r.lost_deadline;
      }
    }
    return next;
  }

  void OnSignal(int sig) {
    if (sig == SIGCHLD) return;  // Reap() runs every iteration
    if (!user_signal_) {
      user_signal_ = sig;
      if (!exit_code_) exit_code_ = 128 + sig;
      Escalate(SIGINT, spec_.interrupt_grace, absl::StrCat("received ", SignalName(sig)));
      return;
    }
    // A second signal: no more patience.
    int live = LiveCount();
    if (live > 0) {
      Say(absl::StrCat("received ", SignalName(sig), " again: sending SIGKILL to ", live,
                       " rank", live == 1 ? "" : "s"));
    }
    KillAll();
  }

  void KillAll() {
    SignalAll(SIGKILL);
    if (!killed_at_) killed_at_ = absl::Now();
    kill_deadline_.reset();
  }

  void ReadSignals() {
    signalfd_siginfo info;
    while (true) {
      ssize_t n = read(signals_.signal_fd, &info, sizeof(info));
      if (n != static_cast<ssize_t>(sizeof(info))) {
        if (n < 0 && errno == EINTR) continue;
        return;
      }
      OnSignal(static_cast<int>(info.ssi_signo));
    }
  }

  void Emit(Stream& s, const std::string& text) {
    if (text.empty()) return;
    bool& ok = s.target == STDOUT_FILENO ? stdout_ok_ : stderr_ok_;
    if (ok) ok = WriteAll(s.target, text.data(), text.size());
  }

  // Reads what the pipe holds; at end of file flushes the partial line and closes it.
  void Drain(Stream& s) {
    char buf[65536];
    std::string text;
    while (s.fd >= 0) {
      ssize_t n = read(s.fd, buf, sizeof(buf));
      if (n > 0) {
        s.prefixer.Feed(buf, static_cast<size_t>(n), &text);
        Emit(s, text);
        text.clear();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      CloseStream(s);  // end of file or error
    }
  }

  void CloseStream(Stream& s) {
    if (s.fd < 0) return;
    std::string text;
    s.prefixer.Flush(&text);
    Emit(s, text);
    close(s.fd);
    s.fd = -1;
  }

  void Loop() {
    std::optional<absl::Time> drain_deadline;
    while (true) {
      Reap();
      Grow();
      const absl::Time now = absl::Now();
      EndLostRanks(now);
      if (term_deadline_ && now >= *term_deadline_) {
        term_deadline_.reset();
        Escalate(SIGTERM, spec_.failure_grace, "the elastic job failed");
      }
      if (kill_deadline_ && now >= *kill_deadline_ && LiveCount() > 0) {
        Say(absl::StrCat("sending SIGKILL to ", LiveCount(), " rank",
                         LiveCount() == 1 ? "" : "s", " still running"));
        KillAll();
      }
      if (killed_at_ && now >= *killed_at_ + spec_.kill_wait && LiveCount() > 0) {
        for (const Rank& r : ranks_) {
          if (r.running) {
            Say(absl::StrCat(r.Name(), " (pid ", r.pid,
                             ") did not exit after SIGKILL; giving up on it"));
          }
        }
        if (!exit_code_) exit_code_ = 1;
        return;
      }
      if (LiveCount() == 0 && !drain_deadline) {
        // Whatever a rank left behind in its process group goes too: it would otherwise
        // hold the output pipes open (and outlive the job).
        for (const Rank& r : ranks_) {
          if (r.pid > 0) kill(-r.pid, SIGKILL);
        }
        drain_deadline = now + spec_.drain_timeout;
      }

      std::vector<pollfd> fds;
      std::vector<Stream*> streams;
      fds.push_back({signals_.signal_fd, POLLIN, 0});
      const int lost_fd = spec_.lost_ranks != nullptr ? spec_.lost_ranks->fd() : -1;
      fds.push_back({lost_fd, POLLIN, 0});  // a negative fd is ignored by poll
      const int discovery_fd = spec_.discovery != nullptr ? spec_.discovery->fd() : -1;
      fds.push_back({discovery_fd, POLLIN, 0});  // read by Grow()
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      if (drain_deadline && (streams.empty() || now >= *drain_deadline)) return;

      std::optional<absl::Time> wake;
      for (const auto& t :
           {kill_deadline_, drain_deadline, NextLostDeadline(), term_deadline_}) {
        if (t && (!wake || *t < *wake)) wake = *t;
      }
      if (killed_at_) {
        absl::Time t = *killed_at_ + spec_.kill_wait;
        if (!wake || t < *wake) wake = t;
      }
      // SIGCHLD wakes us; the periodic tick is only a safety net.
      int timeout_ms = 1000;
      if (wake) {
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            absl::ToInt64Milliseconds(*wake - now) + 1, 0, 1000));
      }
      int n = poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        Say(absl::StrCat("poll: ", std::strerror(errno)));
        KillAll();
        if (!exit_code_) exit_code_ = 1;
        continue;
      }
      if (fds[0].revents != 0) ReadSignals();
      if (fds[1].revents != 0) TakeLost();
      for (size_t i = 3; i < fds.size(); ++i) {
        if (fds[i].revents != 0) Drain(*streams[i - 3]);
      }
    }
  }

  const LaunchSpec& spec_;
  const SignalSetup& signals_;
  // A deque: growth appends ranks while references to the others are held.
  std::deque<Rank> ranks_;
  std::deque<RankSpec> grown_specs_;  // the specs of ranks added by growth
  std::vector<HostSlots> hosts_;      // the discovery script's latest list
  // Host -> how many outputs in a row listed it with fewer slots than its ranks.
  std::map<std::string, int> short_lists_;
  Blacklist blacklist_;
  bool finishing_ = false;  // elastic: a rank exited 0, so the job grows no more
  int exit_code_ = 0;  // 0 until the job's outcome is decided
  int user_signal_ = 0;
  std::optional<absl::Time> kill_deadline_;
  std::optional<absl::Time> term_deadline_;  // elastic, below --min-np: SIGTERM then
  std::optional<absl::Time> killed_at_;
  bool stdout_ok_ = true;
  bool stderr_ok_ = true;
};

}  // namespace

LostRanks::LostRanks() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

LostRanks::~LostRanks() {
  if (fd_ >= 0) close(fd_);
}

void LostRanks::Post(int rank, const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    posted_.emplace_back(rank, why);
  }
  const uint64_t one = 1;
  if (fd_ >= 0) (void)!write(fd_, &one, sizeof(one));
}

std::vector<std::pair<int, std::string>> LostRanks::Take() {
  uint64_t count;
  if (fd_ >= 0) (void)!read(fd_, &count, sizeof(count));  // resets it: posts come under mu_
  absl::MutexLock lock(&mu_);
  return std::exchange(posted_, {});
}

absl::StatusOr<int> ElasticWorld::Size() const {
  absl::MutexLock lock(&mu_);
  if (!failed_.empty()) return absl::FailedPreconditionError(failed_);
  return running_;
}

void ElasticWorld::SetRunning(int running) {
  absl::MutexLock lock(&mu_);
  running_ = running;
}

void ElasticWorld::Leave(int worker, const std::string& why) {
  absl::MutexLock lock(&mu_);
  leaving_[worker] = why;
}

bool ElasticWorld::Stay(int worker) {
  absl::MutexLock lock(&mu_);
  if (refused_.count(worker) > 0) return false;
  leaving_.erase(worker);
  return true;
}

bool ElasticWorld::Leaving(int worker) const {
  absl::MutexLock lock(&mu_);
  return leaving_.count(worker) > 0;
}

std::optional<std::string> ElasticWorld::Admit(int worker) {
  absl::MutexLock lock(&mu_);
  auto it = leaving_.find(worker);
  if (it == leaving_.end()) return std::nullopt;
  refused_.insert(worker);
  return it->second;
}

void ElasticWorld::Fail(const std::string& why) {
  absl::MutexLock lock(&mu_);
  failed_ = why;
}

SignalSetup BlockSignals() {
  SignalSetup s;
  sigemptyset(&s.handled);
  sigaddset(&s.handled, SIGTERM);
  sigaddset(&s.handled, SIGCHLD);
  for (int sig : {SIGINT, SIGHUP}) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&s.handled, sig);
  }
  // Ranks are supervised through pipes: a closed stdout must not kill braidrun.
  signal(SIGPIPE, SIG_IGN);
  pthread_sigmask(SIG_BLOCK, &s.handled, nullptr);
  s.signal_fd = signalfd(-1, &s.handled, SFD_NONBLOCK | SFD_CLOEXEC);
  return s;
}

int RunRanks(const LaunchSpec& spec, const SignalSetup& signals) {
  if (spec.ranks.empty()) return 2;
  for (const RankSpec& r : spec.ranks) {
    if (r.argv.empty()) return 2;
  }
  Supervisor sup(spec, signals);
  return sup.Run();
}

}  // namespace braid::braidrun
