// The coordinator's gRPC service: rendezvous (rank assignment, key-value store for
// data-plane addresses), negotiation streams, heartbeats, status and shutdown. It sees only
// metadata, never tensor bytes. Runs in the launcher, in rank 0, or as braid-coordinator.
#ifndef BRAID_COORDINATOR_SERVER_H_
#define BRAID_COORDINATOR_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid::coordinator {

struct ServerOptions {
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0: pick a free port (read it back with port())
  // World size; 0 takes it from the first rank that registers.
  int world_size = 0;
  // Ranks must present this secret when registering ("" = no check).
  std::string job_secret;
  // Register waits this long for the whole world.
  absl::Duration register_timeout = absl::Seconds(120);
  // A rank whose negotiation stream closes without a clean shutdown is lost: the others are
  // told at once. A rank silent for this long is lost too.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Stall inspector: a tensor some ranks submitted and others did not is logged after
  // stall_check, and the job is aborted (DeadlineExceeded on every rank) after
  // stall_shutdown when that is positive. Rank 0's registration overrides both
  // (BRAID_STALL_CHECK_S, BRAID_STALL_SHUTDOWN_S).
  absl::Duration stall_check = absl::Seconds(60);
  absl::Duration stall_shutdown = absl::ZeroDuration();
};

class CoordinatorServer {
 public:
  virtual ~CoordinatorServer() = default;
  virtual int port() const = 0;
  // "host:port" ranks connect to.
  virtual std::string address() const = 0;
  // Ends every negotiation stream with a shutdown message and stops the server; open
  // calls are cancelled after `grace`.
  virtual void Shutdown(absl::Duration grace = absl::Seconds(1)) = 0;
  // Blocks until Shutdown() (or a Shutdown RPC) stopped the server.
  virtual void Wait() = 0;
};

// Starts the server. Errors: Unavailable when the address cannot be bound (the port is in
// use: SO_REUSEPORT is off so a second coordinator cannot silently share it).
absl::StatusOr<std::unique_ptr<CoordinatorServer>> StartCoordinator(const ServerOptions& options);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_SERVER_H_
