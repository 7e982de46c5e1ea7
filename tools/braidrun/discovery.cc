#include "tools/braidrun/discovery.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace braid::braidrun {
namespace {

// Reads `fd` to its end or until `deadline`; false on the deadline.
bool ReadUntil(int fd, absl::Time deadline, std::string* out) {
  char buf[4096];
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return true;
    out->append(buf, static_cast<size_t>(r));
  }
}

}  // namespace

absl::StatusOr<std::vector<HostSlots>> RunDiscoveryScript(const std::string& script,
                                                          absl::Duration timeout) {
  const std::string what = absl::StrCat("--host-discovery-script '", script, "'");
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat(what, ": pipe2: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  // braidrun's threads block the signals it reads from its signalfd: not the script's.
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: a timeout kills what it started
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot start: ", std::strerror(rc)));
  }
  std::string text;
  const bool in_time = ReadUntil(out[0], absl::Now() + timeout, &text);
  close(out[0]);
  if (!in_time) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!in_time) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " ran longer than ", absl::FormatDuration(timeout), ": killed"));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, WIFEXITED(status) ? absl::StrCat(" exited with code ", WEXITSTATUS(status))
                                : std::string(" was killed by a signal")));
  }
  bool any = false;
  for (char c : text) any = any || !absl::ascii_isspace(static_cast<unsigned char>(c));
  if (!any) return std::vector<HostSlots>{};
  return ParseHostfile(text, what);
}

HostDiscovery::HostDiscovery(std::string script, absl::Duration interval,
                             absl::Duration timeout)
    : script_(std::move(script)),
      interval_(interval),
      timeout_(timeout),
      fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      thread_([this] { Loop(); }) {}

HostDiscovery::~HostDiscovery() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // a running script ends within its timeout
  if (fd_ >= 0) close(fd_);
}

std::optional<std::vector<HostSlots>> HostDiscovery::Take() {
  uint64_t count;
  if (fd_ >= 0) (void)!read(fd_, &count, sizeof(count));
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(latest_, std::nullopt);
}

void HostDiscovery::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait = std::chrono::milliseconds(absl::ToInt64Milliseconds(interval_));
      if (cv_.wait_for(lock, wait, [this] { return stop_; })) return;
    }
    auto hosts = RunDiscoveryScript(script_, timeout_);
    if (!hosts.ok()) {
      const std::string line = absl::StrCat("braidrun: ", hosts.status().message(),
                                            " (the previous host list stays)\n");
      (void)!write(STDERR_FILENO, line.data(), line.size());
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      latest_ = *std::move(hosts);
    }
    const uint64_t one = 1;
    if (fd_ >= 0) (void)!write(fd_, &one, sizeof(one));
  }
}

absl::Duration Blacklist::Failed(const std::string& host, absl::Time now) {
  Entry& e = hosts_[host];
  e.failures = std::min(e.failures + 1, 5);  // 1, 2, 4, 8, 16 times the cool-down
  const absl::Duration blocked = cooldown_ * (1 << (e.failures - 1));
  e.until = now + blocked;
  return blocked;
}

bool Blacklist::Blocked(const std::string& host, absl::Time now) const {
  auto it = hosts_.find(host);
  return it != hosts_.end() && now < it->second.until;
}

}  // namespace braid::braidrun
