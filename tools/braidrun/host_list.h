// Host lists for braidrun's -H flag ("host:slots,host:slots,..."): parsing and validation.
// Pure functions, no I/O: unit-tested in tests/braidrun/braidrun_util_test.cc.
#ifndef BRAID_TOOLS_BRAIDRUN_HOST_LIST_H_
#define BRAID_TOOLS_BRAIDRUN_HOST_LIST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace braid::braidrun {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// Parses "host[:slots],host[:slots],..." (slots default to 1; the last ':' separates them,
// so "::1:2" is host "::1" with 2 slots). Errors (InvalidArgument): an empty list or entry,
// an empty host name, slots that are not a positive integer, a host listed twice.
absl::StatusOr<std::vector<HostSlots>> ParseHostList(const std::string& spec);

// Checks that `hosts` can run `np` ranks on this machine. `local_names` are the names that
// mean this machine (localhost, 127.0.0.1, the hostname, ...). Errors:
//   InvalidArgument: the slots add up to fewer than np.
//   Unimplemented:   a host is not this machine (multi-host launching over ssh is designed
//                    in, but not implemented yet).
absl::Status CheckHostsForLocalLaunch(const std::vector<HostSlots>& hosts, int np,
                                      const std::vector<std::string>& local_names);

// The names that mean this machine: "localhost", "127.0.0.1", "::1", `hostname` and its
// first label (before the first '.'), without duplicates.
std::vector<std::string> LocalHostNames(const std::string& hostname);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_HOST_LIST_H_
