// Which job a rank belongs to: the secret it presents to the coordinator.
//
// Note [Job identity]
// A job's ranks prove they belong to it with the job secret (Note [Who may join] in
// coordinator/admission.h), wherever the secret comes from:
//   1. BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE, when set (braidrun sets the first for its
//      ranks: a random secret per job, or the one it was given);
//   2. a process alone (no launcher, world of one): a random secret for its private
//      coordinator;
//   3. else, under torchrun-, Slurm- or mpirun-style variables with rank 0 hosting the
//      coordinator: derived by every rank alike, HMAC-SHA256(user key, job identity). The
//      user key is 32 random bytes in $XDG_CONFIG_HOME/braid/user.key (else
//      ~/.config/braid/user.key), made with mode 0600 by the first rank that needs it, so
//      other users can neither read it nor compute the secret; the job identity is what the
//      launcher says of the job: its job id where it has one (LaunchInfo::job_id) and the
//      coordinator's host and port; not the world size, which the coordinator checks at
//      registration (ranks that disagree on it fail naming both sizes). Every rank on a host (or on hosts
//      that share the home directory) derives the same secret; across hosts without a shared
//      home, set BRAID_JOB_SECRET on every rank.
// Two jobs pointed at the same coordinator port never mix: a second job's rank 0 cannot bind
// the port (SO_REUSEPORT is off) and fails at once naming it; a second job's other ranks
// reach the first job's coordinator and are refused, at once, either for a wrong secret
// (another user, another launcher job id) or because that coordinator's one job is already
// running (coordinator/service.h: single_job), or, when it is still forming, because the
// world sizes disagree (which fails that job too). Only two jobs of one user with the same
// identity (same launcher variables, no launcher job id) that register at the very same time
// cannot be told apart: give each job its own BRAID_JOB_SECRET, or its own port.
#ifndef BRAID_RUNTIME_JOB_IDENTITY_H_
#define BRAID_RUNTIME_JOB_IDENTITY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/config.h"

namespace braid {

struct JobSecret {
  std::string secret;
  // Where it came from, for errors: "BRAID_JOB_SECRET(_FILE)", "random", "derived from
  // KEYFILE and the job identity (launcher torchrun, launcher job id none, coordinator host
  // '127.0.0.1' from MASTER_ADDR, port 45884 from MASTER_PORT)".
  std::string origin;
};

// The job identity of rule 3 (Note [Job identity]): launcher, its job id, the coordinator's
// host and port.
std::string JobIdentity(const RuntimeConfig& config, const LaunchInfo& launch);

// The secret this rank presents (Note [Job identity]); `alone`: a process with no launcher and
// no peers. InvalidArgument when BRAID_COORDINATOR names a coordinator but no secret was
// given (an outside coordinator's secret cannot be derived), or when the user key cannot be
// made or read (no HOME, a key file readable by others).
absl::StatusOr<JobSecret> ResolveJobSecret(const RuntimeConfig& config, const LaunchInfo& launch,
                                           bool alone);

// `s` with a hint of where the secret came from when the coordinator refused it.
absl::Status ExplainRefusedSecret(const absl::Status& s, const JobSecret& secret);

}  // namespace braid

#endif  // BRAID_RUNTIME_JOB_IDENTITY_H_
