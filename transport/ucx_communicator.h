// The UCX backend of Communicator (host memory), on the UCP tag API.
//
// Algorithms: all-reduce is recursive doubling below `ring_threshold_bytes` and a chunked,
// pipelined ring (reduce-scatter then all-gather) above; reduce-scatter is the ring's first
// phase; all-gather is a ring; all-to-all posts every receive, then every send; broadcast is a
// binomial tree; barrier is a dissemination barrier.
//
// Progress: the calling thread owns the UCP worker. A wait spins for `spin` and then blocks on
// the worker's event fd (ucp_worker_arm + poll), so idle ranks cost no CPU. Failure: endpoints
// to other hosts use UCX peer error handling (with the shared-memory transports kept on);
// peers on this host are watched through /proc (see UcxOptions::peer_error_handling), so a
// lost peer yields Unavailable; no progress for `timeout` yields DeadlineExceeded; Abort()
// from any thread fails the call in flight.
#ifndef BRAID_TRANSPORT_UCX_COMMUNICATOR_H_
#define BRAID_TRANSPORT_UCX_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/communicator.h"
#include "common/store.h"

namespace braid::transport {

struct UcxOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous store; keys are prefixed with `store_prefix` so several communicators can
  // share one store.
  Store* store = nullptr;
  std::string store_prefix = "ucx";
  // A collective that makes no progress for this long fails (BRAID_TIMEOUT_S).
  absl::Duration timeout = absl::Seconds(60);
  // How long CreateUcxCommunicator waits for every peer's address.
  absl::Duration connect_timeout = absl::Seconds(60);
  // All-reduces of at least this many bytes use the ring.
  size_t ring_threshold_bytes = 256 * 1024;
  // Pipeline chunk of the ring, and how many chunks are in flight at once.
  size_t chunk_bytes = 256 * 1024;
  int ring_window = 4;
  // Use UCX peer error handling for peers on this host too. Off by default: in UCX 1.13 it
  // disables the single-copy CMA rendezvous, and braid watches local peers' processes itself.
  // Remote peers always use it. BRAID_UCX_PEER_ERROR_HANDLING=1 sets it.
  bool peer_error_handling = false;
  // Busy-poll this long before blocking on the event fd. Negative: choose by
  // over-subscription (spin only when ranks on this host <= cores).
  absl::Duration spin = absl::Microseconds(-1);
};

// Defaults overridden by the environment: BRAID_TIMEOUT_S (seconds, > 0),
// BRAID_UCX_PEER_ERROR_HANDLING (0/1). InvalidArgument names a malformed variable.
absl::StatusOr<UcxOptions> UcxOptionsFromEnv(UcxOptions defaults = {});

// Where a rank's data plane can be reached: its host, its pid (peers on one host watch each
// other's process) and its UCX worker address.
struct PeerAddress {
  std::string host;
  int64_t pid = 0;
  std::string address;
};

// A UCX worker opened but not yet connected: its address can travel to the peers (in the
// coordinator's RegisterResponse) before any of them is known.
class UcxWorker {
 public:
  virtual ~UcxWorker() = default;
  virtual const PeerAddress& self() const = 0;
};

// Creates the UCP context and worker. `options.rank` / `options.size` may still be unknown
// (-1 / 0) when the coordinator assigns ranks: ConnectUcx then takes them from the peers.
// Errors: Internal (UCX failed).
//
// UCX is configured from the environment as usual (UCX_TLS, UCX_NET_DEVICES, ...). Unless
// already set, braid sets UCX_POSIX_ERROR_HANDLING=y and UCX_SYSV_ERROR_HANDLING=y so the
// shared-memory transports stay usable with peer error handling.
absl::StatusOr<std::unique_ptr<UcxWorker>> OpenUcxWorker(const UcxOptions& options);

// Connects `worker` to every peer; peers[r] is rank r's address and peers[options.rank] ==
// worker->self() (with options.rank unknown, this rank is the one whose address is the
// worker's, and the world size is peers.size()). Errors: InvalidArgument (bad options, or
// the worker is not among the peers), Internal (UCX failed).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectUcx(std::unique_ptr<UcxWorker> worker,
                                                         std::vector<PeerAddress> peers);

// The store-based convenience: OpenUcxWorker, publish this rank's address in options.store,
// wait for every peer's, ConnectUcx. Errors: as above, and DeadlineExceeded (a peer never
// published within connect_timeout).
absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(const UcxOptions& options);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_UCX_COMMUNICATOR_H_
