// The UCX backend's entry points: ConnectUcx puts the UCX PointToPoint under a
// CollectiveCommunicator; CreateUcxCommunicator exchanges PeerAddresses through a Store.
#include "transport/ucx_communicator.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/collective_communicator.h"
#include "transport/ucx_internal.h"

namespace braid::transport {
namespace {

// A PeerAddress as one Store value: "host\npid\naddress" (the address is binary and last).
std::string EncodePeer(const PeerAddress& p) {
  return absl::StrCat(p.host, "\n", p.pid, "\n", p.address);
}

absl::StatusOr<PeerAddress> DecodePeer(const std::string& s) {
  size_t a = s.find('\n');
  size_t b = a == std::string::npos ? a : s.find('\n', a + 1);
  PeerAddress p;
  if (b == std::string::npos || !absl::SimpleAtoi(s.substr(a + 1, b - a - 1), &p.pid)) {
    return absl::InternalError("malformed peer record in the rendezvous store");
  }
  p.host = s.substr(0, a);
  p.address = s.substr(b + 1);
  return p;
}

}  // namespace

// Note [Pieces across hosts]: over tcp between hosts, the ring pipeline's pieces are small.
// The reduce-scatter is direct (canonical order, Note [Canonical reduction order]), so a rank
// has ring_window x (n-1) pieces in flight to as many peers, all through one link: at 256 KiB
// pieces that is 3 MiB for 4 ranks queued at the link (a switch port, or the test hosts' tc
// queue), while a piece moves to its next stage only once it has wholly arrived. Measured on
// 4 test hosts (BENCHMARKS.md, section 22): 256 KiB pieces used 77-81% of a 100 Mbit/s link
// from 1 to 16 MiB and 31-44% of 1 Gbit/s; 16 KiB pieces 93-95% and 69-82%, above gloo's
// ring (89-93%, 40-46%). Not loss: the links' queues dropped no packet at either size; where
// exactly the larger pieces leave the link idle was not traced further. Every rank sees the
// same peer list, so every rank cuts the same pieces (their count is part of the tags),
// also a pair of ranks on one host within such a job. A job whose ranks are all on one host
// keeps its pieces: shared memory has no such queue, and larger pieces cost it fewer
// messages.
size_t PipelineChunkBytes(const UcxOptions& options, const std::vector<PeerAddress>& peers) {
  bool across_hosts = false;
  for (const PeerAddress& p : peers) across_hosts |= p.host != peers[0].host;
  if (!across_hosts || options.chunk_bytes_across_hosts == 0) return options.chunk_bytes;
  return std::min(options.chunk_bytes, options.chunk_bytes_across_hosts);
}

namespace {

// ConnectUcx's point-to-point layer, and the options it runs with.
absl::StatusOr<std::unique_ptr<PointToPoint>> ConnectUcxPointToPoint(
    std::unique_ptr<UcxWorker> worker, std::vector<PeerAddress> peers, UcxOptions* out) {
  if (worker == nullptr) return absl::InvalidArgumentError("ConnectUcx: no worker");
  // OpenUcxWorker is the only maker of workers ConnectUcx can connect.
  if (dynamic_cast<ucx::WorkerImpl*>(worker.get()) == nullptr) {
    return absl::InvalidArgumentError("ConnectUcx: the worker was not made by OpenUcxWorker");
  }
  std::unique_ptr<ucx::WorkerImpl> impl(static_cast<ucx::WorkerImpl*>(worker.release()));
  UcxOptions options = impl->options();
  // A worker opened before its rank was known (the coordinator assigns ranks in registration
  // order): the world is the peer list, and this rank is the entry holding its own address.
  if (options.size < 1) options.size = static_cast<int>(peers.size());
  if (options.rank < 0) {
    for (size_t p = 0; p < peers.size(); ++p) {
      if (peers[p].address == impl->self().address) options.rank = static_cast<int>(p);
    }
    if (options.rank < 0) {
      return absl::InvalidArgumentError("ConnectUcx: no peer holds this worker's own address");
    }
  }
  if (peers.size() != static_cast<size_t>(options.size)) {
    return absl::InvalidArgumentError(absl::StrCat("ConnectUcx needs one PeerAddress per rank: got ",
                                                   peers.size(), " for world size ", options.size));
  }
  if (peers[options.rank].address != impl->self().address) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ConnectUcx: peers[", options.rank, "] is not this rank's own worker address"));
  }
  options.chunk_bytes = PipelineChunkBytes(options, peers);
  impl->SetPlace(options.rank, options.size);
  *out = options;
  return ucx::ConnectPointToPoint(std::move(impl), std::move(peers));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectUcx(std::unique_ptr<UcxWorker> worker,
                                                         std::vector<PeerAddress> peers) {
  UcxOptions options;
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<PointToPoint> p2p,
                         ConnectUcxPointToPoint(std::move(worker), std::move(peers), &options));
  return std::unique_ptr<Communicator>(std::make_unique<CollectiveCommunicator>(
      std::move(p2p), static_cast<const CollectiveOptions&>(options)));
}

absl::StatusOr<Channels> ConnectUcxChannels(std::unique_ptr<UcxWorker> worker,
                                            std::vector<PeerAddress> peers) {
  UcxOptions options;
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<PointToPoint> p2p,
                         ConnectUcxPointToPoint(std::move(worker), std::move(peers), &options));
  return SplitChannels(std::move(p2p), static_cast<const CollectiveOptions&>(options));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(const UcxOptions& options) {
  if (options.size > 1 && options.store == nullptr) {
    return absl::InvalidArgumentError("UcxOptions.store is required when size > 1");
  }
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> worker, OpenUcxWorker(options));
  std::vector<PeerAddress> peers(options.size);
  peers[options.rank] = worker->self();
  if (options.size > 1) {
    const std::string key_base = options.store_prefix + "/addr/";
    BRAID_RETURN_IF_ERROR(
        options.store->Set(key_base + std::to_string(options.rank), EncodePeer(worker->self())));
    std::vector<std::string> keys;
    for (int p = 0; p < options.size; ++p) keys.push_back(key_base + std::to_string(p));
    BRAID_RETURN_IF_ERROR(options.store->Wait(keys, options.connect_timeout));
    for (int p = 0; p < options.size; ++p) {
      if (p == options.rank) continue;
      BRAID_ASSIGN_OR_RETURN(std::string raw, options.store->Get(keys[p], options.connect_timeout));
      BRAID_ASSIGN_OR_RETURN(peers[p], DecodePeer(raw));
    }
  }
  return ConnectUcx(std::move(worker), std::move(peers));
}

}  // namespace braid::transport
