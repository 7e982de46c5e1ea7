// Who may call the coordinator: the job secret every call must carry, and the log of the
// calls refused. No gRPC types (the server reads the call's metadata into a Caller).
//
// Note [Who may join]
// Threat model: processes of the job's user on the job's hosts are trusted (they could
// ptrace the ranks anyway). Other users on those hosts, and other hosts on the network, must
// not be able to join a job, end it, stall it, read its status, or alter any byte of its
// results; and a second job, however launched, must never mix with the first. So:
//   - Every RPC (Register, KeyValueSet/Get, Negotiate, Heartbeat, Status, Shutdown) carries
//     the job secret in its metadata; the coordinator compares it in constant time
//     (SecretsEqual) before the call touches any state, and refuses it with
//     PermissionDenied otherwise, logging the caller's address (at most once a second, with
//     a count of the refusals not logged, so a flood of refusals cannot flood the log).
//   - Register returns a per-rank token, fresh for each job; a Negotiate stream and a
//     Heartbeat must carry the token of the rank they speak for. A holder of the secret can
//     therefore not open a stream as another rank, stall the job and have that rank blamed,
//     or keep a stopped rank alive with heartbeats; and a stream or heartbeat of an earlier
//     job's rank never touches the next job (its token is not the new job's).
//   - The key-value store is per job and bounded (key count, key and value size).
//   - Data-plane addresses go only to callers that hold the secret (RegisterResponse, the
//     key-value store); the data plane's tags carry bits keyed by the secret
//     (transport/, Note [Tag layout]).
//   - The secret never appears on a command line (environment, or a file of mode 0600), and
//     between hosts the calls can travel over TLS (server.h), which also keeps the secret
//     from the network's eavesdroppers.
#ifndef BRAID_COORDINATOR_ADMISSION_H_
#define BRAID_COORDINATOR_ADMISSION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid::coordinator {

// Metadata keys of the secret and the rank token on every call (proto/braid.proto).
inline constexpr char kJobSecretMetadata[] = "braid-job-secret";
inline constexpr char kRankTokenMetadata[] = "braid-rank-token";

// Who made a call, as the gRPC layer read it from the call.
struct Caller {
  std::string peer;        // the caller's address ("ipv4:127.0.0.1:41234"), for the log
  std::string job_secret;  // presented in the metadata; "" when absent
  std::string rank_token;  // presented in the metadata; "" when absent
};

class Admission {
 public:
  // `job_secret` empty: every call is refused (a coordinator never runs without a secret).
  explicit Admission(std::string job_secret);

  // OK when `caller` presented the job secret; else PermissionDenied (and the refusal is
  // logged with `rpc` and the caller's address).
  absl::Status Check(const Caller& caller, absl::string_view rpc);
  // Logs a refusal of `rpc` from `caller` for `why` (rate-limited), e.g. a wrong rank token.
  void LogRefusal(const Caller& caller, absl::string_view rpc, absl::string_view why);
  // Calls refused so far.
  int64_t refusals() const;

 private:
  const std::string secret_;
  mutable absl::Mutex mu_;
  int64_t refusals_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_ADMISSION_H_
