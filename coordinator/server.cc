// CoordinatorService over gRPC's callback API. Every handler returns a reactor at once: a call
// that must wait (Register until the world is complete, a key-value get, a status wait) is
// finished later by the service's completion callback, and a negotiation stream is a
// ServerBidiReactor whose reads and writes complete on gRPC's own threads. So no thread is
// held per rank or per stream.
#include "coordinator/server.h"

#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/limits.h"
#include "common/secret.h"
#include "coordinator/admission.h"
#include "coordinator/credentials.h"
#include "coordinator/grpc_status.h"
#include "coordinator/monitor.h"
#include "coordinator/service.h"
#include "proto/braid.grpc.pb.h"

namespace braid::coordinator {
namespace {

class NegotiateReactor;

// What a failed bind() of errno `e` means for a coordinator's address.
std::string BindHint(int e) {
  switch (e) {
    case EADDRINUSE: return "the port is in use, maybe by another job's coordinator";
    case EADDRNOTAVAIL: return "the address is not one of this host's";
    case EAFNOSUPPORT: return "this host does not support the address's family (IPv6?)";
    case EACCES: return "ports below 1024 need privileges";
    default: return "";
  }
}

// Why `host`:`port` cannot be listened on. gRPC only says that it added no address, so the
// same bind is tried with a plain socket (with SO_REUSEADDR, as gRPC sets it) to learn the
// errno. Empty when the bind works: then gRPC failed for another reason (its log says).
std::string WhyNoListen(std::string host, int port) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc));
  }
  std::string why;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    int e = fd < 0 ? errno : 0;
    const int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd >= 0 && bind(fd, a->ai_addr, a->ai_addrlen) != 0) e = errno;
    if (fd >= 0) close(fd);
    if (e == 0) {
      why.clear();
      break;
    }
    const std::string hint = BindHint(e);
    why = absl::StrCat(fd < 0 ? "socket: " : "bind: ", std::strerror(e),
                       hint.empty() ? "" : absl::StrCat(" (", hint, ")"));
  }
  freeaddrinfo(found);
  return why;
}

// The caller as the call presents itself: its address and its credentials' metadata.
Caller CallerOf(const grpc::CallbackServerContext* ctx) {
  Caller c;
  c.peer = ctx->peer();
  const auto& md = ctx->client_metadata();
  auto value = [&md](const char* key) {
    auto it = md.find(key);
    return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
  };
  c.job_secret = value(kJobSecretMetadata);
  c.rank_token = value(kRankTokenMetadata);
  return c;
}

// One rank's stream as the service sees it (StreamSink). Shared between the service, which
// sends on it, and the reactor, which may be gone first: Detach() then drops later sends.
// Lock order: the service's mutex, then this one; never the other way round.
class GrpcStream final : public StreamSink {
 public:
  explicit GrpcStream(grpc::ServerBidiReactor<proto::RequestList, proto::ResponseList>* r)
      : reactor_(r) {}

  void Send(const proto::ResponseList& msg) override {
    SendShared(std::make_shared<const proto::ResponseList>(msg));
  }
  void SendShared(std::shared_ptr<const proto::ResponseList> msg) override {
    absl::MutexLock lock(&mu_);
    if (closed_ || reactor_ == nullptr) return;
    queue_.push_back(std::move(msg));  // the message being written stays alive in the queue
    MaybeWriteLocked();
  }
  void set_coalesce(bool on) override {
    absl::MutexLock lock(&mu_);
    coalesce_ = on;
  }
  void Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    MaybeFinishLocked();
  }
  // Ends the stream with an error, without writing anything.
  void Fail(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    queue_.clear();
    final_status_ = ToGrpcStatus(s);
    MaybeFinishLocked();
  }
  // Reactor side: a write completed (ok = false: the rank is gone).
  void WriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) {
      closed_ = true;
      queue_.clear();
    }
    MaybeWriteLocked();
    MaybeFinishLocked();
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  // gRPC allows one write in flight per stream; the rest wait in queue_. gRPC never runs a
  // reaction inside StartWrite/Finish, so calling them under mu_ cannot deadlock.
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || queue_.empty() || reactor_ == nullptr) return;
    if (coalesce_ && queue_.size() > 1) CoalesceLocked();
    writing_ = true;
    reactor_->StartWrite(queue_.front().get());
  }
  // Note [Coalesced writes]: what queued up while a write was in flight goes out as one
  // ResponseList, so a busy coordinator (hundreds of ranks, a response per tensor) pays
  // gRPC's per-message cost once per backlog instead of once per response, and an idle one
  // still sends each list at once. Concatenating is what applying the lists one by one does:
  // responses in order, then evictions (cache ids are never reused, so an eviction applied
  // after a later list's responses drops the same entries). A list that ends the stream
  // (shutdown or abort) is never merged, nor one that changes settings (its place among the
  // responses is where every rank applies it: Note [Settings changes] in
  // runtime/step_settings.h), so lists merge only up to it. Not in a job with the fast path (set_coalesce):
  // there every rank must receive the same lists.
  void CoalesceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto plain = [](const proto::ResponseList& m) {
      return !m.shutdown() && m.abort_message().empty() && !m.has_settings_change();
    };
    size_t n = 0;
    while (n < queue_.size() && plain(*queue_[n])) ++n;
    if (n < 2) return;
    auto merged = std::make_shared<proto::ResponseList>();
    for (size_t i = 0; i < n; ++i) merged->MergeFrom(*queue_[i]);
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    queue_.push_front(std::move(merged));
  }
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closed_ || writing_ || !queue_.empty() || finished_ || reactor_ == nullptr) return;
    finished_ = true;
    reactor_->Finish(final_status_);
  }

  absl::Mutex mu_;
  grpc::ServerBidiReactor<proto::RequestList, proto::ResponseList>* reactor_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<const proto::ResponseList>> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool coalesce_ ABSL_GUARDED_BY(mu_) = true;  // set_coalesce
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
};

// A Negotiate stream: RequestLists in (the first names the rank), ResponseLists out. A
// caller without the job secret is refused before anything is read.
class NegotiateReactor final
    : public grpc::ServerBidiReactor<proto::RequestList, proto::ResponseList> {
 public:
  NegotiateReactor(CoordinatorService* service, Caller caller)
      : service_(service), caller_(std::move(caller)),
        stream_(std::make_shared<GrpcStream>(this)) {
    absl::Status admitted = service_->AdmitStream(caller_);
    if (!admitted.ok()) {
      stream_->Fail(admitted);
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the rank half-closed (after its goodbye) or is gone
      if (key_) service_->OnStreamEnd(*key_);
      stream_->Close();
      return;
    }
    if (!key_) {
      auto key = service_->OpenStream(caller_, in_, stream_);
      if (!key.ok()) {
        stream_->Fail(key.status());
        return;
      }
      key_ = *key;
    } else {
      service_->OnRequests(*key_, in_);
    }
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override { stream_->WriteDone(ok); }
  void OnDone() override {
    stream_->Detach();
    delete this;
  }

 private:
  CoordinatorService* const service_;
  const Caller caller_;
  const std::shared_ptr<GrpcStream> stream_;
  proto::RequestList in_;  // touched by read reactions only, which gRPC runs one at a time
  std::optional<StreamKey> key_;
};

// A unary call the service answers later; the service's wait is cancelled when the caller
// goes away (its deadline passed, or the server is stopping).
class DeferredReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit DeferredReactor(CoordinatorService* service)
      : service_(service), id_(service->NewCallId()) {}
  int64_t id() const { return id_; }
  void OnCancel() override { service_->Cancel(id_); }
  void OnDone() override { delete this; }

 private:
  CoordinatorService* const service_;
  const int64_t id_;
};

class GrpcService final : public proto::Coordinator::CallbackService {
 public:
  explicit GrpcService(CoordinatorService* service) : service_(service) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const proto::RegisterRequest* req,
                                     proto::RegisterResponse* resp) override {
    auto* r = new DeferredReactor(service_);
    service_->Register(r->id(), CallerOf(ctx), *req,
                       [r, resp](absl::StatusOr<proto::RegisterResponse> got) {
                         if (got.ok()) *resp = *std::move(got);
                         r->Finish(ToGrpcStatus(got.status()));
                       });
    return r;
  }

  grpc::ServerUnaryReactor* KeyValueSet(grpc::CallbackServerContext* ctx,
                                        const proto::KeyValueSetRequest* req,
                                        proto::KeyValueSetResponse*) override {
    return Done(ctx, service_->KeyValueSet(CallerOf(ctx), *req));
  }

  grpc::ServerUnaryReactor* KeyValueGet(grpc::CallbackServerContext* ctx,
                                        const proto::KeyValueGetRequest* req,
                                        proto::KeyValueGetResponse* resp) override {
    auto* r = new DeferredReactor(service_);
    service_->KeyValueGet(r->id(), CallerOf(ctx), *req,
                          [r, resp](absl::StatusOr<proto::KeyValueGetResponse> got) {
                            if (got.ok()) *resp = *std::move(got);
                            r->Finish(ToGrpcStatus(got.status()));
                          });
    return r;
  }

  grpc::ServerBidiReactor<proto::RequestList, proto::ResponseList>* Negotiate(
      grpc::CallbackServerContext* ctx) override {
    return new NegotiateReactor(service_, CallerOf(ctx));
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const proto::HeartbeatRequest* req,
                                      proto::HeartbeatResponse* resp) override {
    return Done(ctx, service_->Heartbeat(CallerOf(ctx), *req, resp));
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const proto::StatusRequest* req,
                                   proto::StatusResponse* resp) override {
    auto* r = new DeferredReactor(service_);
    service_->Status(r->id(), CallerOf(ctx), *req,
                     [r, resp](absl::StatusOr<proto::StatusResponse> got) {
      if (got.ok()) *resp = *std::move(got);
      r->Finish(ToGrpcStatus(got.status()));
    });
    return r;
  }

  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx,
                                     const proto::ShutdownRequest* req,
                                     proto::ShutdownResponse*) override {
    // The monitor stops the server.
    return Done(ctx, service_->RequestShutdown(CallerOf(ctx), *req));
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(s));
    return r;
  }

  CoordinatorService* const service_;
};

ServiceOptions ServiceOptionsFrom(const ServerOptions& o) {
  ServiceOptions s;
  s.world_size = o.world_size;
  s.job_secret = o.job_secret;
  s.single_job = o.single_job;
  s.register_timeout = o.register_timeout;
  s.settings = o.settings;
  s.on_rank_lost = o.on_rank_lost;
  s.elastic_world_size = o.elastic_world_size;
  s.elastic_admit = o.elastic_admit;
  s.elastic_leaving = o.elastic_leaving;
  s.autotune = o.autotune;
  return s;
}

class GrpcCoordinatorServer final : public CoordinatorServer {
 public:
  explicit GrpcCoordinatorServer(const ServerOptions& o)
      : opts_(o), service_(ServiceOptionsFrom(o)), grpc_service_(&service_) {}
  ~GrpcCoordinatorServer() override { Shutdown(absl::Milliseconds(200)); }

  absl::Status Start() {
    if (opts_.job_secret.empty()) {
      return absl::InvalidArgumentError(
          "a coordinator needs a job secret (Note [Who may join]): none was given");
    }
    // Whoever embeds a coordinator gets the same floor as the tools (Note [Secret strength]).
    if (absl::Status s = CheckSecret("the coordinator's job secret", opts_.job_secret);
        !s.ok()) {
      return s;
    }
    auto credentials = MakeServerCredentials(opts_.tls_cert_file, opts_.tls_key_file);
    if (!credentials.ok()) return credentials.status();
    grpc::ServerBuilder builder;
    const std::string addr = HostPort(opts_.bind_address, opts_.port);
    builder.AddListeningPort(addr, *credentials, &port_);
    // A second coordinator must not silently share the port (gRPC sets SO_REUSEPORT by
    // default).
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // Ranks keep their streams alive with pings; permit them.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    // Above gRPC's 4 MiB default, so a large job's lists are never refused by closing the
    // stream; ranks split theirs far below it (common/limits.h).
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    builder.RegisterService(&grpc_service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      // Credentials were checked above (MakeServerCredentials), so the address is the cause.
      const std::string why = WhyNoListen(opts_.bind_address, opts_.port);
      return absl::UnavailableError(absl::StrCat(
          "coordinator cannot listen on ", addr, ": ",
          why.empty() ? "gRPC could not listen there (its log line above says why)" : why));
    }
    monitor_ = std::make_unique<Monitor>(opts_.monitor_period, [this] {
      service_.Inspect();
      if (service_.shutdown_requested()) StopServing(absl::Seconds(1));
    });
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  std::string address() const override { return HostPort(opts_.bind_address, port_); }

  void Shutdown(absl::Duration grace) override {
    StopServing(grace);
    monitor_.reset();  // joins: waits for a StopServing the monitor may be running
  }

  void Wait() override { done_.WaitForNotification(); }

  bool WaitForJobEnd(absl::Duration timeout) override {
    // The service's own wait for a job's end (as braidctl status --once uses): no polling.
    auto ended = std::make_shared<absl::Notification>();
    auto result = std::make_shared<bool>(false);
    proto::StatusRequest req;
    req.set_wait_for_end_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
    // The hosting process asks as the job itself (its own secret).
    const Caller self{"the hosting process", opts_.job_secret, ""};
    service_.Status(service_.NewCallId(), self, req,
                    [ended, result](absl::StatusOr<proto::StatusResponse> r) {
                      *result = r.ok() && r->phase() == proto::JOB_ENDED;
                      ended->Notify();
                    });
    // The service answers by its own deadline; the margin covers the monitor's period.
    if (!ended->WaitForNotificationWithTimeout(timeout + opts_.monitor_period * 2 +
                                               absl::Seconds(1))) {
      return false;
    }
    return *result;
  }

 private:
  // Called by Shutdown() or, after a Shutdown RPC, by the monitor.
  void StopServing(absl::Duration grace) {
    {
      absl::MutexLock lock(&mu_);
      if (server_ == nullptr || stopped_) return;
      stopped_ = true;
    }
    service_.BeginShutdown();
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
    done_.Notify();
  }

  const ServerOptions opts_;
  CoordinatorService service_;
  GrpcService grpc_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification done_;
  std::unique_ptr<Monitor> monitor_;  // last: stopped first
};

}  // namespace

std::string HostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> StartCoordinator(const ServerOptions& options) {
  auto server = std::make_unique<GrpcCoordinatorServer>(options);
  absl::Status s = server->Start();
  if (!s.ok()) return s;
  return std::unique_ptr<CoordinatorServer>(std::move(server));
}

}  // namespace braid::coordinator
