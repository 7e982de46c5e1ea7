#include "coordinator/server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/grpc_status.h"
#include "coordinator/negotiation.h"
#include "coordinator/rendezvous.h"
#include "glog/logging.h"
#include "proto/braid.grpc.pb.h"

namespace braid::coordinator {
namespace {

// Messages waiting to be written to one rank's negotiation stream. The stream's writer
// thread drains it, so the service never blocks on a slow rank while holding its lock.
class Outbox {
 public:
  void Push(proto::ResponseList msg) {
    absl::MutexLock lock(&mu_);
    if (!closed_) queue_.push_back(std::move(msg));
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Next message, or false once closed and drained.
  bool Pop(proto::ResponseList* out) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Outbox* o) { return o->closed_ || !o->queue_.empty(); }, this));
    if (queue_.empty()) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    return true;
  }

 private:
  absl::Mutex mu_;
  std::deque<proto::ResponseList> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class Service final : public proto::Coordinator::Service {
 public:
  explicit Service(const ServerOptions& o) : opts_(o), size_(o.world_size), start_(absl::Now()) {}

  grpc::Status Register(grpc::ServerContext* ctx, const proto::RegisterRequest* req,
                        proto::RegisterResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (!opts_.job_secret.empty() && req->job_secret() != opts_.job_secret) {
      return ToGrpcStatus(absl::PermissionDeniedError(absl::StrCat(
          "pid ", req->pid(), " on ", req->host(), " presented the wrong job secret")));
    }
    if (formed_) {
      // A rank that shut down may come back (init after shutdown) before its peers have
      // left: the new job forms once every rank of the old one has shut down or was lost.
      absl::Time until = absl::Now() + opts_.register_timeout;
      auto old_job_over = [this]() {
        mu_.AssertHeld();
        if (!formed_) return true;
        for (const RankState& rs : ranks_) {
          if (rs.state != "shut down" && rs.state != "lost") return false;
        }
        return true;
      };
      while (!old_job_over() && !ctx->IsCancelled() && absl::Now() < until) {
        cv_.WaitWithDeadline(&mu_, std::min(until, absl::Now() + absl::Milliseconds(200)));
      }
      if (!old_job_over()) {
        return ToGrpcStatus(absl::FailedPreconditionError(
            "a job is already running on this coordinator"));
      }
      if (formed_) ResetLocked();
    }
    if (size_ == 0) size_ = req->size();
    if (size_ <= 0) {
      return ToGrpcStatus(absl::InvalidArgumentError("world size unknown: set BRAID_SIZE"));
    }
    if (req->size() != 0 && req->size() != size_) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "pid ", req->pid(), " on ", req->host(), " expects world size ", req->size(),
          " but the job has ", size_)));
    }
    const int generation = generation_;
    const int64_t my_id = next_registration_id_++;
    registrations_.push_back(*req);
    registration_ids_.push_back(my_id);
    // Registrations that time out are erased, so find ours by id, never by a saved index.
    auto my_index = [this, my_id]() -> size_t {
      mu_.AssertHeld();
      return static_cast<size_t>(
          std::find(registration_ids_.begin(), registration_ids_.end(), my_id) -
          registration_ids_.begin());
    };
    absl::Time deadline = absl::Now() + opts_.register_timeout;
    auto complete = [this, generation]() {
      mu_.AssertHeld();
      return generation_ != generation || formed_ ||
             static_cast<int>(registrations_.size()) >= size_;
    };
    while (!complete() && !ctx->IsCancelled() && absl::Now() < deadline) {
      cv_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(200)));
    }
    if (generation_ != generation) return ToGrpcStatus(absl::AbortedError("coordinator reset"));
    if (!formed_ && static_cast<int>(registrations_.size()) < size_) {
      size_t got = registrations_.size();
      size_t index = my_index();
      registrations_.erase(registrations_.begin() + index);
      registration_ids_.erase(registration_ids_.begin() + index);
      return ToGrpcStatus(absl::DeadlineExceededError(absl::StrCat(
          "only ", got, " of ", size_, " ranks registered within ",
          absl::FormatDuration(opts_.register_timeout))));
    }
    if (!formed_) {
      auto assigned = AssignRanks(registrations_, size_);
      formed_ = true;
      assign_status_ = assigned.status();
      if (assigned.ok()) assigned_ = *std::move(assigned);
      int64_t threshold = 0;
      int cache_capacity = 0;
      for (size_t i = 0; i < assigned_.size(); ++i) {
        if (assigned_[i].rank() != 0) continue;
        threshold = registrations_[i].fusion_threshold_bytes();
        cache_capacity = registrations_[i].cache_capacity();
      }
      table_ = std::make_unique<NegotiationTable>(size_, threshold, cache_capacity);
      stall_check_ = opts_.stall_check;
      stall_shutdown_ = opts_.stall_shutdown;
      for (size_t i = 0; i < assigned_.size(); ++i) {
        if (assigned_[i].rank() != 0) continue;
        if (registrations_[i].stall_check_ms() > 0) {
          stall_check_ = absl::Milliseconds(registrations_[i].stall_check_ms());
        }
        stall_shutdown_ = absl::Milliseconds(registrations_[i].stall_shutdown_ms());
      }
      stall_logged_.clear();
      ranks_.assign(size_, RankState{});
      for (size_t i = 0; i < assigned_.size(); ++i) {
        RankState& rs = ranks_[assigned_[i].rank()];
        rs.host = registrations_[i].host();
        rs.pid = registrations_[i].pid();
        rs.state = "registered";
        rs.last_seen = absl::Now();
      }
      cv_.SignalAll();
    }
    if (!assign_status_.ok()) return ToGrpcStatus(assign_status_);
    *resp = assigned_[my_index()];
    return grpc::Status::OK;
  }

  grpc::Status KeyValueSet(grpc::ServerContext*, const proto::KeyValueSetRequest* req,
                           proto::KeyValueSetResponse*) override {
    absl::MutexLock lock(&mu_);
    kv_[req->key()] = req->value();
    cv_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status KeyValueGet(grpc::ServerContext* ctx, const proto::KeyValueGetRequest* req,
                           proto::KeyValueGetResponse* resp) override {
    absl::MutexLock lock(&mu_);
    absl::Time deadline = absl::Now() + absl::Milliseconds(req->timeout_ms());
    while (!kv_.count(req->key()) && !ctx->IsCancelled() && absl::Now() < deadline) {
      cv_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(200)));
    }
    auto it = kv_.find(req->key());
    resp->set_found(it != kv_.end());
    if (it != kv_.end()) resp->set_value(it->second);
    return grpc::Status::OK;
  }

  grpc::Status Negotiate(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<proto::ResponseList, proto::RequestList>* stream) override {
    proto::RequestList msg;
    if (!stream->Read(&msg)) return grpc::Status::OK;
    const int rank = msg.rank();
    auto outbox = std::make_shared<Outbox>();
    {
      absl::MutexLock lock(&mu_);
      if (!formed_ || rank < 0 || rank >= size_) {
        return ToGrpcStatus(absl::FailedPreconditionError(
            absl::StrCat("rank ", rank, " opened negotiation before the job formed")));
      }
      outboxes_[rank] = outbox;
      ranks_[rank].state = "negotiating";
      ranks_[rank].last_seen = absl::Now();
      if (!abort_.ok()) outbox->Push(AbortMessage(abort_));
      if (shutting_down_) {
        proto::ResponseList bye;
        bye.set_shutdown(true);
        outbox->Push(bye);
        outbox->Close();
      }
    }
    std::thread writer([&] {
      proto::ResponseList out;
      while (outbox->Pop(&out)) {
        if (!stream->Write(out)) break;
      }
    });
    bool clean = false;
    do {
      if (msg.shutdown()) {
        clean = true;
        break;
      }
      HandleRequests(rank, msg);
    } while (stream->Read(&msg));
    {
      absl::MutexLock lock(&mu_);
      if (auto it = outboxes_.find(rank); it != outboxes_.end() && it->second == outbox) {
        outboxes_.erase(it);
      }
      cv_.SignalAll();
      if (clean) {
        clean_.insert(rank);
        ranks_[rank].state = "shut down";
        // Work the others still wait on from this rank can never complete: fail it now.
        proto::ResponseList rl;
        if (table_) {
          for (auto& r : table_->FailTensorsWaitingFor(clean_)) *rl.add_responses() = std::move(r);
        }
        if (rl.responses_size() > 0) {
          for (auto& [r, box] : outboxes_) box->Push(rl);
        }
      } else if (!shutting_down_ && ranks_[rank].state != "shut down") {
        ranks_[rank].state = "lost";
        AbortLocked(absl::UnavailableError(absl::StrCat(
            "rank ", rank, " (pid ", ranks_[rank].pid, " on ", ranks_[rank].host,
            ") was lost: its connection to the coordinator closed")));
      }
    }
    outbox->Close();
    writer.join();
    (void)ctx;
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* req,
                         proto::HeartbeatResponse*) override {
    absl::MutexLock lock(&mu_);
    if (req->rank() >= 0 && req->rank() < static_cast<int>(ranks_.size())) {
      RankState& rs = ranks_[req->rank()];
      rs.last_seen = absl::Now();
      // Each report holds the rank's cumulative totals, so the newer replaces the older. A
      // report counting fewer reductions than the one kept is older, overtaken in flight
      // (the heartbeat thread's last beat racing the final report from Close()): drop it.
      if (TotalReductions(req->compression()) >= TotalReductions(rs.compression)) {
        rs.compression.assign(req->compression().begin(), req->compression().end());
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext*, const proto::StatusRequest*,
                      proto::StatusResponse* resp) override {
    absl::MutexLock lock(&mu_);
    absl::Time now = absl::Now();
    resp->set_size(size_);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      proto::RankStatus* s = resp->add_ranks();
      s->set_rank(static_cast<int>(r));
      s->set_host(ranks_[r].host);
      s->set_pid(ranks_[r].pid);
      s->set_state(ranks_[r].state);
      s->set_last_seen_ms_ago(ranks_[r].last_seen == absl::InfinitePast()
                                  ? -1
                                  : absl::ToInt64Milliseconds(now - ranks_[r].last_seen));
    }
    for (proto::CompressionStat& c : CompressionStatsLocked()) {
      *resp->add_compression() = std::move(c);
    }
    if (table_) {
      resp->set_tensors_negotiated(table_->tensors_negotiated());
      resp->set_bytes_negotiated(table_->bytes_negotiated());
      auto pending = table_->PendingTensors(now);
      resp->set_tensors_pending(static_cast<int64_t>(pending.size()));
      for (const auto& p : pending) {
        proto::PendingTensor* t = resp->add_pending();
        t->set_name(p.name);
        for (int r : p.ready_ranks) t->add_ready_ranks(r);
        for (int r : p.missing_ranks) t->add_missing_ranks(r);
        t->set_waiting_ms(absl::ToInt64Milliseconds(p.waiting));
        t->set_stalled(p.waiting >= stall_check_);
      }
    }
    resp->set_job_state(!abort_.ok() ? absl::StrCat("aborted: ", abort_.message())
                                     : (formed_ ? "running" : "forming"));
    resp->set_cycles(cycles_);
    resp->set_responses_sent(responses_sent_);
    resp->set_uptime_ms(absl::ToInt64Milliseconds(now - start_));
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext*, const proto::ShutdownRequest* req,
                        proto::ShutdownResponse*) override {
    absl::MutexLock lock(&mu_);
    shutdown_requested_ = true;
    cv_.SignalAll();
    return grpc::Status::OK;
  }

  // Ends every stream with a shutdown message.
  void BeginShutdown() {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    proto::ResponseList bye;
    bye.set_shutdown(true);
    for (auto& [rank, box] : outboxes_) {
      box->Push(bye);
      box->Close();
    }
    cv_.SignalAll();
  }

  // Blocks until a Shutdown RPC arrives or `stop` is set.
  void WaitForShutdownRequest(const std::atomic<bool>* stop) {
    absl::MutexLock lock(&mu_);
    while (!shutdown_requested_ && !*stop) {
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(250));
      MonitorHeartbeatsLocked();
      InspectStallsLocked();
    }
  }
  void Wake() {
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
  }

 private:
  struct RankState {
    std::string host;
    int64_t pid = 0;
    std::string state = "unregistered";
    absl::Time last_seen = absl::InfinitePast();
    // The rank's latest per-method byte counters (from its heartbeats), cumulative.
    std::vector<proto::MethodBytes> compression;
  };

  template <typename Reports>
  static int64_t TotalReductions(const Reports& reports) {
    int64_t n = 0;
    for (const proto::MethodBytes& m : reports) n += m.reductions();
    return n;
  }

  // One row per method, by method: what was negotiated (one rank's share) merged with what
  // the ranks reported (summed over them). See CompressionStat in proto/braid.proto.
  std::vector<proto::CompressionStat> CompressionStatsLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::map<std::string, proto::CompressionStat> by_method;
    if (table_) {
      for (const auto& [method, counts] : table_->by_compression()) {
        proto::CompressionStat& c = by_method[method];
        c.set_tensors(counts.first);
        c.set_bytes_before(counts.second);
      }
    }
    for (const RankState& rs : ranks_) {
      for (const proto::MethodBytes& m : rs.compression) {
        proto::CompressionStat& c = by_method[m.method()];
        c.set_reductions(c.reductions() + m.reductions());
        c.set_uncompressed_bytes(c.uncompressed_bytes() + m.uncompressed_bytes());
        c.set_payload_bytes(c.payload_bytes() + m.payload_bytes());
        c.set_transport_bytes(c.transport_bytes() + m.transport_bytes());
        c.set_reference_transport_bytes(c.reference_transport_bytes() +
                                        m.reference_transport_bytes());
        c.set_ranks_reporting(c.ranks_reporting() + 1);
      }
    }
    std::vector<proto::CompressionStat> out;
    out.reserve(by_method.size());
    for (auto& [method, c] : by_method) {
      c.set_method(method);
      if (c.ranks_reporting() > 0) {
        c.set_bytes_after(c.payload_bytes() / c.ranks_reporting());
        c.set_ratio(c.payload_bytes() == 0 ? 0.0
                                           : static_cast<double>(c.uncompressed_bytes()) /
                                                 static_cast<double>(c.payload_bytes()));
      } else {
        // No rank reported yet (or a client that does not report): only "none" is known
        // from negotiation alone, its payload being the tensor itself.
        c.set_bytes_after(method == "none" ? c.bytes_before() : 0);
        c.set_ratio(method == "none" ? 1.0 : 0.0);
      }
      out.push_back(std::move(c));
    }
    return out;
  }

  static proto::ResponseList AbortMessage(const absl::Status& s) {
    proto::ResponseList rl;
    rl.set_abort_message(std::string(s.message()));
    rl.set_abort_code(static_cast<int>(s.code()));
    return rl;
  }

  void HandleRequests(int rank, const proto::RequestList& msg) {
    absl::MutexLock lock(&mu_);
    ranks_[rank].last_seen = absl::Now();
    ++cycles_;
    std::vector<proto::Response> ready = table_->Submit(rank, msg);
    for (auto& r : table_->FailTensorsWaitingFor(clean_)) ready.push_back(std::move(r));
    if (ready.empty()) return;
    proto::ResponseList rl;
    for (auto& r : ready) *rl.add_responses() = std::move(r);
    for (int32_t id : table_->TakeEvictions()) rl.add_evicted_cache_ids(id);
    responses_sent_ += rl.responses_size();
    // Pushed under the lock: every outbox receives the same sequence.
    for (auto& [r, box] : outboxes_) box->Push(rl);
  }

  void AbortLocked(const absl::Status& s) {
    if (!abort_.ok()) return;
    abort_ = s;
    LOG(WARNING) << "coordinator: aborting the job: " << s.message();
    proto::ResponseList rl = AbortMessage(s);
    for (auto& [r, box] : outboxes_) box->Push(rl);
  }

  void MonitorHeartbeatsLocked() {
    absl::Time now = absl::Now();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      RankState& rs = ranks_[r];
      if (rs.state != "negotiating" || now - rs.last_seen < opts_.heartbeat_timeout) continue;
      rs.state = "lost";
      AbortLocked(absl::UnavailableError(absl::StrCat(
          "rank ", r, " (pid ", rs.pid, " on ", rs.host, ") was lost: silent for ",
          absl::FormatDuration(now - rs.last_seen), " (BRAID_HEARTBEAT_TIMEOUT_S)")));
    }
  }

  // Note [Stall inspector]: a tensor that some ranks submitted and others did not for
  // stall_check is logged once, naming the ranks on each side (the usual cause: ranks took
  // different code paths). With stall_shutdown > 0 the job is aborted after that long, so
  // every rank's pending and later operations fail with DeadlineExceeded instead of hanging.
  void InspectStallsLocked() {
    if (!table_ || !abort_.ok()) return;
    for (const auto& p : table_->PendingTensors(absl::Now())) {
      if (p.waiting < stall_check_) continue;
      std::string what = absl::StrCat(
          "tensor '", p.name, "' was submitted by rank", p.ready_ranks.size() > 1 ? "s " : " ",
          absl::StrJoin(p.ready_ranks, ", "), " but not by rank",
          p.missing_ranks.size() > 1 ? "s " : " ", absl::StrJoin(p.missing_ranks, ", "),
          " for ", absl::FormatDuration(absl::Trunc(p.waiting, absl::Seconds(1))));
      if (stall_logged_.insert(p.name).second) LOG(WARNING) << "coordinator: stall: " << what;
      if (stall_shutdown_ > absl::ZeroDuration() && p.waiting >= stall_shutdown_) {
        AbortLocked(absl::DeadlineExceededError(absl::StrCat(
            "stalled: ", what, " (BRAID_STALL_SHUTDOWN_S=",
            absl::ToDoubleSeconds(stall_shutdown_), ")")));
        return;
      }
    }
  }

  void ResetLocked() {
    ++generation_;
    registrations_.clear();
    registration_ids_.clear();
    assigned_.clear();
    assign_status_ = absl::OkStatus();
    formed_ = false;
    clean_.clear();
    kv_.clear();
    table_.reset();
    for (RankState& rs : ranks_) rs.compression.clear();  // the old job's reports
    abort_ = absl::OkStatus();
    size_ = opts_.world_size;
    cv_.SignalAll();
  }

  const ServerOptions opts_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  int size_ ABSL_GUARDED_BY(mu_);
  const absl::Time start_;
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<proto::RegisterRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> registration_ids_ ABSL_GUARDED_BY(mu_);  // parallel to registrations_
  int64_t next_registration_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<proto::RegisterResponse> assigned_ ABSL_GUARDED_BY(mu_);
  absl::Status assign_status_ ABSL_GUARDED_BY(mu_);
  bool formed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> clean_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<NegotiationTable> table_ ABSL_GUARDED_BY(mu_);
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<Outbox>> outboxes_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  int64_t responses_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cycles_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration stall_check_ ABSL_GUARDED_BY(mu_);
  absl::Duration stall_shutdown_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> stall_logged_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
};

class GrpcCoordinatorServer final : public CoordinatorServer {
 public:
  explicit GrpcCoordinatorServer(const ServerOptions& o) : opts_(o), service_(o) {}
  ~GrpcCoordinatorServer() override {
    Shutdown(absl::Milliseconds(200));
    if (watcher_.joinable()) watcher_.join();
  }

  absl::Status Start() {
    grpc::ServerBuilder builder;
    const std::string addr = absl::StrCat(opts_.bind_address, ":", opts_.port);
    builder.AddListeningPort(addr, grpc::InsecureServerCredentials(), &port_);
    // A second coordinator must not silently share the port (TRAPS.md).
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // Ranks keep their streams alive with pings; permit them.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      return absl::UnavailableError(absl::StrCat(
          "coordinator cannot listen on ", addr, " (address in use or not local)"));
    }
    watcher_ = std::thread([this] {
      service_.WaitForShutdownRequest(&stop_watcher_);
      if (!stop_watcher_) Shutdown(absl::Seconds(1));
    });
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  std::string address() const override { return absl::StrCat(opts_.bind_address, ":", port_); }

  void Shutdown(absl::Duration grace) override {
    {
      absl::MutexLock lock(&shutdown_mu_);
      if (server_ == nullptr || stopped_) return;
      stopped_ = true;
    }
    // Not under shutdown_mu_: the watcher thread may be calling Shutdown() too.
    service_.BeginShutdown();
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
    stop_watcher_ = true;
    service_.Wake();
    done_.Notify();
  }

  void Wait() override { done_.WaitForNotification(); }

 private:
  ServerOptions opts_;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread watcher_;
  std::atomic<bool> stop_watcher_{false};
  absl::Mutex shutdown_mu_;
  bool stopped_ = false;
  absl::Notification done_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> StartCoordinator(const ServerOptions& options) {
  auto server = std::make_unique<GrpcCoordinatorServer>(options);
  absl::Status s = server->Start();
  if (!s.ok()) return s;
  return std::unique_ptr<CoordinatorServer>(std::move(server));
}

}  // namespace braid::coordinator
