// Host lists for braidrun's -H flag ("host:slots,host:slots,...") and --hostfile, and the
// placement of ranks on them. Pure functions, no I/O: unit-tested in
// tests/braidrun/braidrun_util_test.cc.
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

// Parses a host file as horovodrun and mpirun read it: one host per line, as `host`,
// `host slots=N` or `host:N`; `#` starts a comment; blank lines are skipped. `source` (the
// file's name) prefixes errors, which name the line: InvalidArgument for a bad line, a host
// listed twice, or a file without hosts.
absl::StatusOr<std::vector<HostSlots>> ParseHostfile(const std::string& text,
                                                     const std::string& source);

// Where one rank runs.
struct RankPlacement {
  std::string host;
  int host_index = 0;  // position of `host` in the list
  int local_rank = 0;  // among the ranks of this job on `host`
  int local_size = 0;  // ranks of this job on `host`
};

// Places `np` ranks on `hosts` in order, filling each host's slots before the next (as
// horovodrun and mpirun --map-by slot do): rank r's entry. Hosts left without a rank get
// none. InvalidArgument when the slots add up to fewer than np.
absl::StatusOr<std::vector<RankPlacement>> PlaceRanks(const std::vector<HostSlots>& hosts,
                                                      int np);

// The names that mean this machine: "localhost", "127.0.0.1", "::1", `hostname` and its
// first label (before the first '.'), without duplicates.
std::vector<std::string> LocalHostNames(const std::string& hostname);

// Whether `host` is one of `local_names` (case-insensitively): its ranks start directly,
// the others' over ssh.
bool IsLocalHost(const std::string& host, const std::vector<std::string>& local_names);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_HOST_LIST_H_
