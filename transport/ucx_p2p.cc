// Phase 2 of the UCX backend: the PointToPoint over a connected UCP worker.
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "transport/tag.h"
#include "transport/ucx_internal.h"

namespace braid::transport::ucx {
namespace {

// How often a blocked wait looks at the processes of same-host peers. It looks only once
// the caller has seen nothing complete for as long: a peer that finished its part of a
// collective and exited is no failure while its last message is still being progressed here.
constexpr absl::Duration kPeerCheckInterval = absl::Milliseconds(500);
// The longest a wait sleeps on the event fd before it looks again.
constexpr absl::Duration kMaxSleep = absl::Milliseconds(200);
// The adaptive spin's floor (Note [Adaptive spin]): even a rank that blocks at once polls this
// long first, as arming the event fd and polling costs about as much.
constexpr absl::Duration kMinSpin = absl::Microseconds(2);

class UcxPointToPoint final : public PointToPoint {
 public:
  UcxPointToPoint(std::unique_ptr<WorkerImpl> w, std::vector<PeerAddress> peers)
      : w_(std::move(w)),
        worker_(w_->worker()),
        rank_(w_->options().rank),
        size_(w_->options().size),
        peers_(std::move(peers)) {}
  ~UcxPointToPoint() override;

  absl::Status Connect();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status PostSend(int peer, Tag tag, const void* buf, size_t bytes,
                        Request* req) override;
  absl::Status PostRecv(int peer, Tag tag, void* buf, size_t bytes, Request* req) override;
  absl::StatusOr<bool> Test(Request* req) override;
  void Cancel(absl::Span<Request> reqs) override;
  absl::Status Wait(absl::Time idle_since, absl::Time until) override;
  absl::Status Health() override;
  void Abort(absl::Status reason) override;
  void Wake() override { ucp_worker_signal(worker_); }  // thread-safe
  std::string Describe() const override;
  uint64_t DropStray(uint32_t seq, uint64_t limit) override;

 private:
  // Unavailable when a peer this rank has requests pending with is lost: its endpoint
  // reported an error, or (same host) its process is gone. A lost peer nobody waits on (one
  // that finished its part and exited) is no failure.
  absl::Status LostPeers(bool check_processes);
  absl::Status EndpointError(int peer) const;
  absl::Status CompletionError(const Request& r, ucs_status_t st);
  void Track(const Request& r, int delta) {
    if (r.pending) pending_[r.peer] += delta;
  }
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  // Where dropped stray messages land (DropStray); declared before w_, so it outlives the
  // worker, which may still write the rest of a dropped message into it.
  std::vector<char> stray_;
  std::unique_ptr<WorkerImpl> w_;  // destroyed last: the worker outlives the endpoints
  ucp_worker_h worker_;
  const int rank_;
  const int size_;
  std::vector<PeerAddress> peers_;
  std::vector<ucp_ep_h> eps_;
  std::vector<std::pair<UcxPointToPoint*, int>> ep_args_;  // err-handler argument per peer
  std::vector<uint32_t> send_pair_, recv_pair_;              // tag pair fields per peer
  std::vector<int> pending_;                                 // requests pending per peer
  std::vector<char> remote_;  // per peer: on another host (Note [Eager across hosts])
  // Note [Adaptive spin]. spin_limit_ is the most a wait spins (UcxOptions::spin, or chosen
  // by over-subscription); spin_ is the current budget, within [kMinSpin, spin_limit_].
  void AdaptSpin(absl::Duration waited);
  absl::Duration spin_limit_;
  absl::Duration spin_;
  absl::Time next_peer_check_;
  bool failed_ = false;  // a request failed or the group was aborted: close endpoints hard
  // Peers whose endpoint reported an error (set inside ucp_worker_progress).
  std::vector<std::pair<int, ucs_status_t>> ep_failures_;
  mutable std::string describe_cache_;
  SharedMemoryWarmup warmup_;  // Note [Warm shared memory] in ucx_warmup.cc

  // Set from any thread by Abort().
  std::atomic<bool> aborted_{false};
  absl::Mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);
};

absl::Status UcxPointToPoint::Connect() {
  const UcxOptions& o = w_->options();
  const PeerAddress& self = w_->self();
  eps_.assign(size_, nullptr);
  ep_args_.resize(size_);
  send_pair_.resize(size_);
  recv_pair_.resize(size_);
  pending_.assign(size_, 0);
  remote_.assign(size_, 0);
  for (int p = 0; p < size_; ++p) {
    send_pair_[p] = o.pair_tag ? o.pair_tag(rank_, p) : static_cast<uint32_t>(rank_);
    recv_pair_[p] = o.pair_tag ? o.pair_tag(p, rank_) : static_cast<uint32_t>(p);
    if (p == rank_) continue;
    ep_args_[p] = {this, p};
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peers_[p].address.data());
    // Note [Local peers and CMA]: in UCX 1.13 peer error handling drops the cma rendezvous
    // lane, which makes every large intra-host message cost two copies through a
    // shared-memory bounce buffer instead of one process_vm_readv. Peers on this host are
    // watched through /proc instead (LostPeers), so they use the default mode unless
    // options.peer_error_handling forces it; remote peers always use it.
    const bool local = peers_[p].host == self.host;
    remote_[p] = local ? 0 : 1;
    ep.err_mode = (local && !o.peer_error_handling) ? UCP_ERR_HANDLING_MODE_NONE
                                                    : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxPointToPoint::OnEndpointError;
    ep.err_handler.arg = &ep_args_[p];
    ucs_status_t st = ucp_ep_create(worker_, &ep, &eps_[p]);
    if (st != UCS_OK) return UcxError(absl::StrCat("ucp_ep_create to rank ", p), st);
  }
  if (o.spin < absl::ZeroDuration()) {
    int local = 0;
    for (const PeerAddress& p : peers_) local += p.host == self.host ? 1 : 0;
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    // More ranks than cores on this host: a spinning rank would burn the core a peer needs.
    spin_limit_ =
        static_cast<unsigned>(local) <= cores ? absl::Microseconds(50) : absl::ZeroDuration();
  } else {
    spin_limit_ = o.spin;
  }
  spin_ = spin_limit_;
  next_peer_check_ = absl::Now() + kPeerCheckInterval;
  if (o.warm_shared_memory) {
    std::vector<int> local;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && !remote_[p]) local.push_back(p);
    }
    warmup_.Start(worker_, eps_, local, send_pair_, recv_pair_);
  }
  return absl::OkStatus();
}

UcxPointToPoint::~UcxPointToPoint() {
  warmup_.Release(worker_, /*cancel=*/true);
  // No closing barrier: a collective completes on this rank only once its sends have
  // completed. A rendezvous send completes after the peer pulled the data; an eager send to
  // another host (Note [Eager across hosts], ucx_worker.cc) completes once copied out, and
  // what of it UCX still holds is flushed into the socket by the non-forced close below
  // (bounded by its 500 ms: at most ring_window pieces per peer, well under that at 100
  // Mbit/s and up). A barrier here would make every rank's shutdown wait for the slowest
  // peer's, or hang on one that aborted.
  std::vector<void*> closing;
  for (ucp_ep_h ep : eps_) {
    if (ep == nullptr) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = failed_ || aborted_.load() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing.push_back(req);
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  for (void* req : closing) {
    while (ucp_request_check_status(req) == UCS_INPROGRESS && absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(req);
  }
}

void UcxPointToPoint::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* a = static_cast<std::pair<UcxPointToPoint*, int>*>(arg);
  a->first->ep_failures_.emplace_back(a->second, status);
}

absl::Status UcxPointToPoint::PostSend(int peer, Tag tag, const void* buf, size_t bytes,
                                       Request* req) {
  static char empty;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  // Note [Eager across hosts] (ucx_worker.cc): to another host, eager up to
  // RNDV_SEND_NBR_THRESH, with no rendezvous handshake.
  if (remote_[peer]) p.op_attr_mask |= UCP_OP_ATTR_FLAG_FAST_CMPL;
  p.datatype = ucp_dt_make_contig(1);
  void* r = ucp_tag_send_nbx(eps_[peer], bytes ? buf : &empty, bytes,
                             EncodeUcxTag(send_pair_[peer], tag), &p);
  if (UCS_PTR_IS_ERR(r)) {
    failed_ = true;
    return absl::UnavailableError(absl::StrCat("rank ", rank_, ": send to rank ", peer,
                                               " failed: ", ucs_status_string(UCS_PTR_STATUS(r))));
  }
  *req = Request{r, r != nullptr, false, peer, bytes};
  Track(*req, +1);
  return absl::OkStatus();
}

absl::Status UcxPointToPoint::PostRecv(int peer, Tag tag, void* buf, size_t bytes,
                                       Request* req) {
  static char empty;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  void* r = ucp_tag_recv_nbx(worker_, bytes ? buf : &empty, bytes,
                             EncodeUcxTag(recv_pair_[peer], tag), ~uint64_t{0}, &p);
  if (UCS_PTR_IS_ERR(r)) {
    failed_ = true;
    return UcxError(absl::StrCat("rank ", rank_, ": receive from rank ", peer),
                    UCS_PTR_STATUS(r));
  }
  *req = Request{r, r != nullptr, true, peer, bytes};
  Track(*req, +1);
  return absl::OkStatus();
}

absl::Status UcxPointToPoint::CompletionError(const Request& r, ucs_status_t st) {
  failed_ = true;
  if (st == UCS_ERR_CANCELED) {
    BRAID_RETURN_IF_ERROR(Health());
    BRAID_RETURN_IF_ERROR(EndpointError(r.peer));
    return absl::CancelledError("operation cancelled");
  }
  if (st == UCS_ERR_MESSAGE_TRUNCATED) {
    return absl::InternalError(absl::StrCat(
        "rank ", rank_, ": message from rank ", r.peer, " longer than the ", r.bytes,
        " bytes expected (ranks called different collectives or sizes)"));
  }
  return absl::UnavailableError(absl::StrCat("rank ", rank_, ": ",
                                             r.is_recv ? "receive from" : "send to", " rank ",
                                             r.peer, " failed: ", ucs_status_string(st)));
}

absl::StatusOr<bool> UcxPointToPoint::Test(Request* r) {
  if (!r->pending) return true;
  ucs_status_t st;
  size_t got = r->bytes;
  if (r->is_recv) {
    ucp_tag_recv_info_t info{};
    st = ucp_tag_recv_request_test(r->handle, &info);
    got = info.length;
  } else {
    st = ucp_request_check_status(r->handle);
  }
  if (st == UCS_INPROGRESS) return false;
  Track(*r, -1);
  ucp_request_free(r->handle);
  r->handle = nullptr;
  r->pending = false;
  if (st != UCS_OK) return CompletionError(*r, st);
  if (r->is_recv && got != r->bytes) {
    failed_ = true;
    return absl::InternalError(absl::StrCat(
        "rank ", rank_, ": received ", got, " bytes from rank ", r->peer, ", expected ",
        r->bytes, " (ranks called different collectives or sizes)"));
  }
  return true;
}

void UcxPointToPoint::Cancel(absl::Span<Request> reqs) {
  for (Request& r : reqs) {
    if (!r.pending) continue;
    failed_ = true;  // cancelling is the failure path: close the endpoints hard later
    if (r.is_recv) ucp_request_cancel(worker_, r.handle);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  for (Request& r : reqs) {
    if (!r.pending) continue;
    Track(r, -1);
    while (r.is_recv && ucp_request_check_status(r.handle) == UCS_INPROGRESS &&
           absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(r.handle);  // a send still in flight is released when it completes
    r.handle = nullptr;
    r.pending = false;
  }
}

absl::Status UcxPointToPoint::Health() {
  if (!aborted_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&abort_mu_);
  return abort_reason_;
}

absl::Status UcxPointToPoint::EndpointError(int peer) const {
  for (const auto& [p, st] : ep_failures_) {
    if (p != peer) continue;
    return absl::UnavailableError(absl::StrCat("rank ", rank_, ": lost connection to rank ", p,
                                               " (pid ", peers_[p].pid, " on ", peers_[p].host,
                                               "): ", ucs_status_string(st)));
  }
  return absl::OkStatus();
}

absl::Status UcxPointToPoint::LostPeers(bool check_processes) {
  const std::string& me = peers_[rank_].host;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || pending_[p] == 0) continue;
    absl::Status s = EndpointError(p);
    if (s.ok() && check_processes && peers_[p].host == me && ProcessGone(peers_[p].pid)) {
      s = absl::UnavailableError(absl::StrCat("rank ", rank_, ": rank ", p, " (pid ",
                                              peers_[p].pid, " on ", peers_[p].host,
                                              ") has exited"));
    }
    if (!s.ok()) {
      failed_ = true;
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status UcxPointToPoint::Wait(absl::Time idle_since, absl::Time until) {
  while (true) {
    bool progressed = false;
    while (ucp_worker_progress(worker_) != 0) progressed = true;
    BRAID_RETURN_IF_ERROR(Health());
    if (warmup_.active()) warmup_.Release(worker_, /*cancel=*/false);
    if (progressed) {  // the caller tests its requests
      AdaptSpin(absl::Now() - idle_since);
      return absl::OkStatus();
    }
    BRAID_RETURN_IF_ERROR(LostPeers(/*check_processes=*/false));
    const absl::Time now = absl::Now();
    if (now >= until) return absl::OkStatus();
    if (now - idle_since < spin_) continue;  // busy-poll, within the budget
    const absl::Time check_at = std::max(next_peer_check_, idle_since + kPeerCheckInterval);
    if (now >= check_at) {
      BRAID_RETURN_IF_ERROR(LostPeers(/*check_processes=*/true));
      next_peer_check_ = now + kPeerCheckInterval;
    }
    ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress them
    if (st != UCS_OK) return UcxError("ucp_worker_arm", st);
    const absl::Time wake = std::max(next_peer_check_, idle_since + kPeerCheckInterval);
    const absl::Duration sleep = std::min({kMaxSleep, until - now, wake - now});
    pollfd pfd{w_->event_fd(), POLLIN, 0};
    poll(&pfd, 1, static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(sleep))));
    if (pfd.revents != 0) continue;  // woken: progress what arrived
    return absl::OkStatus();         // slept its fill: let the caller look at the time
  }
}

// Note [Adaptive spin]: a wait busy-polls for spin_ before it blocks on the event fd. A fixed
// spin pays on an idle machine (a small message's answer comes within microseconds, and
// blocking adds a wake-up) but costs on a loaded one: a rank that spins while its peer waits
// for a core delays the very answer it waits for. So the budget follows how long waits take,
// as an adaptive mutex's spin count does: a wait that ended within the budget leaves it; one
// that ended later but within the limit (a longer spin would have caught it) raises it to
// twice that wait; one longer than the limit (the peer is busy or descheduled: spinning
// cannot help) halves it, down to kMinSpin. Ping-pong of small messages settles at about
// twice their round trip; a loaded machine's long waits bring it down to blocking at once.
void UcxPointToPoint::AdaptSpin(absl::Duration waited) {
  if (spin_limit_ <= kMinSpin) {
    spin_ = spin_limit_;
  } else if (waited <= spin_) {
    // Caught by the spin: keep the budget.
  } else if (waited <= spin_limit_) {
    spin_ = std::min(spin_limit_, 2 * waited);
  } else {
    spin_ = std::max(kMinSpin, spin_ / 2);
  }
}

void UcxPointToPoint::Abort(absl::Status reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (abort_reason_.ok()) abort_reason_ = std::move(reason);
  }
  aborted_.store(true, std::memory_order_release);
  ucp_worker_signal(worker_);  // thread-safe: wakes a blocked poll
}

std::string UcxPointToPoint::Describe() const {
  if (size_ == 1) return "ucx (single rank: no peers)";
  if (describe_cache_.empty()) describe_cache_ = DescribeEndpoints(eps_);
  return describe_cache_;
}

uint64_t UcxPointToPoint::DropStray(uint32_t seq, uint64_t limit) {
  // Any pair field and slot under this sequence number. UCX's tag API has no discard, so a
  // message is received into `stray_` (truncated past its size: UCX then writes no more and
  // fails the receive, which nobody looks at) and its request released at once.
  const ucp_tag_t tag = EncodeUcxTag(0, Tag{seq, 0});
  const ucp_tag_t mask = EncodeUcxTag(0, Tag{~uint32_t{0}, 0});
  constexpr size_t kStrayBytes = 64 << 10;
  uint64_t dropped = 0;
  while (dropped < limit) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, tag, mask, /*remove=*/1, &info);
    if (msg == nullptr) break;
    if (stray_.empty()) stray_.resize(kStrayBytes);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_contig(1);
    void* r = ucp_tag_msg_recv_nbx(worker_, stray_.data(), std::min(info.length, stray_.size()),
                                   msg, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);  // released when done
    ++dropped;
  }
  if (dropped > 0) {
    // The first few only: a flood would otherwise flood the log (the statistics count all).
    LOG_FIRST_N(WARNING, 5) << "rank " << rank_ << ": dropped " << dropped
                            << " message(s) under collective #" << seq
                            << " that no rank of this job sent (tags not keyed by this job's "
                               "secret?); TransportStats::stray_messages_dropped counts them";
  }
  return dropped;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PointToPoint>> ConnectPointToPoint(
    std::unique_ptr<WorkerImpl> worker, std::vector<PeerAddress> peers) {
  auto p2p = std::make_unique<UcxPointToPoint>(std::move(worker), std::move(peers));
  BRAID_RETURN_IF_ERROR(p2p->Connect());
  return std::unique_ptr<PointToPoint>(std::move(p2p));
}

}  // namespace braid::transport::ucx
