// The coordinator's gRPC server: CoordinatorService (service.h) served over gRPC's callback
// API, so an open negotiation stream or a waiting Register costs no thread (the process has
// gRPC's own threads and one Monitor thread, whatever the number of ranks). It sees only
// metadata, never tensor bytes. Runs in braidrun, in rank 0, or as braid-coordinator.
#ifndef BRAID_COORDINATOR_SERVER_H_
#define BRAID_COORDINATOR_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/autotune.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

struct ServerOptions {
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0: pick a free port (read it back with port())
  // World size; 0 takes it from the first rank that registers (per job).
  int world_size = 0;
  // Every call must present this secret (Note [Who may join] in admission.h). Required:
  // StartCoordinator refuses to start without one, or with a weak one (Note [Secret
  // strength] in common/secret.h).
  std::string job_secret;
  // TLS: both set, the server speaks only TLS with this PEM certificate and private key
  // (mode 0600); both empty, plaintext (one host, or a trusted network).
  std::string tls_cert_file;
  std::string tls_key_file;
  // Serves one job (braidrun's, rank 0's): a registration while it runs is another job's
  // rank on the same port, refused at once (service.h).
  bool single_job = false;
  // Register waits this long for the whole world.
  absl::Duration register_timeout = absl::Seconds(120);
  // The coordinator's own job settings: a field that is present binds every job, and a rank
  // that set another value is refused; absent fields are the ranks' to set (Note [Job
  // settings] in rendezvous.h). Liveness uses the job's heartbeat timeout: a rank whose
  // stream closes without a goodbye, or that is silent that long, is lost and the others
  // are told at once. Stalls use the job's stall check and shutdown.
  proto::JobSettings settings;
  // How often the monitor (monitor.h) inspects liveness, stalls and deadlines.
  absl::Duration monitor_period = absl::Milliseconds(100);
  // Told of every rank the coordinator declares lost, with the reason, from the server's
  // threads (the service's lock held: it must return at once and not call the server).
  // braidrun's: Note [Lost ranks] in tools/braidrun/launcher.h. `worker`: the rank's
  // RegisterRequest.worker, -1 without one.
  std::function<void(int rank, int worker, const std::string& why)> on_rank_lost;
  // Elastic (Note [Elastic membership] in service.h): each membership's world size, asked
  // under the service's lock (it must return at once).
  std::function<absl::StatusOr<int>()> elastic_world_size;
  // Elastic: ServiceOptions::elastic_admit and elastic_leaving (under the service's lock;
  // may be null).
  std::function<absl::Status(int worker)> elastic_admit;
  std::function<bool(int worker)> elastic_leaving;
  // Under BRAID_AUTOTUNE (Note [Autotuning] in autotune.h): the search's parameters.
  AutotuneOptions autotune;
};

class CoordinatorServer {
 public:
  virtual ~CoordinatorServer() = default;
  virtual int port() const = 0;
  // "host:port" ranks connect to ("[host]:port" for an IPv6 address).
  virtual std::string address() const = 0;
  // Ends every negotiation stream with a shutdown message and stops the server; open
  // calls are cancelled after `grace`.
  virtual void Shutdown(absl::Duration grace = absl::Seconds(1)) = 0;
  // Blocks until Shutdown() (or a Shutdown RPC) stopped the server.
  virtual void Wait() = 0;
  // Blocks until the current job has ended (every rank said goodbye or was lost) or
  // `timeout` passed; true when it ended. A rank hosting the coordinator calls it before
  // Shutdown, so the ranks still finishing their last collectives are not cancelled.
  virtual bool WaitForJobEnd(absl::Duration timeout) = 0;
};

// "host:port", the host bracketed when it is an IPv6 address ("[::1]:5"), as gRPC and
// BRAID_COORDINATOR read it: gRPC reads "::1:5" as the IPv6 address ::1:5 without a port.
std::string HostPort(const std::string& host, int port);

// Starts the server. Errors: Unavailable when the address cannot be bound, naming bind()'s
// error (the port is in use: SO_REUSEPORT is off so a second coordinator cannot silently
// share it; the address is not this host's; ...);
// InvalidArgument without a job secret or with a weak one, or for bad TLS files
// (credentials.h).
absl::StatusOr<std::unique_ptr<CoordinatorServer>> StartCoordinator(const ServerOptions& options);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_SERVER_H_
