#include "tools/braidrun/watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace braid::braidrun {
namespace {

// Records on the pipe: +group (watch), -group (forget), kGoodbye.
constexpr int64_t kGoodbye = 0;
constexpr int kMaxGroups = 1 << 16;  // braidrun's ranks on this host

void Write2(const char* msg) {
  ssize_t n = write(STDERR_FILENO, msg, strlen(msg));
  (void)n;
}

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// The watchdog process. Async-signal-safe calls only (it was forked from braidrun), no
// allocation: the groups live in a fixed array.
[[noreturn]] void Run(int fd) {
  static pid_t groups[kMaxGroups];
  int count = 0;
  int64_t record = 0;
  bool goodbye = false;
  while (true) {
    ssize_t n = read(fd, &record, sizeof(record));
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(record))) break;  // braidrun is gone
    if (record == kGoodbye) {
      goodbye = true;
      break;
    }
    const pid_t g = static_cast<pid_t>(record > 0 ? record : -record);
    if (record > 0 && count < kMaxGroups) {
      groups[count++] = g;
    } else {
      for (int i = 0; i < count; ++i) {
        if (groups[i] == g) {
          groups[i] = groups[--count];
          break;
        }
      }
    }
  }
  if (goodbye || count == 0) _exit(0);
  Write2("braidrun: the launcher is gone: its watchdog stops the ranks (SIGTERM, then "
         "SIGKILL)\n");
  for (int i = 0; i < count; ++i) kill(-groups[i], SIGTERM);
  const int64_t deadline = NowMs() + absl::ToInt64Milliseconds(Watchdog::kGrace);
  while (NowMs() < deadline) {
    bool alive = false;
    for (int i = 0; i < count; ++i) alive = alive || kill(-groups[i], 0) == 0;
    if (!alive) _exit(0);
    // Waits for a group to go; 50 ms between checks (a signal, not a child, so no event).
    poll(nullptr, 0, 50);
  }
  for (int i = 0; i < count; ++i) kill(-groups[i], SIGKILL);
  _exit(0);
}

}  // namespace

absl::StatusOr<Watchdog> Watchdog::Start() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("watchdog pipe: ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("watchdog fork: ", strerror(errno)));
  }
  if (pid == 0) {
    close(fds[1]);
    // Its own session: a signal to braidrun's process group (Ctrl-C, a harness killing the
    // group) does not reach it. It exits by itself when the pipe closes.
    setsid();
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, STDIN_FILENO);
      dup2(devnull, STDOUT_FILENO);  // stderr stays: it says why it stops the ranks
      if (devnull > STDERR_FILENO) close(devnull);
    }
    // Nothing else braidrun inherited stays open here (a pipe a harness waits on), but the
    // read end of the pipe.
    const unsigned keep = static_cast<unsigned>(fds[0]);
    if (keep > STDERR_FILENO + 1) syscall(SYS_close_range, STDERR_FILENO + 1, keep - 1, 0);
    syscall(SYS_close_range, keep + 1, ~0U, 0);
    Run(fds[0]);
  }
  close(fds[0]);
  return Watchdog(pid, fds[1]);
}

Watchdog::Watchdog(Watchdog&& other) noexcept : pid_(other.pid_), fd_(other.fd_) {
  other.pid_ = -1;
  other.fd_ = -1;
}

Watchdog::~Watchdog() {
  if (fd_ < 0) return;
  Send(kGoodbye);
  close(fd_);
  int status;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void Watchdog::Watch(pid_t group) { Send(group); }
void Watchdog::Forget(pid_t group) { Send(-static_cast<int64_t>(group)); }

void Watchdog::Send(int64_t record) {
  if (fd_ < 0) return;
  // 8 bytes: atomic on a pipe. The watchdog reads as fast as braidrun starts ranks.
  ssize_t n;
  do {
    n = write(fd_, &record, sizeof(record));
  } while (n < 0 && errno == EINTR);
}

}  // namespace braid::braidrun
