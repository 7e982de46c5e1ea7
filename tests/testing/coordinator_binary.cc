#include "tests/testing/coordinator_binary.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"

extern char** environ;

namespace braid::testing {
namespace {

// The first line `fd` gives within `deadline`, newline included (none if it did not end).
std::string ReadLine(int fd, absl::Time deadline) {
  std::string line;
  while (absl::Now() < deadline && (line.empty() || line.back() != '\n')) {
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, std::max(ms, 1)) != 1) continue;
    char c;
    if (read(fd, &c, 1) != 1) break;
    line.push_back(c);
  }
  return line;
}

}  // namespace

CoordinatorBinary::CoordinatorBinary(const std::string& path,
                                     const std::vector<std::string>& flags,
                                     const std::string& secret) {
  setenv("BRAID_JOB_SECRET", secret.c_str(), 1);
  unsetenv("BRAID_JOB_SECRET_FILE");
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  std::vector<std::string> args = {path, "--port", "0"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  const std::string line = ReadLine(out[0], absl::Now() + absl::Seconds(30));
  close(out[0]);
  const std::string prefix = "braid-coordinator listening on ";
  if (line.rfind(prefix, 0) == 0 && line.back() == '\n') {
    address_ = line.substr(prefix.size(), line.size() - prefix.size() - 1);
  }
}

CoordinatorBinary::~CoordinatorBinary() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  waitpid(pid_, nullptr, 0);
}

}  // namespace braid::testing
