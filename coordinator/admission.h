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
//   - Guessing does not pay: the secret is strong (Note [Secret strength] in
//     common/secret.h), and each peer address may have at most kRefusalsPerSecond calls
//     refused for a wrong secret per second (after a burst of kRefusalBurst): past that, its
//     calls are refused without their secret being compared at all, until the address's
//     budget refills (Note [Refusal budget]).
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
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid::coordinator {

// Note [Refusal budget]
// Each peer address (the caller's IP address, without its port: a guesser opens a connection
// per guess) has a token bucket of kRefusalBurst tokens refilled at kRefusalsPerSecond; a call
// whose secret is wrong spends one. While an address's bucket holds less than one token, its
// calls are refused at once, secret unchecked, so an address learns the answer to at most
// about kRefusalsPerSecond guesses a second (a few more when many arrive in the same instant:
// a call's secret is compared outside the lock), however many connections it opens. Calls
// with the right secret spend nothing: a job's own ranks are never slowed while nobody
// guesses from their address. While someone does, a heartbeat that carries its rank's token
// is still checked (a job keeps running), but other calls from that address (a rank's
// registration, braidctl) are refused until the guessing stops. Addresses past
// kMaxTrackedAddresses (a flood from many addresses) share one bucket, so the table of
// buckets stays bounded; full buckets are dropped from it.
inline constexpr double kRefusalsPerSecond = 10;
inline constexpr double kRefusalBurst = 10;
inline constexpr size_t kMaxTrackedAddresses = 4096;

// The address part of a gRPC peer ("ipv4:127.0.0.1:41234" -> "ipv4:127.0.0.1",
// "ipv6:[::1]:41234" -> "ipv6:[::1]"); a peer without a port is its own address.
std::string PeerAddress(absl::string_view peer);

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
  // `clock`: the time source of the refusal budget; null: absl::Now.
  explicit Admission(std::string job_secret, std::function<absl::Time()> clock = nullptr);

  // OK when `caller` presented the job secret; else PermissionDenied (and the refusal is
  // logged with `rpc` and the caller's address). Also PermissionDenied, secret unchecked,
  // when the caller's address spent its refusal budget (Note [Refusal budget]), unless
  // `holds_rank_token`: the caller proved itself a rank of the job by its token.
  absl::Status Check(const Caller& caller, absl::string_view rpc, bool holds_rank_token = false);
  // Logs a refusal of `rpc` from `caller` for `why` (rate-limited), e.g. a wrong rank token.
  void LogRefusal(const Caller& caller, absl::string_view rpc, absl::string_view why);
  // Calls refused so far.
  int64_t refusals() const;

 private:
  struct Bucket {
    double tokens = kRefusalBurst;
    absl::Time at;  // when `tokens` was counted
  };
  absl::Time Now() const { return clock_ ? clock_() : absl::Now(); }
  // The bucket of `address`, refilled up to now; made when `create` (else null if none).
  Bucket* BucketLocked(const std::string& address, absl::Time now, bool create)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string secret_;
  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);  // by PeerAddress
  absl::Time swept_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // full buckets last dropped
  int64_t refusals_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_ADMISSION_H_
