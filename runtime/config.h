// braid's configuration: one parser with one grammar for every variable of the table in
// docs/configuration.md, used by the runtime, the C and Python APIs, braidrun, braidctl and
// braid-coordinator. Nothing deeper in the runtime reads the environment.
//
// Note [Configuration grammar]
//   integer  decimal digits with an optional leading '-' and nothing else ("1.0", "1e3",
//            "+5", " 5" and "0x10" are errors), within the variable's range
//   seconds  a decimal number of seconds ("2", "0.5", "1.250"): no sign, exponent, NaN or
//            Inf; a whole number of milliseconds (the resolution braid keeps), at most one
//            year; zero only where the variable says what zero means
//   0/1      "0" or "1"
//   port     an integer in [1, 65535]; [0, 65535] where 0 means "any free port"
//   address  HOST:PORT, [IPV6]:PORT, or unix:PATH
//   spec     a compression spec (compression/registry.h)
// An empty value is the same as an unset variable. A bad value is InvalidArgument naming the
// variable, or the command-line flag that set it, and the value.
#ifndef BRAID_RUNTIME_CONFIG_H_
#define BRAID_RUNTIME_CONFIG_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace braid {

// ---- The grammar's parsers. `what` names the variable or flag in errors. ----

absl::StatusOr<int64_t> ParseInteger(absl::string_view what, absl::string_view text,
                                     int64_t min, int64_t max);
// `zero_allowed`: whether "0" is meaningful for this variable.
absl::StatusOr<absl::Duration> ParseSeconds(absl::string_view what, absl::string_view text,
                                            bool zero_allowed);
absl::StatusOr<bool> ParseZeroOrOne(absl::string_view what, absl::string_view text);
absl::StatusOr<int> ParsePort(absl::string_view what, absl::string_view text, bool zero_allowed);
// Checks HOST:PORT / [IPV6]:PORT / unix:PATH and returns `text` unchanged.
absl::StatusOr<std::string> ParseAddress(absl::string_view what, absl::string_view text);
// A decimal number of MiB (2^20 bytes) as bytes: "2" -> 2097152, "0.5" -> 524288; refused
// when it is not a whole number of bytes ("0.1") or exceeds `max_bytes`.
absl::StatusOr<int64_t> ParseMebibytes(absl::string_view what, absl::string_view text,
                                       int64_t max_bytes);

// ---- Where this process sits in the job ----

// From the launcher's variables. -1 / 0 = unknown (the coordinator assigns it).
struct LaunchInfo {
  int rank = -1;
  int size = 0;
  int local_rank = -1;
  int local_size = 0;
  std::string source;  // "braid", "torchrun", "slurm", "openmpi" or "" (none found)
  // The launcher's own name for this job, where it has one (Note [Job identity] in
  // runtime/job_identity.h): TORCHELASTIC_RUN_ID, SLURM_JOB_ID.SLURM_STEP_ID, Open MPI's
  // job id (OMPI_MCA_ess_base_jobid) or PMIx namespace; "" when none is set.
  std::string job_id;
  // braidrun's number for this process (BRAID_WORKER, RegisterRequest.worker); -1: none.
  int worker = -1;
};

using Getenv = std::function<const char*(const char*)>;

// Looks, in order, at BRAID_RANK/BRAID_SIZE/BRAID_LOCAL_RANK/BRAID_LOCAL_SIZE, torchrun
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NTASKS_PER_NODE), Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
// _LOCAL_SIZE), and the launcher's job id. `getenv` returns nullptr for an unset variable.
// InvalidArgument names a variable that is not an integer or is out of range, or the world
// size missing beside a rank where the launcher always sets both (torchrun's RANK without
// WORLD_SIZE, Open MPI's); ConfigFromEnv also refuses BRAID_RANK without BRAID_SIZE or
// BRAID_COORDINATOR (a standalone coordinator knows the size).
absl::StatusOr<LaunchInfo> LaunchInfoFromEnv(const Getenv& getenv);

// ---- Settings ----

// Note [Job settings]: these must have one value for the whole job, so the coordinator
// decides them once, at registration, and returns them to every rank
// (coordinator/rendezvous.h says how). Here each is present only when its variable is set.
struct JobSettings {
  std::optional<int64_t> fusion_threshold_bytes;    // BRAID_FUSION_THRESHOLD
  std::optional<int> cache_capacity;                // BRAID_CACHE_CAPACITY
  std::optional<absl::Duration> stall_check;        // BRAID_STALL_CHECK_S
  std::optional<absl::Duration> stall_shutdown;     // BRAID_STALL_SHUTDOWN_S
  std::optional<absl::Duration> heartbeat_timeout;  // BRAID_HEARTBEAT_TIMEOUT_S
  std::optional<absl::Duration> negotiation_timeout;  // BRAID_NEGOTIATION_TIMEOUT_S
  std::optional<bool> fast_path;                    // BRAID_FAST_PATH
  // BRAID_GPU_DATA_PLANE: auto (0), nccl (1), host (2) (Note [GPU data planes],
  // runtime/device_planes.h).
  std::optional<int> gpu_data_plane;
  // The data plane's pipeline piece (0: by topology) and window (transport/context.h), and
  // autotuning (Note [Autotuning] in coordinator/autotune.h).
  std::optional<int64_t> ring_chunk_bytes;  // BRAID_RING_CHUNK_BYTES
  std::optional<int> ring_window;           // BRAID_RING_WINDOW
  std::optional<bool> autotune;             // BRAID_AUTOTUNE
};
// Its wire form: ToProto (runtime/config_proto.h).

// Everything else is this process's own: ranks may differ without harm (a rank's cycle time
// only changes when it sends, its timeout how long it waits).
struct RuntimeConfig {
  LaunchInfo launch;
  std::string coordinator;               // BRAID_COORDINATOR host:port; "" = rank 0 hosts it
  // Where rank 0 hosts the coordinator when `coordinator` is empty, and what said so
  // ("MASTER_ADDR", ...: Note [Coordinator address]).
  std::string coordinator_host = "127.0.0.1";
  std::string coordinator_host_from = "the default";
  int coordinator_port = 29600;
  std::string coordinator_port_from = "the default";
  // BRAID_JOB_SECRET, or the contents of BRAID_JOB_SECRET_FILE (mode 0600, checked; trailing
  // whitespace removed); one of them, never both. "" = none given (runtime/job_identity.h).
  std::string job_secret;
  // Where this user's key for derived job secrets lives (Note [Job identity]):
  // $XDG_CONFIG_HOME/braid/user.key, else $HOME/.config/braid/user.key; "" without either.
  std::string user_key_file;
  // TLS (coordinator/credentials.h): the coordinator's PEM certificate and private key (mode
  // 0600) where this process hosts it (BRAID_TLS_CERT, BRAID_TLS_KEY); the PEM certificate(s)
  // a client trusts (BRAID_TLS_CA). Unset: plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  absl::Duration cycle_time = absl::Milliseconds(1);  // BRAID_CYCLE_TIME_MS
  std::string timeline_path;             // BRAID_TIMELINE
  // BRAID_AUTOTUNE_LOG: rank 0 writes a row per measured autotuning candidate (CSV; Note
  // [Settings changes], runtime/step_settings.h); "" = none.
  std::string autotune_log_path;
  // BRAID_TIMELINE_MAX_BYTES: the timeline file rotates beyond this (runtime/timeline.h);
  // 0: no limit.
  int64_t timeline_max_bytes = int64_t{1} << 30;
  // BRAID_COMPRESSION: the default for floating-point sum/average all-reduces that do not
  // name one: a spec (compression/registry.h) or a plan of name patterns to specs (Note
  // [Compression plans], compression/compression_plan.h); validated, kept in canonical form.
  std::string compression = "none";
  uint64_t seed = 0;                     // BRAID_SEED: stochastic-rounding streams
  bool test_compressors = false;         // BRAID_TEST_COMPRESSORS: enables test-only methods
  absl::Duration timeout = absl::Seconds(60);  // BRAID_TIMEOUT_S
  // BRAID_REGISTER_TIMEOUT_S: how long the ranks may take to register (RegistrationTimeout).
  std::optional<absl::Duration> register_timeout;
  // BRAID_ELASTIC (braidrun sets it under --min-np) and BRAID_ELASTIC_TIMEOUT_S: an elastic
  // job's registrations, each a membership change, are bounded by elastic_timeout unless
  // BRAID_REGISTER_TIMEOUT_S is set (Horovod's HOROVOD_ELASTIC_TIMEOUT, 600 s).
  bool elastic = false;
  absl::Duration elastic_timeout = absl::Seconds(600);
  bool ucx_peer_error_handling = false;  // BRAID_UCX_PEER_ERROR_HANDLING
  // BRAID_PIPELINED_COPY: a scattered bucket's copies into and out of the fusion buffer
  // overlap its transfer (Note [Pipelined copy], runtime/allreduce_pipeline.h).
  bool pipelined_copy = true;
  // BRAID_CUDA_UNVERIFIED: use the CUDA device path before its GPU check has passed on a GPU
  // (Note [Unverified CUDA], device/cuda/cuda_device.h).
  bool cuda_unverified = false;
  // BRAID_LOOP_CPU: "auto", "none" or a CPU number (Note [Loop thread affinity],
  // runtime/loop_affinity.h).
  std::string loop_cpu = "auto";
  // BRAID_LAUNCHER_PIPE "FD:INODE", which braidrun sets for the ranks on its host: descriptor
  // FD is the read end of the pipe (of that inode) whose write end braidrun holds (Note
  // [Ranks die with their launcher] in runtime/launcher_watch.h). -1: none.
  int launcher_pipe_fd = -1;
  uint64_t launcher_pipe_inode = 0;
  JobSettings job;                       // proposed to the coordinator at registration
  // ConfigFromProcessEnv's EnvironmentWarnings, for the runtime to print at init.
  std::vector<std::string> environment_warnings;
};

// How long a rank waits for the whole world to register: BRAID_REGISTER_TIMEOUT_S when set
// (braidrun --register-timeout), else BRAID_TIMEOUT_S but at least 60 s (ranks of one job may
// start seconds apart, a Python rank after importing its framework).
// A coordinator hosted by rank 0 or by braidrun fails the waiting registrations at this time
// with an error naming the missing ranks; the rank's own call allows 5 s more, so that error
// is what every waiting rank sees.
absl::Duration RegistrationTimeout(const RuntimeConfig& config);

// What an error calls a variable: the variable itself, or the flag that set it.
using NameOf = std::function<std::string(absl::string_view variable)>;

// Note [Coordinator address]
// Without braidrun (BRAID_COORDINATOR unset), rank 0 hosts the coordinator and every rank
// must find it from what its launcher set, with nothing shared between hosts:
//   host  MASTER_ADDR (torchrun sets it; pass it to mpirun with -x); else, when the job
//         spans several nodes, the first node of SLURM_STEP_NODELIST under Slurm (srun
//         starts task 0 there), or the first address mpirun itself listens on under Open MPI
//         (OMPI_MCA_orte_hnp_uri: rank 0 runs on mpirun's host when that host comes first in
//         -H, Open MPI's default mapping); else 127.0.0.1.
//   port  BRAID_COORDINATOR_PORT; else, when MASTER_PORT is set, DerivedCoordinatorPort of it
//         (torch's own store may listen on MASTER_PORT itself, and two jobs with different
//         MASTER_PORTs must not meet); else 29600.
// Rank 0 binds that host name or address, so it must name one of rank 0's own interfaces.

// The coordinator port for MASTER_PORT `p`: 1024 + (p - 1024 + 16384) mod 64512, a
// one-to-one map of 1024-65535 onto itself that never gives p back (29500 -> 45884). An
// offset rather than p + 1: jobs started side by side often take neighbouring MASTER_PORTs.
int DerivedCoordinatorPort(int master_port);

// The first host of a Slurm node list: "node[003-010,12],gpu1" -> "node003". InvalidArgument
// (naming `what`) on unbalanced brackets or an empty list.
absl::StatusOr<std::string> FirstHostOfNodeList(absl::string_view what, absl::string_view list);

// The first IPv4 address of Open MPI's "JOBID;tcp://ADDR[,ADDR...]:PORT;tcp6://..." URI;
// InvalidArgument (naming `what`) when it has none.
absl::StatusOr<std::string> FirstAddressOfOmpiUri(absl::string_view what, absl::string_view uri);

// Every variable above, launch info included, and the coordinator's address when rank 0
// hosts it (Note [Coordinator address]). InvalidArgument names the variable and value.
absl::StatusOr<RuntimeConfig> ConfigFromEnv(const Getenv& getenv);
// Same, from the process environment, with its EnvironmentWarnings.
absl::StatusOr<RuntimeConfig> ConfigFromProcessEnv();
// The settings only (launch info left unknown), for the tools: braidrun checks its whole
// environment with it before starting a rank, braid-coordinator reads its job settings.
// `name_of` (null: the variable's own name) is what errors call each variable.
absl::StatusOr<RuntimeConfig> SettingsFromEnv(const Getenv& getenv, const NameOf& name_of = {});

// ---- Names that are not braid's ----

// Every BRAID_ variable braid reads: the settings above, the launch variables (BRAID_RANK,
// ...) and the test suite's own.
const std::vector<std::string>& KnownBraidVariables();
// Warnings (never errors) about the variables named `names`: a BRAID_ variable braid does not
// read ("BRAID_COMPRESION is not a braid variable and is ignored: did you mean
// BRAID_COMPRESSION?" when a known name is a few edits away), and a HOROVOD_ variable that
// has a braid equivalent ("HOROVOD_CYCLE_TIME is Horovod's and braid ignores it: set
// BRAID_CYCLE_TIME_MS (milliseconds, as Horovod's) instead"). One per variable, in the
// order of `names`.
// braidrun prints them once for the job; the runtime at init when no braid launcher did
// (runtime/lifecycle.cc).
std::vector<std::string> EnvironmentWarnings(const std::vector<std::string>& names);
// The names of this process's environment variables, sorted.
std::vector<std::string> ProcessEnvironmentNames();

// ---- Command-line flags of braidrun and braid-coordinator: each sets one variable ----

struct SettingFlag {
  const char* flag;      // "--timeout"
  const char* variable;  // "BRAID_TIMEOUT_S"
  const char* help;
  // A flag without a value (--autotune, as Horovod's), which sets its variable to 1.
  bool boolean = false;
};
// Every such flag, in a stable order (the order braidrun sets their variables in).
const std::vector<SettingFlag>& SettingFlags();
// The flag named `flag` ("--timeout"), or null.
const SettingFlag* FindSettingFlag(absl::string_view flag);
// The value of the flag's variable for the flag's text: the same text, except where the
// flag has its own unit (--fusion-threshold-mb is MiB, BRAID_FUSION_THRESHOLD bytes). Checks
// only the unit; SettingsFromEnv checks the value, naming the flag through `name_of`.
absl::StatusOr<std::string> SettingFlagValue(const SettingFlag& flag, absl::string_view text);

}  // namespace braid

#endif  // BRAID_RUNTIME_CONFIG_H_
