// The environment of each rank braidrun starts: the launcher's own environment plus the
// BRAID_* variables that tell the rank who it is, where the coordinator is, and the runtime
// settings given as braidrun flags. Pure function, unit-tested in
// tests/braidrun/braidrun_util_test.cc.
#ifndef BRAID_TOOLS_BRAIDRUN_RANK_ENV_H_
#define BRAID_TOOLS_BRAIDRUN_RANK_ENV_H_

#include <string>
#include <utility>
#include <vector>

namespace braid::braidrun {

// What the launcher tells every rank.
struct JobEnv {
  int world_size = 1;
  std::string coordinator;  // "host:port" -> BRAID_COORDINATOR
  std::string job_secret;   // -> BRAID_JOB_SECRET
  // The variables of the flags that were given (runtime/config.h SettingFlags), as
  // (variable, value) in the order to set them; a flag not given leaves its variable as
  // inherited.
  std::vector<std::pair<std::string, std::string>> settings;
  // Prepended to PYTHONPATH when not empty (the build tree's braid package).
  std::string python_path;
  // UCX_NET_DEVICES for ranks that did not inherit one ("" leaves it unset): "lo" when every
  // rank runs on this host (UCX's tcp would otherwise also use eth0), --network-interface's
  // device across hosts, else unset (UCX picks what reaches each peer).
  std::string ucx_net_devices = "lo";
  // BRAID_LAUNCHER_PIPE, "FD:INODE" (Note [Ranks die with their launcher] in
  // runtime/launcher_watch.h): for ranks on this host; "" empties an inherited one (a rank
  // on another host, or braidrun run by a rank of another braidrun).
  std::string launcher_pipe;
  // Elastic (braidrun --min-np/--max-np): a rank's place changes from one membership to the
  // next, so the coordinator assigns it at each registration: BRAID_RANK, BRAID_SIZE,
  // BRAID_LOCAL_RANK and BRAID_LOCAL_SIZE are set empty (unset) and BRAID_ELASTIC=1.
  bool elastic = false;
};

// Rank r's environment: `base` ("NAME=value" entries, in order) with
//   - set (replacing inherited values): BRAID_COORDINATOR, BRAID_RANK, BRAID_SIZE,
//     BRAID_LOCAL_RANK, BRAID_LOCAL_SIZE, BRAID_JOB_SECRET, PYTHONUNBUFFERED=1, and the
//     variables of the flags that were given; BRAID_WORKER=r (braidrun's number for the
//     process, which stays when an elastic job renumbers its ranks) and, elastic, the
//     JobEnv::elastic variables; BRAID_LAUNCHER_PIPE when given, or when
//     inherited (emptied);
//   - set only when not inherited: OMP_NUM_THREADS=1, UCX_NET_DEVICES (when not empty);
//   - PYTHONPATH=<python_path>[:<inherited PYTHONPATH>] when python_path is not empty and
//     not already one of the inherited entries.
// Inherited entries keep their position (a replaced one keeps its slot); new ones are
// appended in the order listed above. Entries of `base` without '=' are dropped.
std::vector<std::string> BuildRankEnv(const std::vector<std::string>& base, const JobEnv& job,
                                      int rank, int local_rank, int local_size);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_RANK_ENV_H_
