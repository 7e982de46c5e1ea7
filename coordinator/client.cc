#include "coordinator/client.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/limits.h"
#include "coordinator/credentials.h"
#include "coordinator/grpc_status.h"
#include "glog/logging.h"
#include "proto/braid.grpc.pb.h"

namespace braid::coordinator {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(d);
}

// Store over the coordinator's KeyValue RPCs.
class GrpcStore final : public Store {
 public:
  GrpcStore(proto::Coordinator::Stub* stub, const std::string* secret)
      : stub_(stub), secret_(secret) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(absl::Seconds(30)));
    AddCallCredentials(&ctx, *secret_);
    proto::KeyValueSetRequest req;
    req.set_key(key);
    req.set_value(value);
    proto::KeyValueSetResponse resp;
    return FromGrpcStatus(stub_->KeyValueSet(&ctx, req, &resp), "store set '" + key + "'");
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(timeout + absl::Seconds(5)));
    AddCallCredentials(&ctx, *secret_);
    proto::KeyValueGetRequest req;
    req.set_key(key);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    proto::KeyValueGetResponse resp;
    absl::Status s = FromGrpcStatus(stub_->KeyValueGet(&ctx, req, &resp), "store get '" + key + "'");
    if (!s.ok()) return s;
    if (!resp.found()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "key '", key, "' did not appear in the coordinator's store within ",
          absl::FormatDuration(timeout), " (a rank did not start its data plane)"));
    }
    return resp.value();
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    for (const auto& k : keys) {
      auto v = Get(k, std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (!v.ok()) return v.status();
    }
    return absl::OkStatus();
  }

 private:
  proto::Coordinator::Stub* stub_;
  const std::string* secret_;  // the client's
};

absl::Status RegisterCancelled() {
  return absl::CancelledError("registration cancelled (interrupted while waiting for the "
                              "other ranks)");
}

class GrpcClient final : public CoordinatorClient {
 public:
  GrpcClient(const ClientOptions& o, std::shared_ptr<grpc::Channel> channel)
      : opts_(o), channel_(std::move(channel)), stub_(proto::Coordinator::NewStub(channel_)),
        store_(stub_.get(), &opts_.job_secret), heartbeat_interval_(o.heartbeat_interval) {}

  ~GrpcClient() override { Close(absl::Milliseconds(200)); }

  absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& req,
                                                   absl::Duration timeout) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(timeout + absl::Seconds(5)));
    ctx.set_wait_for_ready(true);
    AddCallCredentials(&ctx, opts_.job_secret);
    {
      absl::MutexLock lock(&register_mu_);
      if (register_cancelled_) return RegisterCancelled();
      register_ctx_ = &ctx;
    }
    proto::RegisterResponse resp;
    grpc::Status g = stub_->Register(&ctx, req, &resp);
    {
      absl::MutexLock lock(&register_mu_);
      register_ctx_ = nullptr;
      if (register_cancelled_) return RegisterCancelled();
    }
    absl::Status s = FromGrpcStatus(g, "registering with the coordinator at " + opts_.address);
    if (!s.ok()) return s;
    rank_token_ = resp.rank_token();
    if (resp.settings().has_heartbeat_timeout_ms()) {
      // The job's heartbeat timeout, which the coordinator judges liveness by.
      absl::MutexLock lock(&mu_);
      heartbeat_interval_ = HeartbeatInterval(
          absl::Milliseconds(resp.settings().heartbeat_timeout_ms()));
    }
    return resp;
  }

  void CancelRegister() override {
    absl::MutexLock lock(&register_mu_);
    register_cancelled_ = true;
    if (register_ctx_ != nullptr) register_ctx_->TryCancel();
  }

  Store* store() override { return &store_; }

  absl::Status StartNegotiation(int rank,
                                std::function<void(const proto::ResponseList&)> on_message,
                                std::function<void(const absl::Status&)> on_closed) override {
    rank_ = rank;
    stream_ctx_ = std::make_unique<grpc::ClientContext>();
    AddCallCredentials(stream_ctx_.get(), opts_.job_secret, rank_token_);
    stream_ = stub_->Negotiate(stream_ctx_.get());
    proto::RequestList hello;
    hello.set_rank(rank);
    hello.set_report_ages(opts_.report_ages);
    if (!stream_->Write(hello)) {
      return absl::UnavailableError("could not open the negotiation stream to " + opts_.address);
    }
    reader_ = std::thread([this, on_message = std::move(on_message),
                           on_closed = std::move(on_closed)] {
      proto::ResponseList msg;
      while (stream_->Read(&msg)) on_message(msg);
      grpc::Status st = stream_->Finish();
      absl::Status result;
      {
        absl::MutexLock lock(&mu_);
        if (!closing_) {
          result = absl::UnavailableError(absl::StrCat(
              "lost the coordinator at ", opts_.address,
              st.ok() ? std::string() : ": " + st.error_message()));
        }
      }
      {
        absl::MutexLock lock(&mu_);
        reader_done_ = true;
      }
      on_closed(result);
    });
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    // The rank's threads by name (docs/architecture.md).
    pthread_setname_np(reader_.native_handle(), "braid-coord-rx");
    pthread_setname_np(heartbeat_.native_handle(), "braid-heartbeat");
    return absl::OkStatus();
  }

  absl::Status Send(const proto::RequestList& list) override {
    absl::MutexLock lock(&write_mu_);
    if (stream_ == nullptr || !stream_->Write(list)) {
      return absl::UnavailableError("negotiation stream to " + opts_.address + " is closed");
    }
    return absl::OkStatus();
  }

  void Close(absl::Duration grace) override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = closing_ = true;
    }
    if (stream_ != nullptr) {
      bool stream_open;
      {
        absl::MutexLock lock(&mu_);
        stream_open = !reader_done_;
      }
      // The final report, sent (and answered) before the goodbye so the coordinator has it
      // before it marks this rank shut down. Skipped when the stream is already gone (a lost
      // coordinator must not delay shutdown).
      if (stream_open && opts_.fill_heartbeat) {
        SendHeartbeat(std::min(grace, absl::Milliseconds(500)));
      }
      {
        absl::MutexLock lock(&write_mu_);
        proto::RequestList bye;
        bye.set_rank(rank_);
        bye.set_shutdown(true);
        stream_->Write(bye);
        stream_->WritesDone();
      }
      // The coordinator ends the stream after a goodbye; cancel if it does not in time.
      absl::Time deadline = absl::Now() + grace;
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithDeadline(absl::Condition(&reader_done_), deadline);
      }
      stream_ctx_->TryCancel();
    }
    if (reader_.joinable()) reader_.join();
    {
      absl::MutexLock lock(&mu_);
      stop_heartbeat_ = true;
    }
    if (heartbeat_.joinable()) heartbeat_.join();
  }

 private:
  void HeartbeatLoop() {
    while (true) {
      absl::Duration interval;
      {
        absl::MutexLock lock(&mu_);
        interval = heartbeat_interval_;
        auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_heartbeat_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&stop), interval)) return;
      }
      SendHeartbeat(interval);
    }
  }

  void SendHeartbeat(absl::Duration timeout) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(timeout));
    AddCallCredentials(&ctx, opts_.job_secret, rank_token_);
    proto::HeartbeatRequest req;
    if (opts_.fill_heartbeat) opts_.fill_heartbeat(&req);
    req.set_rank(rank_);
    proto::HeartbeatResponse resp;
    // A lost coordinator shows on the stream, not here.
    if (stub_->Heartbeat(&ctx, req, &resp).ok() && opts_.on_heartbeat_response) {
      opts_.on_heartbeat_response(resp);
    }
  }

  ClientOptions opts_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
  GrpcStore store_;
  int rank_ = -1;
  // From Register, before the stream and the heartbeat thread start; read-only after.
  std::string rank_token_;
  std::unique_ptr<grpc::ClientContext> stream_ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<proto::RequestList, proto::ResponseList>> stream_;
  std::thread reader_;
  std::thread heartbeat_;
  absl::Mutex write_mu_;  // one Write at a time
  absl::Mutex register_mu_;  // a leaf
  grpc::ClientContext* register_ctx_ ABSL_GUARDED_BY(register_mu_) = nullptr;  // Register's
  bool register_cancelled_ ABSL_GUARDED_BY(register_mu_) = false;
  absl::Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_heartbeat_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Duration HeartbeatInterval(absl::Duration heartbeat_timeout) {
  return std::max(absl::Milliseconds(100), heartbeat_timeout / 4);
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectCoordinator(const ClientOptions& o) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // The server's limits (common/limits.h): a fused response list of many long names fits.
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  if (o.dedicated_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto credentials = MakeChannelCredentials(o.tls_ca_file);
  if (!credentials.ok()) return credentials.status();
  auto channel = grpc::CreateCustomChannel(o.address, *credentials, args);
  // In slices, so that a Ctrl-C in init() (o.cancelled) ends the wait at once.
  const absl::Time deadline = absl::Now() + o.connect_timeout;
  bool connected = false;
  while (!connected && absl::Now() < deadline) {
    if (o.cancelled && o.cancelled()) return absl::CancelledError("init() was interrupted");
    connected = channel->WaitForConnected(
        absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(100))));
  }
  if (!connected) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the coordinator at ", o.address, " within ",
        absl::FormatDuration(o.connect_timeout),
        o.tls_ca_file.empty() ? "" : " (over TLS: is its certificate signed by BRAID_TLS_CA?)",
        o.unreachable_hint));
  }
  return std::unique_ptr<CoordinatorClient>(std::make_unique<GrpcClient>(o, std::move(channel)));
}

}  // namespace braid::coordinator
