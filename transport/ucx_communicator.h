// The UCX backend (host memory), on the UCP tag API: a PointToPoint (transport/p2p.h) under a
// CollectiveCommunicator, which runs the algorithms of transport/collectives.h (see
// transport/collective_communicator.h for which one runs when).
//
// Creation is in two phases, so the addresses can travel by whatever rendezvous the caller
// has: OpenUcxWorker opens the context and worker and tells this rank's PeerAddress; the
// caller exchanges PeerAddresses (the runtime through the coordinator's registration); then
// ConnectUcx connects to every peer. CreateUcxCommunicator does all three through a Store.
//
// Progress: the calling thread owns the UCP worker. A wait spins (adaptively, up to `spin`), then blocks on
// the worker's event fd (ucp_worker_arm + poll), so idle ranks cost no CPU. Failure: endpoints
// to other hosts use UCX peer error handling (with the shared-memory transports kept on);
// peers on this host are watched through /proc (see UcxOptions::peer_error_handling), so a
// lost peer yields Unavailable; no progress for `timeout` yields DeadlineExceeded; Abort()
// from any thread fails the call in flight. Tags: Note [Tag layout] in transport/tag.h.
#ifndef BRAID_TRANSPORT_UCX_COMMUNICATOR_H_
#define BRAID_TRANSPORT_UCX_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/limits.h"
#include "common/store.h"
#include "transport/channels.h"
#include "transport/communicator.h"
#include "transport/context.h"

namespace braid::transport {

// The algorithm settings and the progress timeout (CollectiveOptions, transport/context.h:
// timeout, ring_threshold_bytes, chunk_bytes, ring_window, direct_max_ranks), plus UCX's own.
// The transport reads no environment variables of its own: the runtime fills these from its
// configuration (BRAID_TIMEOUT_S, BRAID_UCX_PEER_ERROR_HANDLING).
struct UcxOptions : CollectiveOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous store of CreateUcxCommunicator; keys are prefixed with `store_prefix` so
  // several communicators can share one store. Not used by OpenUcxWorker / ConnectUcx.
  Store* store = nullptr;
  std::string store_prefix = "ucx";
  // How long CreateUcxCommunicator waits for every peer's address.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Use UCX peer error handling for peers on this host too. Off by default: in UCX 1.13 it
  // disables the single-copy CMA rendezvous, and braid watches local peers' processes itself.
  // Remote peers always use it.
  bool peer_error_handling = false;
  // The pipeline piece (CollectiveOptions::chunk_bytes) of a job whose ranks are on more
  // than one host: chunk_bytes becomes the smaller of the two on every rank (Note [Pieces
  // across hosts] in ucx_communicator.cc). 0: chunk_bytes everywhere.
  size_t chunk_bytes_across_hosts = kDefaultRingChunkBytesAcrossHosts;
  // Busy-poll at most this long before blocking on the event fd; the spin adapts below it to
  // how long waits take (Note [Adaptive spin] in ucx_p2p.cc). Negative: choose by
  // over-subscription (50 us when ranks on this host <= cores, else none).
  absl::Duration spin = absl::Microseconds(-1);
  // At connection, send a few hundred small messages to every peer on this host so that
  // UCX's shared-memory receive descriptors are paged in before the first collective
  // (Note [Warm shared memory] in ucx_warmup.cc). Off: the first ~60 small messages to each
  // local peer take a few microseconds more.
  bool warm_shared_memory = true;
  // The pair field of the tags (Note [Tag layout]) on messages from `source` to
  // `destination`; unset: the source rank. Every rank must use the same function, and no
  // two sources may map to one value at the same destination.
  std::function<uint32_t(int source, int destination)> pair_tag;
};

// What one rank publishes for the data plane: enough for every peer to connect to it and
// to watch it. Exchanged through the Store by CreateUcxCommunicator, or through the
// coordinator's registration by the runtime.
struct PeerAddress {
  std::string host;     // hostname (same-host peers are watched via /proc)
  int64_t pid = 0;      // process id on `host`
  std::string address;  // opaque backend address bytes (the UCX worker address)
};

// The pipeline piece a job with these peers runs with: options.chunk_bytes, or the smaller
// options.chunk_bytes_across_hosts when the peers are on more than one host (Note [Pieces
// across hosts] in ucx_communicator.cc). ConnectUcx applies it.
size_t PipelineChunkBytes(const UcxOptions& options, const std::vector<PeerAddress>& peers);

// An opened UCP context and worker, not yet connected to any peer (phase 1 of 2).
class UcxWorker {
 public:
  virtual ~UcxWorker() = default;
  // This rank's PeerAddress: this host, this process, the worker's address.
  virtual const PeerAddress& self() const = 0;
};

// Phase 1: opens the UCP context and worker. Uses options.rank, .size and the timeouts and
// algorithm settings; options.store is not used. rank < 0 and size < 1 mean "not known yet"
// (the coordinator assigns them at registration): ConnectUcx takes them from the peer list.
// Errors: InvalidArgument (rank >= size),
// Internal (UCX failed).
//
// UCX is configured from the environment as usual (UCX_TLS, UCX_NET_DEVICES, ...). With
// options.peer_error_handling, braid sets UCX_POSIX_ERROR_HANDLING=y and
// UCX_SYSV_ERROR_HANDLING=y unless already set, so the shared-memory transports stay usable.
absl::StatusOr<std::unique_ptr<UcxWorker>> OpenUcxWorker(const UcxOptions& options);

// Phase 2: connects `worker` to every peer. peers.size() == options.size, peers[r] is rank r's
// PeerAddress and peers[options.rank] is worker->self() (with an unknown rank, the entry equal
// to worker->self() is this rank; with an unknown size, the world is peers.size()). Errors: InvalidArgument (wrong
// number of peers, peers[rank] not this worker, a null worker), Internal (UCX failed).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectUcx(std::unique_ptr<UcxWorker> worker,
                                                         std::vector<PeerAddress> peers);
// The same, split into a data and a control channel over the one worker (Note [Channels],
// transport/channels.h).
absl::StatusOr<Channels> ConnectUcxChannels(std::unique_ptr<UcxWorker> worker,
                                            std::vector<PeerAddress> peers);

// Both phases with the exchange in between, for tests and benchmarks: opens the worker,
// publishes its PeerAddress in options.store under `store_prefix`/addr/<rank>, waits up to
// connect_timeout for every peer's and connects. Errors: those of the two phases,
// InvalidArgument (no store with size > 1), DeadlineExceeded (a peer never published).
absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(const UcxOptions& options);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_UCX_COMMUNICATOR_H_
