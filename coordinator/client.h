// The gRPC implementation of braid::CoordinatorClient.
#ifndef BRAID_COORDINATOR_CLIENT_H_
#define BRAID_COORDINATOR_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/coordinator_client.h"

namespace braid::coordinator {

struct ClientOptions {
  std::string address;  // host:port
  // Presented on every call (Note [Who may join] in admission.h).
  std::string job_secret;
  // TLS: the PEM certificate(s) to trust for the coordinator; "" = plaintext.
  std::string tls_ca_file;
  absl::Duration connect_timeout = absl::Seconds(60);
  // Polled while waiting to connect (every 100 ms): true ends the wait with Cancelled (a
  // Ctrl-C in init()). Null: wait until connect_timeout.
  std::function<bool()> cancelled;
  // Appended to the Unavailable error when the coordinator cannot be reached: what the
  // caller knows about where the address came from (e.g. MASTER_ADDR and MASTER_PORT).
  std::string unreachable_hint;
  // gRPC shares one connection among the channels of a process that name the same address;
  // true gives this client a connection of its own (a load generator simulating many ranks
  // in one process, each as its own connection, as separate processes would be).
  bool dedicated_connection = false;
  // Ask for every response's report_age_us (RequestList.report_ages): for a timeline.
  bool report_ages = false;
  // Until registration returns the job's heartbeat timeout T; then HeartbeatInterval(T).
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // Adds what this rank reports to the coordinator (its per-method compression totals) to
  // each heartbeat; the client sets the rank itself. Called from the heartbeat thread every
  // heartbeat_interval once negotiation started, and once more from Close() just before the
  // goodbye, so the coordinator keeps the rank's final totals. Must be thread-safe and
  // cheap (it runs on every heartbeat); null: plain heartbeats.
  std::function<void(proto::HeartbeatRequest*)> fill_heartbeat;
  // Told each heartbeat's answer (its ranks_waiting), from the heartbeat thread; may be null.
  std::function<void(const proto::HeartbeatResponse&)> on_heartbeat_response;
};

// How often a rank beats for a job whose heartbeat timeout is `heartbeat_timeout`: four
// beats per timeout, at most ten a second.
absl::Duration HeartbeatInterval(absl::Duration heartbeat_timeout);

// Connects (retrying until connect_timeout, so ranks may start before the coordinator).
// Unavailable names the address when it cannot be reached (or, with TLS, when its
// certificate is not one tls_ca_file trusts); InvalidArgument for an unreadable CA file.
// After Register, the stream and the heartbeats carry the rank's token.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectCoordinator(const ClientOptions& o);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_CLIENT_H_
