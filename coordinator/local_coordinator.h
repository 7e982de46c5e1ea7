// An in-process coordinator: the gRPC-free handlers (service.h) with a monitor, and
// CoordinatorClients that call them directly instead of over gRPC. It runs several ranks of
// braid::Runtime as threads of one process (RuntimeDeps, runtime/runtime.h), with everything
// the coordinator decides (rendezvous, job settings, negotiation, fusion, the response
// cache, mismatch errors, ranks that shut down or go silent) exactly as a real one decides
// it. Each client has the threads a gRPC client has, a reader that delivers ResponseLists
// in order and a heartbeat, so a rank's thread model is the same either way (only gRPC's own
// pools are missing).
#ifndef BRAID_COORDINATOR_LOCAL_COORDINATOR_H_
#define BRAID_COORDINATOR_LOCAL_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/monitor.h"
#include "coordinator/service.h"
#include "proto/braid.pb.h"
#include "control/coordinator_client.h"

namespace braid::coordinator {

struct LocalClientOptions {
  // As ClientOptions::fill_heartbeat (client.h); null: plain heartbeats.
  std::function<void(proto::HeartbeatRequest*)> fill_heartbeat;
  // Until registration returns the job's heartbeat timeout T; then HeartbeatInterval(T).
  absl::Duration heartbeat_interval = absl::Seconds(2);
};

class LocalCoordinator {
 public:
  // `inspect_period`: how often the monitor checks deadlines, liveness and stalls.
  // Its clients present options.job_secret (Note [Who may join]); empty: a fixed one.
  explicit LocalCoordinator(ServiceOptions options,
                            absl::Duration inspect_period = absl::Milliseconds(100));
  // Shuts the service down (every open stream gets a final shutdown message). Every client
  // must have been destroyed first.
  ~LocalCoordinator();
  LocalCoordinator(const LocalCoordinator&) = delete;
  LocalCoordinator& operator=(const LocalCoordinator&) = delete;

  // A client for one rank. Thread-safe.
  std::unique_ptr<CoordinatorClient> NewClient(LocalClientOptions options = {});

  CoordinatorService& service() { return service_; }
  // The current job's status, as braidctl reads it.
  absl::StatusOr<proto::StatusResponse> Status();

 private:
  const std::string secret_;  // what every client presents
  CoordinatorService service_;
  std::unique_ptr<Monitor> monitor_;  // last: stopped first
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_LOCAL_COORDINATOR_H_
