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

absl::Status UcxError(absl::string_view what, ucs_status_t status);
std::string HostName();
// True when process `pid` on this host is gone (or a zombie nobody reaped yet).
bool ProcessGone(int64_t pid);
// "ucx " and the transport/device names of the endpoints' lanes, e.g. "ucx cma/memory
// sysv/memory" (from ucp_ep_print_info).
std::string DescribeEndpoints(const std::vector<ucp_ep_h>& eps);

}  // namespace braid::transport::ucx

#endif  // BRAID_TRANSPORT_UCX_INTERNAL_H_
