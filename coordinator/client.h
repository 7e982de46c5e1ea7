// The gRPC implementation of braid::CoordinatorClient.
#ifndef BRAID_COORDINATOR_CLIENT_H_
#define BRAID_COORDINATOR_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/coordinator_client.h"

namespace braid::coordinator {

struct ClientOptions {
  std::string address;  // host:port
  absl::Duration connect_timeout = absl::Seconds(60);
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
};

// How often a rank beats for a job whose heartbeat timeout is `heartbeat_timeout`: four
// beats per timeout, at most ten a second.
absl::Duration HeartbeatInterval(absl::Duration heartbeat_timeout);

// Connects (retrying until connect_timeout, so ranks may start before the coordinator).
// Unavailable names the address when it cannot be reached.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectCoordinator(const ClientOptions& o);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_CLIENT_H_
