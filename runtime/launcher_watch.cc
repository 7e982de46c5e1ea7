#include "runtime/launcher_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace braid {
namespace {

// Waits for the launcher's end of the pipe to close, then ends this process group.
void Watch(int fd, int rank) {
  // Signals are the program's to take, and a write to a stderr nobody reads any more must
  // fail (EPIPE) rather than raise SIGPIPE on this thread.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  pollfd p{fd, 0, 0};  // no events: a pipe's read end reports POLLHUP regardless
  while (true) {
    const int n = poll(&p, 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (p.revents & (POLLERR | POLLNVAL)) != 0) return;
    if ((p.revents & POLLHUP) != 0) break;
  }
  const std::string msg = absl::StrCat(
      "braid: rank ", rank, ": its launcher (braidrun) is gone: ending the rank's process group "
      "(SIGTERM, then SIGKILL after ", absl::FormatDuration(kLauncherGrace), ")\n");
  (void)!write(STDERR_FILENO, msg.data(), msg.size());
  kill(0, SIGTERM);
  absl::SleepFor(kLauncherGrace);  // this process may have handled SIGTERM and lived
  kill(0, SIGKILL);
}

}  // namespace

absl::Status WatchLauncher(int fd, uint64_t inode, int rank) {
  static std::once_flag once;
  absl::Status result;
  std::call_once(once, [&] {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) ||
        static_cast<uint64_t>(st.st_ino) != inode) {
      result = absl::FailedPreconditionError(absl::StrCat(
          "BRAID_LAUNCHER_PIPE: descriptor ", fd, " is not the launcher's pipe (inode ", inode,
          "): this process is not one braidrun started, so it does not end with braidrun"));
      return;
    }
    // Private and close-on-exec: the program may close or reuse `fd`, and exec'd children
    // keep `fd` (their own braid watches it) but not this one.
    const int own = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    if (own < 0) {
      result = absl::InternalError(
          absl::StrCat("BRAID_LAUNCHER_PIPE: dup: ", std::strerror(errno)));
      return;
    }
    std::thread(Watch, own, rank).detach();
  });
  return result;
}

}  // namespace braid
