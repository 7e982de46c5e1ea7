// Internals of the UCX backend shared by its files; not part of braid's interface.
#ifndef BRAID_TRANSPORT_UCX_INTERNAL_H_
#define BRAID_TRANSPORT_UCX_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/p2p.h"
#include "transport/ucx_communicator.h"

namespace braid::transport::ucx {

// Phase 1's product (OpenUcxWorker): the UCP context and worker, and the address peers
// connect to. Destroys the worker, then the context.
class WorkerImpl final : public UcxWorker {
 public:
  explicit WorkerImpl(const UcxOptions& o) : options_(o) {}
  ~WorkerImpl() override;
  absl::Status Open();
  const PeerAddress& self() const override { return self_; }

  const UcxOptions& options() const { return options_; }
  // Fills in the rank and size the coordinator assigned (ConnectUcx).
  void SetPlace(int rank, int size) {
    options_.rank = rank;
    options_.size = size;
  }
  ucp_worker_h worker() const { return worker_; }
  int event_fd() const { return efd_; }

 private:
  UcxOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  PeerAddress self_;
};

// Phase 2: the PointToPoint over `worker`, connected to every peer (ConnectUcx checks `peers`).
absl::StatusOr<std::unique_ptr<PointToPoint>> ConnectPointToPoint(
    std::unique_ptr<WorkerImpl> worker, std::vector<PeerAddress> peers);

// Note [Warm shared memory] (ucx_warmup.cc): messages that page in UCX's shared-memory
// receive descriptors at connection. Used by the point-to-point layer's thread only.
class SharedMemoryWarmup {
 public:
  // Posts the warm-up's receives from, and sends to, every rank in `local` (peers on this
  // host), with the tags' pair fields of ucx_p2p.cc. Errors are left to the collectives.
  void Start(ucp_worker_h worker, const std::vector<ucp_ep_h>& eps,
             const std::vector<int>& local, const std::vector<uint32_t>& send_pair,
             const std::vector<uint32_t>& recv_pair);
  // Releases the receives that completed, in order; with `cancel`, cancels the rest too
  // (at the end). Frees the buffers once none is left.
  void Release(ucp_worker_h worker, bool cancel);
  bool active() const { return !recvs_.empty(); }

 private:
  std::vector<void*> recvs_;
  size_t done_ = 0;  // recvs_[0, done_) completed and released
  std::vector<char> buf_;
};

absl::Status UcxError(absl::string_view what, ucs_status_t status);
std::string HostName();
// True when process `pid` on this host is gone (or a zombie nobody reaped yet).
bool ProcessGone(int64_t pid);
// "ucx " and the transport/device names of the endpoints' lanes, e.g. "ucx cma/memory
// sysv/memory" (from ucp_ep_print_info).
std::string DescribeEndpoints(const std::vector<ucp_ep_h>& eps);

}  // namespace braid::transport::ucx

#endif  // BRAID_TRANSPORT_UCX_INTERNAL_H_
