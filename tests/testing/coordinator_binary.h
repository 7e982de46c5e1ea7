// The braid-coordinator binary in its own process, for tests that exercise it as users run
// it (its flags, its wire protocol, braidctl against it): spawned with the given flags and
// "--port 0", its address read from its first line of output ("braid-coordinator listening
// on 127.0.0.1:PORT"), stopped with SIGTERM. Unlike CoordinatorProcess (a coordinator forked
// from the test's own code), this runs the installed program's main.
#ifndef BRAID_TESTS_TESTING_COORDINATOR_BINARY_H_
#define BRAID_TESTS_TESTING_COORDINATOR_BINARY_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace braid::testing {

class CoordinatorBinary {
 public:
  // Starts `path` with `flags` (after "--port 0") and job secret `secret`, which it exports
  // as BRAID_JOB_SECRET into this (the test's) process first, so the ranks and tools the test
  // starts afterwards inherit it (BRAID_JOB_SECRET_FILE is unset). address() is empty when it
  // did not print its address within 30 s.
  CoordinatorBinary(const std::string& path, const std::vector<std::string>& flags,
                    const std::string& secret);
  ~CoordinatorBinary();  // SIGTERM, then waits for it
  CoordinatorBinary(const CoordinatorBinary&) = delete;
  CoordinatorBinary& operator=(const CoordinatorBinary&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_COORDINATOR_BINARY_H_
