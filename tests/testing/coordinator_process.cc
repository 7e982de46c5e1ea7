#include "tests/testing/coordinator_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/server.h"

namespace braid::testing {

CoordinatorProcess::CoordinatorProcess(int world_size) {
  int fds[2];
  if (pipe(fds) != 0) return;
  fflush(stdout);
  fflush(stderr);
  pid_ = fork();
  if (pid_ == 0) {
    close(fds[0]);
    coordinator::ServerOptions o;
    o.world_size = world_size;
    o.register_timeout = absl::Seconds(60);
    auto server = coordinator::StartCoordinator(o);
    int port = server.ok() ? (*server)->port() : 0;
    if (write(fds[1], &port, sizeof(port)) != sizeof(port)) _exit(3);
    close(fds[1]);
    if (!server.ok()) _exit(2);
    (*server)->Wait();
    _exit(0);
  }
  close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  int port = 0;
  if (poll(&p, 1, 30000) == 1 && read(fds[0], &port, sizeof(port)) == sizeof(port) && port > 0) {
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  close(fds[0]);
}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

}  // namespace braid::testing
