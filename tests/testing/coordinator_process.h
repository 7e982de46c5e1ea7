// A real coordinator in its own process for multi-process tests: forked (before the test
// process touches gRPC or UCX) from the test, listening on 127.0.0.1 port 0.
#ifndef BRAID_TESTS_TESTING_COORDINATOR_PROCESS_H_
#define BRAID_TESTS_TESTING_COORDINATOR_PROCESS_H_

#include <sys/types.h>

#include <string>

namespace braid::testing {

class CoordinatorProcess {
 public:
  // Starts it for a world of `world_size`, with no job settings of its own (the ranks'
  // BRAID_* variables decide them); address() is empty if it failed to start.
  explicit CoordinatorProcess(int world_size);
  ~CoordinatorProcess();  // SIGTERM, then SIGKILL if it lingers
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_COORDINATOR_PROCESS_H_
