// Phase 1 of the UCX backend: the UCP context and worker (OpenUcxWorker), and small helpers
// the backend's files share.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/ucx_internal.h"

namespace braid::transport {
namespace ucx {

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::InternalError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

std::string HostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

bool ProcessGone(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  char state = line[close + 2];
  return state == 'Z' || state == 'X';
}

WorkerImpl::~WorkerImpl() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::Status WorkerImpl::Open() {
  // rank < 0 / size < 1: not known yet (the coordinator assigns them at registration);
  // ConnectUcx learns them from the peer list.
  if (options_.size >= 1 && options_.rank >= options_.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid rank ", options_.rank, " for world size ", options_.size));
  }
  // Peer error handling turns the shared-memory transports off unless they are allowed to
  // handle errors themselves. Only needed when local peers use it too.
  if (options_.peer_error_handling) {
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
  }
  // Note [Eager across hosts]
  // Over tcp, UCX sends a tagged message of more than 8 KiB (its tcp segment) with a
  // rendezvous: the sender's request, the receiver's reply, then the data. On a full link the
  // reply queues behind the receiver's own outgoing data (up to the qdisc's or the switch's
  // queue: tens of ms at 100 Mbit/s), once for every ring step, and the link idles meanwhile.
  // So sends to a peer on another host (and only those: shared memory keeps its one-copy
  // rendezvous) carry UCP_OP_ATTR_FLAG_FAST_CMPL (ucx_p2p.cc: PostSend), for which UCX
  // switches to a rendezvous only from RNDV_SEND_NBR_THRESH up (its "local" threshold) and
  // sends eagerly below it: copied out at once, no handshake. braid raises that threshold
  // above the ring's pieces (16 KiB across hosts, Note [Pieces across hosts] in
  // ucx_communicator.cc) and the whole messages of recursive doubling (below 256 KiB)
  // unless the user set it; no other send of braid's uses the flag, so nothing else changes.
  setenv("UCX_RNDV_SEND_NBR_THRESH", "1m", 0);
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError("ucp_config_read", st);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.estimated_num_eps = static_cast<size_t>(std::max(1, options_.size));
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcxError("ucp_init", st);

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  // One thread owns the worker (the runtime's background thread); Abort() from another
  // thread only calls ucp_worker_signal, which is thread-safe.
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  wparams.events = UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_RMA;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return UcxError("ucp_worker_create", st);
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return UcxError("ucp_worker_get_efd", st);

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (st != UCS_OK) return UcxError("ucp_worker_get_address", st);
  self_ = PeerAddress{HostName(), static_cast<int64_t>(getpid()),
                      std::string(reinterpret_cast<const char*>(addr), addr_len)};
  ucp_worker_release_address(worker_, addr);
  return absl::OkStatus();
}

}  // namespace ucx

absl::StatusOr<std::unique_ptr<UcxWorker>> OpenUcxWorker(const UcxOptions& options) {
  auto worker = std::make_unique<ucx::WorkerImpl>(options);
  BRAID_RETURN_IF_ERROR(worker->Open());
  return std::unique_ptr<UcxWorker>(std::move(worker));
}

}  // namespace braid::transport
