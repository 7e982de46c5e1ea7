// UCX backend of transport::Communicator. See ucx_communicator.h for the algorithms and
// the progress/failure model; Note [Ring pipeline] below for the all-reduce engine.
#include "transport/ucx_communicator.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/reduce.h"
#include "transport/ring_schedule.h"

namespace braid::transport {
namespace {

// Tag layout (matched with a full mask): | seq:24 | slot:24 | source rank:16 |.
// `seq` numbers collectives (identical on every rank), `slot` the step/chunk inside one.
constexpr int kRankBits = 16;
constexpr int kSlotBits = 24;
constexpr uint64_t kSlotMask = (uint64_t{1} << kSlotBits) - 1;
constexpr uint64_t kSeqMask = (uint64_t{1} << 24) - 1;
constexpr int kMaxPieces = 4096;

uint64_t MakeTag(uint64_t seq, uint64_t slot, int src) {
  return ((seq & kSeqMask) << (kSlotBits + kRankBits)) | ((slot & kSlotMask) << kRankBits) |
         static_cast<uint64_t>(src);
}

std::string HostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// True when process `pid` on this host is gone (or a zombie nobody reaped yet).
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

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::InternalError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// What a peer publishes in the store: host, pid and its worker address.
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

class UcxCommunicator final : public Communicator {
 public:
  explicit UcxCommunicator(const UcxOptions& o) : opts_(o), rank_(o.rank), size_(o.size) {}
  ~UcxCommunicator() override;

  // Creates the context and the worker; self() is then known.
  absl::Status OpenWorker();
  // Connects to `peers` (rank order, this rank's among them).
  absl::Status Connect(std::vector<PeerAddress> peers);
  const PeerAddress& self() const { return self_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override;
  absl::Status ReduceScatter(const void* send, void* recv, absl::Span<const size_t> recv_counts,
                             DataType dtype, ReduceOp op) override;
  absl::Status AllGather(const void* send, size_t send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes) override;
  absl::Status AllToAll(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                        absl::Span<const size_t> recv_bytes) override;
  absl::Status Broadcast(void* buf, size_t bytes, int root) override;
  absl::Status Barrier() override;
  void Abort(absl::Status reason) override;
  TransportStats stats() const override { return stats_; }
  std::string Describe() const override;

 private:
  // One posted tag send or receive. `ptr` is UCX's request while in flight.
  struct Req {
    void* ptr = nullptr;
    bool active = false;  // posted and not yet completed
    bool is_recv = false;
    int peer = -1;
    size_t bytes = 0;
  };

  // Note [Ring pipeline]
  // Reduce-scatter then all-gather, pipelined: every segment is cut into the same number P
  // of pieces, and piece j moves through its stages on its own (at most `ring_window`
  // pieces in flight, so their scratch stays in cache), so piece j's next stage starts as
  // soon as its last one finished while other pieces are still in flight. The
  // reduce-scatter stage is direct: each rank receives its own segment's piece from every
  // peer and reduces them in the canonical order (Note [Canonical reduction order]); it
  // sends (n-1)/n of the buffer, like the ring's n-1 steps. The owned piece is written
  // straight to the output (out = reduce(inputs), so an out-of-place call never copies its
  // input first). The all-gather stage is a ring of n-1 steps whose receives land in the
  // output directly.
  struct RingArgs {
    const char* send = nullptr;   // the caller's input, full layout
    char* work = nullptr;         // full-layout buffer the partial reductions go to
    char* owned_out = nullptr;    // where the owned segment's final reduction goes
    std::vector<Span1D> segments; // in elements
    size_t elem = 1;
    DataType dtype = DataType::kUInt8;
    ReduceOp op = ReduceOp::kSum;
    bool reduce_scatter = true;
    bool all_gather = true;
    int shift = 0;
  };

  absl::Status CheckUsable();
  absl::Status Fail(absl::Status s);
  absl::Status PostSend(Req& r, int peer, const void* buf, size_t bytes, uint64_t tag);
  absl::Status PostRecv(Req& r, int peer, void* buf, size_t bytes, uint64_t tag);
  // True once `r` has completed (successfully); an error if it failed.
  absl::StatusOr<bool> Test(Req& r);
  // Drives the worker until `step` reports completion. `step` checks requests and advances
  // the algorithm's state; it returns true when the collective is done.
  absl::Status Drive(const std::function<absl::StatusOr<bool>()>& step);
  absl::Status WaitAll(std::vector<Req>& reqs);
  // Cancels and releases requests still in flight after a failure.
  void Release(std::vector<Req>& reqs);
  absl::Status CheckPeers();

  absl::Status RunRing(const RingArgs& a);
  absl::Status RecursiveDoubling(const char* send, char* recv, size_t count, DataType dtype,
                                 ReduceOp op);
  char* Scratch(size_t bytes);
  char* Work(size_t bytes);
  uint64_t NextSeq() { return seq_++; }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxOptions opts_;
  int rank_;
  int size_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<ucp_ep_h> eps_;
  PeerAddress self_;
  std::vector<PeerAddress> peers_;
  std::vector<std::pair<UcxCommunicator*, int>> ep_args_;  // err-handler argument per peer
  absl::Duration spin_;
  uint64_t seq_ = 0;
  uint64_t completions_ = 0;
  TransportStats stats_;
  std::vector<char> scratch_;  // grow-only: receive staging
  std::vector<char> work_;     // grow-only: reduce-scatter partial sums
  absl::Status sticky_;        // first failure; owned by the worker thread

  // Set from any thread by Abort().
  std::atomic<bool> aborted_{false};
  mutable absl::Mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);

  // Peers whose endpoint reported an error (set inside ucp_worker_progress).
  std::vector<std::pair<int, ucs_status_t>> ep_failures_;
  mutable std::string describe_cache_;
};

absl::Status UcxCommunicator::OpenWorker() {
  // Peer error handling turns the shared-memory transports off unless they are allowed to
  // handle errors themselves. Only needed when local peers use it too.
  if (opts_.peer_error_handling) {
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
  }
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError("ucp_config_read", st);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.estimated_num_eps = static_cast<size_t>(std::max(size_, 1));
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcxError("ucp_init", st);

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
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

absl::Status UcxCommunicator::Connect(std::vector<PeerAddress> peers) {
  const int n = static_cast<int>(peers.size());
  if (rank_ < 0) {  // assigned by the coordinator: this rank is the one with our address
    for (int p = 0; p < n && rank_ < 0; ++p) {
      if (peers[p].address == self_.address) rank_ = p;
    }
  }
  if (size_ <= 0) size_ = n;
  if (size_ < 1 || rank_ < 0 || rank_ >= size_ || n != size_) {
    return absl::InvalidArgumentError(absl::StrCat("invalid rank ", rank_, " for world size ",
                                                   size_, " with ", n, " peer addresses"));
  }
  if (size_ > (1 << kRankBits)) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", size_, " exceeds 65536"));
  }
  if (peers[rank_].address != self_.address) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer address ", rank_, " is not this rank's worker"));
  }
  peers_ = std::move(peers);
  eps_.assign(size_, nullptr);
  ep_args_.resize(size_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    ep_args_[p] = {this, p};
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peers_[p].address.data());
    // Note [Local peers and CMA]: in UCX 1.13 peer error handling drops the cma
    // rendezvous lane, which makes every large intra-host message cost two copies
    // through a shared-memory bounce buffer instead of one process_vm_readv. Peers on
    // this host are watched through /proc instead (CheckPeers), so they use the default
    // mode unless options.peer_error_handling forces it; remote peers always use it.
    const bool local = peers_[p].host == self_.host;
    ep.err_mode = (local && !opts_.peer_error_handling) ? UCP_ERR_HANDLING_MODE_NONE
                                                        : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxCommunicator::OnEndpointError;
    ep.err_handler.arg = &ep_args_[p];
    ucs_status_t st = ucp_ep_create(worker_, &ep, &eps_[p]);
    if (st != UCS_OK) return UcxError(absl::StrCat("ucp_ep_create to rank ", p), st);
  }
  if (opts_.spin < absl::ZeroDuration()) {
    int local = 0;
    for (const auto& p : peers_) local += p.host == self_.host ? 1 : 0;
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    // Over-subscribed ranks must not burn the core a peer needs.
    spin_ = static_cast<unsigned>(local) <= cores ? absl::Microseconds(50) : absl::ZeroDuration();
  } else {
    spin_ = opts_.spin;
  }
  return absl::OkStatus();
}

UcxCommunicator::~UcxCommunicator() {
  if (worker_ != nullptr) {
    // No closing barrier: a collective completes on this rank only once its sends have
    // completed (a rendezvous send completes after the peer pulled the data), so nothing a
    // peer still needs from us is in flight. A barrier here would make every rank's
    // shutdown wait for the slowest peer's, or hang on one that aborted.
    std::vector<void*> closing;
    for (ucp_ep_h ep : eps_) {
      if (ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = sticky_.ok() ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(ep, &p);
      if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing.push_back(req);
    }
    absl::Time deadline = absl::Now() + absl::Milliseconds(500);
    for (void* req : closing) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS && absl::Now() < deadline) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(req);
    }
    ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxCommunicator::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* a = static_cast<std::pair<UcxCommunicator*, int>*>(arg);
  a->first->ep_failures_.emplace_back(a->second, status);
}

void UcxCommunicator::Abort(absl::Status reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (abort_reason_.ok()) abort_reason_ = std::move(reason);
  }
  aborted_.store(true, std::memory_order_release);
  if (worker_ != nullptr) ucp_worker_signal(worker_);  // thread-safe: wakes a blocked poll
}

absl::Status UcxCommunicator::Fail(absl::Status s) {
  if (sticky_.ok()) sticky_ = s;
  return sticky_;
}

absl::Status UcxCommunicator::CheckUsable() {
  if (aborted_.load(std::memory_order_acquire)) {
    absl::MutexLock lock(&abort_mu_);
    return Fail(abort_reason_);
  }
  if (!ep_failures_.empty()) {
    const auto& [peer, st] = ep_failures_.front();
    return Fail(absl::UnavailableError(
        absl::StrCat("rank ", rank_, ": lost connection to rank ", peer, " (pid ",
                     peers_[peer].pid, " on ", peers_[peer].host, "): ", ucs_status_string(st))));
  }
  return sticky_;
}

absl::Status UcxCommunicator::CheckPeers() {
  const std::string& me = peers_[rank_].host;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || peers_[p].host != me) continue;
    if (ProcessGone(peers_[p].pid)) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "rank ", rank_, ": rank ", p, " (pid ", peers_[p].pid, " on ", peers_[p].host,
          ") has exited")));
    }
  }
  return absl::OkStatus();
}

absl::Status UcxCommunicator::PostSend(Req& r, int peer, const void* buf, size_t bytes,
                                       uint64_t tag) {
  static char empty;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  void* req = ucp_tag_send_nbx(eps_[peer], bytes ? buf : &empty, bytes, tag, &p);
  if (UCS_PTR_IS_ERR(req)) {
    return Fail(absl::UnavailableError(absl::StrCat("rank ", rank_, ": send to rank ", peer,
                                                    " failed: ",
                                                    ucs_status_string(UCS_PTR_STATUS(req)))));
  }
  stats_.bytes_sent += bytes;
  stats_.messages_sent += 1;
  r = Req{req, req != nullptr, false, peer, bytes};
  if (req == nullptr) ++completions_;
  return absl::OkStatus();
}

absl::Status UcxCommunicator::PostRecv(Req& r, int peer, void* buf, size_t bytes,
                                       uint64_t tag) {
  static char empty;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  void* req = ucp_tag_recv_nbx(worker_, bytes ? buf : &empty, bytes, tag, ~uint64_t{0}, &p);
  if (UCS_PTR_IS_ERR(req)) {
    return Fail(UcxError(absl::StrCat("rank ", rank_, ": receive from rank ", peer),
                         UCS_PTR_STATUS(req)));
  }
  stats_.bytes_received += bytes;
  r = Req{req, req != nullptr, true, peer, bytes};
  if (req == nullptr) ++completions_;
  return absl::OkStatus();
}

absl::StatusOr<bool> UcxCommunicator::Test(Req& r) {
  if (!r.active) return true;
  ucs_status_t st;
  size_t got = r.bytes;
  if (r.is_recv) {
    ucp_tag_recv_info_t info{};
    st = ucp_tag_recv_request_test(r.ptr, &info);
    got = info.length;
  } else {
    st = ucp_request_check_status(r.ptr);
  }
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(r.ptr);
  r.active = false;
  r.ptr = nullptr;
  ++completions_;
  if (st == UCS_ERR_CANCELED) {
    BRAID_RETURN_IF_ERROR(CheckUsable());
    return Fail(absl::CancelledError("operation cancelled"));
  }
  if (st != UCS_OK) {
    if (st == UCS_ERR_MESSAGE_TRUNCATED) {
      return Fail(absl::InternalError(absl::StrCat(
          "rank ", rank_, ": message from rank ", r.peer, " longer than the ", r.bytes,
          " bytes expected (ranks called different collectives or sizes)")));
    }
    return Fail(absl::UnavailableError(absl::StrCat(
        "rank ", rank_, ": ", r.is_recv ? "receive from" : "send to", " rank ", r.peer,
        " failed: ", ucs_status_string(st))));
  }
  if (r.is_recv && got != r.bytes) {
    return Fail(absl::InternalError(absl::StrCat(
        "rank ", rank_, ": received ", got, " bytes from rank ", r.peer, ", expected ", r.bytes,
        " (ranks called different collectives or sizes)")));
  }
  return true;
}

void UcxCommunicator::Release(std::vector<Req>& reqs) {
  for (Req& r : reqs) {
    if (!r.active) continue;
    if (r.is_recv) ucp_request_cancel(worker_, r.ptr);
  }
  absl::Time deadline = absl::Now() + absl::Seconds(1);
  for (Req& r : reqs) {
    if (!r.active) continue;
    while (r.is_recv && ucp_request_check_status(r.ptr) == UCS_INPROGRESS &&
           absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(r.ptr);  // a send still in flight is released when it completes
    r.active = false;
  }
}

absl::Status UcxCommunicator::Drive(const std::function<absl::StatusOr<bool>()>& step) {
  absl::Time last_progress = absl::Now();
  absl::Time next_peer_check = last_progress + absl::Milliseconds(500);
  uint64_t seen = completions_;
  while (true) {
    while (ucp_worker_progress(worker_) != 0) {
    }
    BRAID_ASSIGN_OR_RETURN(bool done, step());
    if (done) return absl::OkStatus();
    BRAID_RETURN_IF_ERROR(CheckUsable());
    absl::Time now = absl::Now();
    if (completions_ != seen) {
      seen = completions_;
      last_progress = now;
      continue;
    }
    if (now - last_progress < spin_) continue;
    if (now >= next_peer_check) {
      BRAID_RETURN_IF_ERROR(CheckPeers());
      next_peer_check = now + absl::Milliseconds(500);
    }
    if (now - last_progress >= opts_.timeout) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, ": collective #", seq_ - 1, " made no progress for ",
          absl::FormatDuration(opts_.timeout), " (BRAID_TIMEOUT_S)")));
    }
    ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
    if (st != UCS_OK) return Fail(UcxError("ucp_worker_arm", st));
    absl::Duration wait = std::min({absl::Milliseconds(200), opts_.timeout - (now - last_progress),
                                    next_peer_check - now});
    pollfd pfd{efd_, POLLIN, 0};
    poll(&pfd, 1, static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(wait))));
  }
}

absl::Status UcxCommunicator::WaitAll(std::vector<Req>& reqs) {
  absl::Status s = Drive([&]() -> absl::StatusOr<bool> {
    bool all = true;
    for (Req& r : reqs) {
      BRAID_ASSIGN_OR_RETURN(bool done, Test(r));
      all = all && done;
    }
    return all;
  });
  if (!s.ok()) Release(reqs);
  return s;
}

char* UcxCommunicator::Scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);  // value-initialised: pages touched once
  return scratch_.data();
}

char* UcxCommunicator::Work(size_t bytes) {
  if (work_.size() < bytes) work_.resize(bytes);
  return work_.data();
}

absl::Status UcxCommunicator::RunRing(const RingArgs& a) {
  const int n = size_;
  const uint64_t seq = NextSeq();
  const int right = (rank_ + 1) % n, left = (rank_ - 1 + n) % n;
  std::vector<RingStep> ag;  // the all-gather steps
  if (a.all_gather) {
    for (const RingStep& s : RingSchedule(rank_, n, a.shift)) {
      if (s.phase == RingStep::kAllGather) ag.push_back(s);
    }
  }
  auto owner_segment = [&](int p) { return RingOwnedSegment(p, n, a.shift); };
  const int owned = owner_segment(rank_);
  size_t max_seg = 0;
  for (const Span1D& s : a.segments) max_seg = std::max(max_seg, s.count);
  const int pieces = RingPieces(max_seg * a.elem, opts_.chunk_bytes, kMaxPieces);
  std::vector<std::vector<Span1D>> piece_of(n);
  for (int s = 0; s < n; ++s) piece_of[s] = SplitSpan(a.segments[s], pieces);
  const size_t stride = (max_seg + pieces - 1) / pieces;  // largest piece, in elements
  const int window = std::max(1, std::min(pieces, opts_.ring_window));
  // Each piece in flight owns one scratch slot holding a piece from every peer.
  const size_t slot_bytes = static_cast<size_t>(n - 1) * stride * a.elem;
  char* scratch = a.reduce_scatter ? Scratch(window * slot_bytes) : nullptr;
  // Stages of a piece: 0 = reduce-scatter (if any), then one per all-gather step.
  const int rs_stages = a.reduce_scatter ? 1 : 0;
  const int total = rs_stages + static_cast<int>(ag.size());
  const ReduceOp base = a.op == ReduceOp::kAverage ? ReduceOp::kSum : a.op;

  struct Piece {
    int stage = 0;
    int slot = -1;
    bool done = false;
  };
  std::vector<Piece> ps(pieces);
  // Requests of a piece's current stage: reduce-scatter has n-1 of each, all-gather one.
  std::vector<std::vector<Req>> sends(pieces), recvs(pieces);
  auto release_all = [&]() {
    for (int j = 0; j < pieces; ++j) {
      Release(sends[j]);
      Release(recvs[j]);
    }
  };
  auto peer_slot = [&](int j, int p) {  // where peer p's contribution to piece j lands
    int k = p < rank_ ? p : p - 1;
    return scratch + ps[j].slot * slot_bytes + static_cast<size_t>(k) * stride * a.elem;
  };

  auto post = [&](int j) -> absl::Status {
    const int stage = ps[j].stage;
    if (stage < rs_stages) {
      // Direct reduce-scatter: every rank sends piece j of each peer's segment to that peer
      // and receives piece j of its own segment from every peer.
      const Span1D& mine = piece_of[owned][j];
      sends[j].assign(n - 1, Req{});
      recvs[j].assign(n - 1, Req{});
      for (int i = 1, k = 0; i < n; ++i, ++k) {
        int from = (rank_ - i + n) % n;
        BRAID_RETURN_IF_ERROR(PostRecv(recvs[j][k], from, peer_slot(j, from), mine.count * a.elem,
                                       MakeTag(seq, j, from)));
      }
      for (int i = 1, k = 0; i < n; ++i, ++k) {
        int to = (rank_ + i) % n;
        const Span1D& theirs = piece_of[owner_segment(to)][j];
        BRAID_RETURN_IF_ERROR(PostSend(sends[j][k], to, a.send + theirs.offset * a.elem,
                                       theirs.count * a.elem, MakeTag(seq, j, rank_)));
      }
      return absl::OkStatus();
    }
    const RingStep& st = ag[stage - rs_stages];
    const Span1D& rp = piece_of[st.recv_segment][j];
    const Span1D& sp = piece_of[st.send_segment][j];
    const uint64_t slot = static_cast<uint64_t>(1 + stage) * pieces + j;
    sends[j].assign(1, Req{});
    recvs[j].assign(1, Req{});
    BRAID_RETURN_IF_ERROR(PostRecv(recvs[j][0], left, a.work + rp.offset * a.elem,
                                   rp.count * a.elem, MakeTag(seq, slot, left)));
    return PostSend(sends[j][0], right, a.work + sp.offset * a.elem, sp.count * a.elem,
                    MakeTag(seq, slot, rank_));
  };

  // Note [Canonical reduction order]: the contributions to an element are combined in one
  // fixed tree whatever the element's position, the message size or the algorithm: the
  // tree recursive doubling uses (ranks paired 2i, 2i+1 below 2*rem, then a balanced
  // binary tree, lower rank first). So a tensor reduces to the same bits whether it is
  // fused with others or not, and whichever algorithm its bucket's size selects.
  auto reduce_piece = [&](int j) {
    const Span1D& mine = piece_of[owned][j];
    char* out = a.owned_out != nullptr
                    ? a.owned_out + (mine.offset - a.segments[owned].offset) * a.elem
                    : a.work + mine.offset * a.elem;
    std::vector<const char*> v(n);
    std::vector<bool> writable(n);
    for (int p = 0; p < n; ++p) {
      v[p] = p == rank_ ? a.send + mine.offset * a.elem : peer_slot(j, p);
      writable[p] = p != rank_;
    }
    RecursiveDoublingRole role = RecursiveDoublingRoleFor(0, n);
    const int p2 = role.p2, rem = n - p2;
    std::vector<const char*> t(p2);
    std::vector<bool> tw(p2);
    int combines_left = n - 1;
    auto combine = [&](const char* lo, bool lo_w, const char* hi, bool hi_w) -> const char* {
      char* dst = --combines_left == 0 ? out
                                       : const_cast<char*>(lo_w ? lo : hi);  // one is scratch
      Reduce3(dst, lo, hi, mine.count, a.dtype, base);
      return dst;
    };
    for (int i = 0; i < p2; ++i) {
      if (i < rem) {
        t[i] = combine(v[2 * i], writable[2 * i], v[2 * i + 1], writable[2 * i + 1]);
        tw[i] = t[i] != out;
      } else {
        t[i] = v[i + rem];
        tw[i] = writable[i + rem];
      }
    }
    for (int width = 1; width < p2; width *= 2) {
      for (int i = 0; i + width < p2; i += 2 * width) {
        t[i] = combine(t[i], tw[i], t[i + width], tw[i + width]);
        tw[i] = t[i] != out;
      }
    }
    if (a.op == ReduceOp::kAverage) DivideInPlace(out, mine.count, a.dtype, size_);
  };

  std::vector<int> free_slots;
  for (int w = window - 1; w >= 0; --w) free_slots.push_back(w);
  int next = 0;  // next piece to start
  auto start_next = [&]() -> absl::Status {
    ps[next].slot = free_slots.back();
    free_slots.pop_back();
    return post(next++);
  };
  for (int w = 0; w < window && total > 0; ++w) {
    absl::Status s = start_next();
    if (!s.ok()) {
      release_all();
      return s;
    }
  }
  int finished = total > 0 ? 0 : pieces;
  int first = 0;  // pieces before it are done
  auto all_done = [&](std::vector<Req>& reqs) -> absl::StatusOr<bool> {
    bool done = true;
    for (Req& r : reqs) {
      BRAID_ASSIGN_OR_RETURN(bool d, Test(r));
      done = done && d;
    }
    return done;
  };
  absl::Status s = Drive([&]() -> absl::StatusOr<bool> {
    for (int j = first; j < next; ++j) {
      Piece& p = ps[j];
      if (p.done) continue;
      BRAID_ASSIGN_OR_RETURN(bool got, all_done(recvs[j]));
      if (!got) continue;
      BRAID_ASSIGN_OR_RETURN(bool sent, all_done(sends[j]));
      if (!sent) continue;
      if (p.stage < rs_stages) reduce_piece(j);
      if (++p.stage == total) {
        p.done = true;
        ++finished;
        free_slots.push_back(p.slot);
        while (first < next && ps[first].done) ++first;
        if (next < pieces) BRAID_RETURN_IF_ERROR(start_next());
      } else {
        BRAID_RETURN_IF_ERROR(post(j));
      }
    }
    return finished == pieces;
  });
  if (!s.ok()) release_all();
  ++stats_.collectives;
  return s;
}

absl::Status UcxCommunicator::RecursiveDoubling(const char* send, char* recv, size_t count,
                                                DataType dtype, ReduceOp op) {
  const size_t bytes = count * DataTypeSize(dtype);
  const uint64_t seq = NextSeq();
  const ReduceOp base = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
  char* tmp = Scratch(bytes);
  RecursiveDoublingRole role = RecursiveDoublingRoleFor(rank_, size_);
  std::vector<Req> reqs(2);
  uint64_t slot = 0;
  // Operands are always combined lower rank first, so every rank computes bit-identical
  // results even for min/max of signed zeros.
  auto exchange = [&](int peer, bool reduce) -> absl::Status {
    BRAID_RETURN_IF_ERROR(PostRecv(reqs[0], peer, tmp, bytes, MakeTag(seq, slot, peer)));
    BRAID_RETURN_IF_ERROR(PostSend(reqs[1], peer, recv, bytes, MakeTag(seq, slot, rank_)));
    ++slot;
    BRAID_RETURN_IF_ERROR(WaitAll(reqs));
    if (reduce) {
      if (peer < rank_) Reduce3(recv, tmp, recv, count, dtype, base);
      else Reduce3(recv, recv, tmp, count, dtype, base);
    }
    return absl::OkStatus();
  };
  // Pre-step: an extra rank hands its data to its odd partner.
  if (role.partner >= 0) {
    slot = 0;
    if (role.new_rank < 0) {
      BRAID_RETURN_IF_ERROR(PostSend(reqs[1], role.partner, recv, bytes, MakeTag(seq, 0, rank_)));
      reqs[0] = Req{};
      BRAID_RETURN_IF_ERROR(WaitAll(reqs));
    } else {
      BRAID_RETURN_IF_ERROR(PostRecv(reqs[0], role.partner, tmp, bytes, MakeTag(seq, 0, role.partner)));
      reqs[1] = Req{};
      BRAID_RETURN_IF_ERROR(WaitAll(reqs));
      Reduce3(recv, tmp, recv, count, dtype, base);  // partner is the lower rank
    }
  }
  slot = 1;
  if (role.new_rank >= 0) {
    for (int mask = 1; mask < role.p2; mask <<= 1) {
      int peer = RecursiveDoublingRealRank(role.new_rank ^ mask, size_);
      BRAID_RETURN_IF_ERROR(exchange(peer, true));
    }
    if (op == ReduceOp::kAverage) DivideInPlace(recv, count, dtype, size_);
  }
  // Post-step: the odd partner returns the result to its extra rank.
  if (role.partner >= 0) {
    uint64_t last = 1 + 64;
    if (role.new_rank < 0) {
      BRAID_RETURN_IF_ERROR(PostRecv(reqs[0], role.partner, recv, bytes, MakeTag(seq, last, role.partner)));
      reqs[1] = Req{};
    } else {
      BRAID_RETURN_IF_ERROR(PostSend(reqs[1], role.partner, recv, bytes, MakeTag(seq, last, rank_)));
      reqs[0] = Req{};
    }
    BRAID_RETURN_IF_ERROR(WaitAll(reqs));
  }
  ++stats_.collectives;
  return absl::OkStatus();
}

absl::Status UcxCommunicator::AllReduce(const void* send, void* recv, size_t count,
                                        DataType dtype, ReduceOp op) {
  BRAID_RETURN_IF_ERROR(CheckUsable());
  BRAID_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  const size_t elem = DataTypeSize(dtype);
  const size_t bytes = count * elem;
  if (size_ == 1) {
    if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    ++stats_.collectives;
    return absl::OkStatus();  // the average of one rank is itself
  }
  if (ChooseAllReduceAlgorithm(bytes, count, size_, opts_.ring_threshold_bytes) ==
      AllReduceAlgorithm::kRecursiveDoubling) {
    return RecursiveDoubling(static_cast<const char*>(send), static_cast<char*>(recv), count,
                             dtype, op);
  }
  RingArgs a;
  a.send = static_cast<const char*>(send);
  a.work = static_cast<char*>(recv);
  a.owned_out = nullptr;
  a.segments = PartitionEven(count, size_);
  a.elem = elem;
  a.dtype = dtype;
  a.op = op;
  return RunRing(a);
}

absl::Status UcxCommunicator::ReduceScatter(const void* send, void* recv,
                                            absl::Span<const size_t> recv_counts,
                                            DataType dtype, ReduceOp op) {
  BRAID_RETURN_IF_ERROR(CheckUsable());
  BRAID_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  if (recv_counts.size() != static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce-scatter needs one count per rank: got ", recv_counts.size(), " for ", size_));
  }
  const size_t elem = DataTypeSize(dtype);
  std::vector<Span1D> segs = PartitionByCounts({recv_counts.begin(), recv_counts.end()});
  if (size_ == 1) {
    if (recv_counts[0] > 0 && send != recv) std::memcpy(recv, send, recv_counts[0] * elem);
    ++stats_.collectives;
    return absl::OkStatus();
  }
  const size_t total = segs.back().offset + segs.back().count;
  RingArgs a;
  a.send = static_cast<const char*>(send);
  a.work = Work(total * elem);
  a.owned_out = static_cast<char*>(recv);
  a.segments = std::move(segs);
  a.elem = elem;
  a.dtype = dtype;
  a.op = op;
  a.all_gather = false;
  a.shift = size_ - 1;  // rank r ends up owning segment r
  return RunRing(a);
}

absl::Status UcxCommunicator::AllGather(const void* send, size_t send_bytes, void* recv,
                                        absl::Span<const size_t> recv_bytes) {
  BRAID_RETURN_IF_ERROR(CheckUsable());
  if (recv_bytes.size() != static_cast<size_t>(size_) || recv_bytes[rank_] != send_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all-gather needs one size per rank with recv_bytes[rank] == send_bytes: got ",
        recv_bytes.size(), " sizes for ", size_, " ranks"));
  }
  std::vector<Span1D> segs = PartitionByCounts({recv_bytes.begin(), recv_bytes.end()});
  char* own = static_cast<char*>(recv) + segs[rank_].offset;
  if (own != send && send_bytes > 0) std::memcpy(own, send, send_bytes);
  if (size_ == 1) {
    ++stats_.collectives;
    return absl::OkStatus();
  }
  RingArgs a;
  a.send = static_cast<const char*>(recv);
  a.work = static_cast<char*>(recv);
  a.segments = std::move(segs);
  a.reduce_scatter = false;
  a.shift = size_ - 1;  // all-gather step 0 sends this rank's own block
  return RunRing(a);
}

absl::Status UcxCommunicator::AllToAll(const void* send, absl::Span<const size_t> send_bytes,
                                       void* recv, absl::Span<const size_t> recv_bytes) {
  BRAID_RETURN_IF_ERROR(CheckUsable());
  if (send_bytes.size() != static_cast<size_t>(size_) ||
      recv_bytes.size() != static_cast<size_t>(size_) || send_bytes[rank_] != recv_bytes[rank_]) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-to-all needs one send and one receive size per rank (", size_,
                     ") with send_bytes[rank] == recv_bytes[rank]"));
  }
  std::vector<Span1D> so = PartitionByCounts({send_bytes.begin(), send_bytes.end()});
  std::vector<Span1D> ro = PartitionByCounts({recv_bytes.begin(), recv_bytes.end()});
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  if (recv_bytes[rank_] > 0) std::memmove(r + ro[rank_].offset, s + so[rank_].offset, recv_bytes[rank_]);
  const uint64_t seq = NextSeq();
  std::vector<Req> reqs(2 * (size_ - 1));
  size_t k = 0;
  absl::Status st;
  for (int i = 1; i < size_ && st.ok(); ++i) {
    int from = (rank_ - i + size_) % size_;
    st = PostRecv(reqs[k++], from, r + ro[from].offset, recv_bytes[from], MakeTag(seq, 0, from));
  }
  for (int i = 1; i < size_ && st.ok(); ++i) {
    int to = (rank_ + i) % size_;
    st = PostSend(reqs[k++], to, s + so[to].offset, send_bytes[to], MakeTag(seq, 0, rank_));
  }
  if (!st.ok()) {
    Release(reqs);
    return st;
  }
  ++stats_.collectives;
  return WaitAll(reqs);
}

absl::Status UcxCommunicator::Broadcast(void* buf, size_t bytes, int root) {
  BRAID_RETURN_IF_ERROR(CheckUsable());
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank of a world of size ", size_));
  }
  ++stats_.collectives;
  if (size_ == 1) return absl::OkStatus();
  const uint64_t seq = NextSeq();
  // Binomial tree over ranks renumbered so the root is 0.
  const int vrank = (rank_ - root + size_) % size_;
  std::vector<Req> reqs(1);
  int mask = 1;
  while (mask < size_) {
    if (vrank & mask) {
      int parent = ((vrank - mask) + root) % size_;
      BRAID_RETURN_IF_ERROR(PostRecv(reqs[0], parent, buf, bytes, MakeTag(seq, 0, parent)));
      BRAID_RETURN_IF_ERROR(WaitAll(reqs));
      break;
    }
    mask <<= 1;
  }
  reqs.clear();
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vrank + mask < size_) {
      reqs.emplace_back();
      int child = (vrank + mask + root) % size_;
      absl::Status st = PostSend(reqs.back(), child, buf, bytes, MakeTag(seq, 0, rank_));
      if (!st.ok()) {
        Release(reqs);
        return st;
      }
    }
  }
  return WaitAll(reqs);
}

absl::Status UcxCommunicator::Barrier() {
  BRAID_RETURN_IF_ERROR(CheckUsable());
  ++stats_.collectives;
  if (size_ == 1) return absl::OkStatus();
  const uint64_t seq = NextSeq();
  // Dissemination barrier (Hensgen, Finkel & Manber 1988): ceil(log2 n) rounds.
  std::vector<Req> reqs(2);
  uint64_t round = 0;
  for (int k = 1; k < size_; k <<= 1, ++round) {
    int to = (rank_ + k) % size_, from = (rank_ - k + size_) % size_;
    BRAID_RETURN_IF_ERROR(PostRecv(reqs[0], from, nullptr, 0, MakeTag(seq, round, from)));
    BRAID_RETURN_IF_ERROR(PostSend(reqs[1], to, nullptr, 0, MakeTag(seq, round, rank_)));
    BRAID_RETURN_IF_ERROR(WaitAll(reqs));
  }
  return absl::OkStatus();
}

std::string UcxCommunicator::Describe() const {
  if (size_ == 1) return "ucx (single rank: no peers)";
  if (!describe_cache_.empty()) return describe_cache_;
  // ucp_ep_print_info prints the endpoint's lanes, e.g.
  //   "#  lane[0]:  8:sysv/memory.0 md[4] ... tag_am" ; keep the transport/device names.
  std::set<std::string> tls;
  for (int p = 0; p < size_; ++p) {
    if (eps_[p] == nullptr) continue;
    char* text = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    if (f == nullptr) continue;
    ucp_ep_print_info(eps_[p], f);
    fclose(f);
    for (absl::string_view line : absl::StrSplit(absl::string_view(text, len), '\n')) {
      size_t lane = line.find("lane[");
      if (lane == absl::string_view::npos) continue;
      size_t colon = line.find(':', lane);
      if (colon == absl::string_view::npos) continue;
      std::vector<absl::string_view> words =
          absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty());
      for (absl::string_view w : words) {
        size_t c = w.find(':');
        size_t slash = w.find('/');
        if (c != absl::string_view::npos && slash != absl::string_view::npos && slash > c) {
          absl::string_view tl = w.substr(c + 1);
          tl = tl.substr(0, tl.find(' '));
          size_t dot = tl.rfind('.');
          if (dot != absl::string_view::npos && dot > tl.find('/')) tl = tl.substr(0, dot);
          tls.insert(std::string(tl));
          break;
        }
      }
    }
    free(text);
  }
  describe_cache_ = absl::StrCat("ucx ", absl::StrJoin(tls, " "));
  return describe_cache_;
}

}  // namespace

absl::StatusOr<UcxOptions> UcxOptionsFromEnv(UcxOptions o) {
  if (const char* v = getenv("BRAID_TIMEOUT_S"); v != nullptr && *v != '\0') {
    double s = 0;
    if (!absl::SimpleAtod(v, &s) || !(s > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("BRAID_TIMEOUT_S must be a positive number of seconds, got '", v, "'"));
    }
    o.timeout = absl::Seconds(s);
  }
  if (const char* v = getenv("BRAID_UCX_PEER_ERROR_HANDLING"); v != nullptr && *v != '\0') {
    if (!absl::SimpleAtob(v, &o.peer_error_handling)) {
      return absl::InvalidArgumentError(
          absl::StrCat("BRAID_UCX_PEER_ERROR_HANDLING must be 0 or 1, got '", v, "'"));
    }
  }
  return o;
}

namespace {

class UcxWorkerImpl final : public UcxWorker {
 public:
  explicit UcxWorkerImpl(std::unique_ptr<UcxCommunicator> comm) : comm_(std::move(comm)) {}
  const PeerAddress& self() const override { return comm_->self(); }
  std::unique_ptr<UcxCommunicator> Take() { return std::move(comm_); }

 private:
  std::unique_ptr<UcxCommunicator> comm_;  // opened, not connected
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> OpenUcxWorker(const UcxOptions& options) {
  auto comm = std::make_unique<UcxCommunicator>(options);
  BRAID_RETURN_IF_ERROR(comm->OpenWorker());
  return std::unique_ptr<UcxWorker>(std::make_unique<UcxWorkerImpl>(std::move(comm)));
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectUcx(std::unique_ptr<UcxWorker> worker,
                                                         std::vector<PeerAddress> peers) {
  auto* impl = dynamic_cast<UcxWorkerImpl*>(worker.get());
  if (impl == nullptr) return absl::InvalidArgumentError("not a worker from OpenUcxWorker");
  std::unique_ptr<UcxCommunicator> comm = impl->Take();
  BRAID_RETURN_IF_ERROR(comm->Connect(std::move(peers)));
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(const UcxOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid rank ", options.rank, " for world size ", options.size));
  }
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
