#include "coordinator/local_coordinator.h"

#include <pthread.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/client.h"

namespace braid::coordinator {
namespace {

// One rank's stream as the service sees it: a queue the client's reader drains. Lock order:
// the service's mutex, then this one (the service sends under its lock).
class LocalStream final : public StreamSink {
 public:
  void Send(const proto::ResponseList& msg) override {
    absl::MutexLock lock(&mu_);
    if (!closed_) queue_.push_back(msg);
  }
  void Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // The next message in order; nullopt once the stream is closed and drained.
  std::optional<proto::ResponseList> Next() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) return std::nullopt;
    proto::ResponseList msg = std::move(queue_.front());
    queue_.pop_front();
    return msg;
  }

 private:
  absl::Mutex mu_;
  std::deque<proto::ResponseList> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// The key-value store over the service's handlers.
class LocalStore final : public Store {
 public:
  LocalStore(CoordinatorService* service, Caller caller)
      : service_(service), caller_(std::move(caller)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    proto::KeyValueSetRequest req;
    req.set_key(key);
    req.set_value(value);
    return service_->KeyValueSet(caller_, req);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    proto::KeyValueGetRequest req;
    req.set_key(key);
    req.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
    absl::Notification done;
    absl::StatusOr<proto::KeyValueGetResponse> got;
    service_->KeyValueGet(service_->NewCallId(), caller_, req,
                          [&](absl::StatusOr<proto::KeyValueGetResponse> r) {
                            got = std::move(r);
                            done.Notify();
                          });
    done.WaitForNotification();  // the service's monitor ends the wait at its deadline
    if (!got.ok()) return got.status();
    const proto::KeyValueGetResponse& resp = *got;
    if (!resp.found()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "key '", key, "' did not appear in the store within ", absl::FormatDuration(timeout)));
    }
    return resp.value();
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (const std::string& k : keys) {
      auto v = Get(k, std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (!v.ok()) return v.status();
    }
    return absl::OkStatus();
  }

 private:
  CoordinatorService* service_;
  const Caller caller_;
};

class LocalClient final : public CoordinatorClient {
 public:
  // `caller`: what every call presents (the job secret; Register adds this rank's token).
  LocalClient(CoordinatorService* service, Caller caller, LocalClientOptions o)
      : service_(service), caller_(caller), opts_(std::move(o)), store_(service, caller),
        heartbeat_interval_(opts_.heartbeat_interval) {}
  ~LocalClient() override { Close(absl::Milliseconds(200)); }

  absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& req,
                                                   absl::Duration timeout) override;
  Store* store() override { return &store_; }
  absl::Status StartNegotiation(int rank,
                                std::function<void(const proto::ResponseList&)> on_message,
                                std::function<void(const absl::Status&)> on_closed) override;
  absl::Status Send(const proto::RequestList& list) override;
  void Close(absl::Duration grace) override;

 private:
  void ReaderLoop(std::function<void(const proto::ResponseList&)> on_message,
                  std::function<void(const absl::Status&)> on_closed);
  void HeartbeatLoop();
  void SendHeartbeat();

  CoordinatorService* const service_;
  Caller caller_;  // rank_token set by Register, before any stream or heartbeat
  const LocalClientOptions opts_;
  LocalStore store_;
  std::shared_ptr<LocalStream> stream_;
  std::optional<StreamKey> key_;
  std::thread reader_, heartbeat_;
  absl::Mutex write_mu_;  // one Send at a time, as a stream allows
  absl::Mutex mu_;
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_heartbeat_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<proto::RegisterResponse> LocalClient::Register(const proto::RegisterRequest& req,
                                                              absl::Duration timeout) {
  const int64_t id = service_->NewCallId();
  absl::Notification done;
  absl::StatusOr<proto::RegisterResponse> result;
  service_->Register(id, caller_, req, [&](absl::StatusOr<proto::RegisterResponse> r) {
    result = std::move(r);
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(timeout)) service_->Cancel(id);
  done.WaitForNotification();  // Cancel completes it if the service has not
  if (result.ok()) caller_.rank_token = result->rank_token();
  if (result.ok() && result->settings().has_heartbeat_timeout_ms()) {
    absl::MutexLock lock(&mu_);
    heartbeat_interval_ =
        HeartbeatInterval(absl::Milliseconds(result->settings().heartbeat_timeout_ms()));
  }
  return result;
}

absl::Status LocalClient::StartNegotiation(
    int rank, std::function<void(const proto::ResponseList&)> on_message,
    std::function<void(const absl::Status&)> on_closed) {
  {
    absl::MutexLock lock(&mu_);
    rank_ = rank;
  }
  stream_ = std::make_shared<LocalStream>();
  proto::RequestList hello;
  hello.set_rank(rank);
  hello.set_report_ages(true);  // in-process worlds are small: always give the timeline's marks
  BRAID_RETURN_IF_ERROR(service_->AdmitStream(caller_));
  auto key = service_->OpenStream(caller_, hello, stream_);
  if (!key.ok()) return key.status();
  key_ = *key;
  reader_ = std::thread([this, on_message = std::move(on_message),
                         on_closed = std::move(on_closed)]() mutable {
    ReaderLoop(std::move(on_message), std::move(on_closed));
  });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  // Named as the gRPC client's are (docs/architecture.md).
  pthread_setname_np(reader_.native_handle(), "braid-coord-rx");
  pthread_setname_np(heartbeat_.native_handle(), "braid-heartbeat");
  return absl::OkStatus();
}

void LocalClient::ReaderLoop(std::function<void(const proto::ResponseList&)> on_message,
                             std::function<void(const absl::Status&)> on_closed) {
  while (std::optional<proto::ResponseList> msg = stream_->Next()) on_message(*msg);
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (!closing_) result = absl::UnavailableError("lost the in-process coordinator");
    reader_done_ = true;
  }
  on_closed(result);
}

absl::Status LocalClient::Send(const proto::RequestList& list) {
  absl::MutexLock lock(&write_mu_);
  {
    absl::MutexLock state(&mu_);
    if (!key_ || closed_ || reader_done_) {
      return absl::UnavailableError("the negotiation stream to the in-process coordinator is closed");
    }
  }
  service_->OnRequests(*key_, list);
  return absl::OkStatus();
}

void LocalClient::Close(absl::Duration grace) {
  bool stream_open;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = closing_ = true;
    stream_open = key_.has_value() && !reader_done_;
  }
  if (key_) {
    // As the gRPC client: the final report, then the goodbye, then the end of the stream.
    if (stream_open && opts_.fill_heartbeat) SendHeartbeat();
    {
      absl::MutexLock lock(&write_mu_);
      proto::RequestList bye;
      bye.set_rank(key_->rank);
      bye.set_shutdown(true);
      service_->OnRequests(*key_, bye);
      service_->OnStreamEnd(*key_);
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&reader_done_), grace);
  }
  if (stream_) stream_->Close();  // the coordinator closed it already unless it was gone
  if (reader_.joinable()) reader_.join();
  {
    absl::MutexLock lock(&mu_);
    stop_heartbeat_ = true;
  }
  if (heartbeat_.joinable()) heartbeat_.join();
}

void LocalClient::HeartbeatLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_heartbeat_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), heartbeat_interval_)) return;
    }
    SendHeartbeat();
  }
}

void LocalClient::SendHeartbeat() {
  proto::HeartbeatRequest req;
  if (opts_.fill_heartbeat) opts_.fill_heartbeat(&req);
  {
    absl::MutexLock lock(&mu_);
    req.set_rank(rank_);
  }
  service_->Heartbeat(caller_, req).IgnoreError();  // as the gRPC client: the next one retries
}

}  // namespace

LocalCoordinator::LocalCoordinator(ServiceOptions options, absl::Duration inspect_period)
    : secret_(options.job_secret.empty() ? "in-process job" : options.job_secret),
      service_([&] {
        options.job_secret = secret_;  // a coordinator never runs without one
        return std::move(options);
      }()),
      monitor_(std::make_unique<Monitor>(inspect_period, [this] { service_.Inspect(); })) {}

LocalCoordinator::~LocalCoordinator() {
  monitor_.reset();
  service_.BeginShutdown();
}

std::unique_ptr<CoordinatorClient> LocalCoordinator::NewClient(LocalClientOptions options) {
  Caller caller;
  caller.peer = "in-process";
  caller.job_secret = secret_;
  return std::make_unique<LocalClient>(&service_, std::move(caller), std::move(options));
}

absl::StatusOr<proto::StatusResponse> LocalCoordinator::Status() {
  absl::Notification done;
  absl::StatusOr<proto::StatusResponse> result;
  Caller caller;
  caller.peer = "in-process";
  caller.job_secret = secret_;
  service_.Status(service_.NewCallId(), caller, proto::StatusRequest(),
                  [&](absl::StatusOr<proto::StatusResponse> r) {
                    result = std::move(r);
                    done.Notify();
                  });
  done.WaitForNotification();
  return result;
}

}  // namespace braid::coordinator
