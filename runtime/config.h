// braid's configuration, parsed once from the environment into a struct (DESIGN.md lists the
// variables). Nothing deeper in the runtime reads the environment.
#ifndef BRAID_RUNTIME_CONFIG_H_
#define BRAID_RUNTIME_CONFIG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid {

// Where this process sits in the job, from the launcher's variables. -1 / 0 = unknown (the
// coordinator assigns it).
struct LaunchInfo {
  int rank = -1;
  int size = 0;
  int local_rank = -1;
  int local_size = 0;
  std::string source;  // "braid", "torchrun", "slurm", "openmpi" or "" (none found)
};

// Looks, in order, at BRAID_RANK/BRAID_SIZE/BRAID_LOCAL_RANK/BRAID_LOCAL_SIZE, torchrun
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NTASKS_PER_NODE), Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
// _LOCAL_SIZE). `getenv` returns nullptr for an unset variable. InvalidArgument names a
// variable that is not an integer or is out of range.
absl::StatusOr<LaunchInfo> LaunchInfoFromEnv(
    const std::function<const char*(const char*)>& getenv);

struct RuntimeConfig {
  LaunchInfo launch;
  std::string coordinator;               // BRAID_COORDINATOR host:port; "" = rank 0 hosts it
  std::string coordinator_host = "127.0.0.1";  // MASTER_ADDR when rank 0 hosts
  int coordinator_port = 29600;          // BRAID_COORDINATOR_PORT
  std::string job_secret;                // BRAID_JOB_SECRET
  int64_t fusion_threshold_bytes = 64 << 20;   // BRAID_FUSION_THRESHOLD
  absl::Duration cycle_time = absl::Milliseconds(1);  // BRAID_CYCLE_TIME_MS
  int cache_capacity = 1024;             // BRAID_CACHE_CAPACITY
  std::string timeline_path;             // BRAID_TIMELINE
  absl::Duration stall_check = absl::Seconds(60);     // BRAID_STALL_CHECK_S
  absl::Duration stall_shutdown = absl::ZeroDuration();  // BRAID_STALL_SHUTDOWN_S (0 = never)
  std::string log_level;                 // BRAID_LOG_LEVEL
  // BRAID_COMPRESSION: the default for floating-point sum/average all-reduces that do not
  // name one (see compression/registry.h); validated, kept in canonical form.
  std::string compression = "none";
  uint64_t seed = 0;                     // BRAID_SEED: stochastic-rounding streams
  bool test_compressors = false;         // BRAID_TEST_COMPRESSORS: enables test-only methods
  absl::Duration timeout = absl::Seconds(60);            // BRAID_TIMEOUT_S
  absl::Duration heartbeat_timeout = absl::Seconds(10);  // BRAID_HEARTBEAT_TIMEOUT_S
  bool ucx_peer_error_handling = false;  // BRAID_UCX_PEER_ERROR_HANDLING
};

// Parses every variable above. InvalidArgument names the variable and the bad value.
absl::StatusOr<RuntimeConfig> ConfigFromEnv(
    const std::function<const char*(const char*)>& getenv);
// Same, from the process environment.
absl::StatusOr<RuntimeConfig> ConfigFromProcessEnv();

}  // namespace braid

#endif  // BRAID_RUNTIME_CONFIG_H_
