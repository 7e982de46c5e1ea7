// Elastic braidrun's hosts (Note [Elastic braidrun] in launcher.h): the host discovery script,
// run periodically, and the blacklist of hosts whose ranks failed.
#ifndef BRAID_TOOLS_BRAIDRUN_DISCOVERY_H_
#define BRAID_TOOLS_BRAIDRUN_DISCOVERY_H_

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/braidrun/host_list.h"

namespace braid::braidrun {

// Runs `script` (through /bin/sh -c, as horovodrun runs its --host-discovery-script) and
// parses its standard output: one `host:slots` (or `host slots=N`, or `host`) per line, as a
// host file; no line at all is no host. Its standard error goes to braidrun's. Errors
// (InvalidArgument or DeadlineExceeded, naming the script): it could not start, exited
// non-zero, printed a bad line, or ran past `timeout` (then it is killed).
absl::StatusOr<std::vector<HostSlots>> RunDiscoveryScript(const std::string& script,
                                                          absl::Duration timeout);

// Runs the script every `interval` on a thread of its own, from construction on. fd() is
// readable (an eventfd) when a run gave a list; Take() returns the latest. A failed run is
// reported on stderr and leaves the previous list in force.
class HostDiscovery {
 public:
  HostDiscovery(std::string script, absl::Duration interval, absl::Duration timeout);
  ~HostDiscovery();
  HostDiscovery(const HostDiscovery&) = delete;
  HostDiscovery& operator=(const HostDiscovery&) = delete;

  int fd() const { return fd_; }
  // The latest list, once per list (nullopt when none arrived since the last call).
  std::optional<std::vector<HostSlots>> Take();

 private:
  void Loop();

  const std::string script_;
  const absl::Duration interval_, timeout_;
  const int fd_;
  // std:: primitives rather than absl's: the wait must wake at once on destruction.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<std::vector<HostSlots>> latest_;
  std::thread thread_;
};

// Hosts whose ranks failed or were lost are not used again before their cool-down ends: the
// first failure blocks a host for `cooldown`, each further one for twice the previous time,
// at most 16 times `cooldown` (a host that keeps failing is tried less and less often).
class Blacklist {
 public:
  explicit Blacklist(absl::Duration cooldown) : cooldown_(cooldown) {}
  // Records a failure on `host` at `now`; returns how long the host is blocked.
  absl::Duration Failed(const std::string& host, absl::Time now);
  bool Blocked(const std::string& host, absl::Time now) const;

 private:
  struct Entry {
    int failures = 0;
    absl::Time until = absl::InfinitePast();
  };
  const absl::Duration cooldown_;
  std::map<std::string, Entry> hosts_;
};

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_DISCOVERY_H_
