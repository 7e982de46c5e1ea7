// The coordinator's handlers (coordinator/service.h) without a server, for the unit tests:
// plain messages in, completion callbacks and recording stream sinks out, a fake clock stepped
// by hand. Every call is made by the job's own caller (the secret, and the rank's token where
// one is needed) unless a test says otherwise.
#ifndef BRAID_TESTS_UNIT_COORDINATOR_SERVICE_FIXTURE_H_
#define BRAID_TESTS_UNIT_COORDINATOR_SERVICE_FIXTURE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/service.h"
#include "gtest/gtest.h"

namespace braid::coordinator {

inline constexpr char kTestSecret[] = "the-job-secret-of-this-test";

// What the gRPC layer would write to a rank.
class RecordingSink : public StreamSink {
 public:
  void Send(const proto::ResponseList& msg) override {
    if (!closed) sent.push_back(msg);
  }
  void Close() override { closed = true; }
  void set_coalesce(bool on) override { coalesce = on; }
  std::vector<proto::ResponseList> sent;
  bool closed = false;
  std::optional<bool> coalesce;  // unset: never told
};

inline proto::RegisterRequest Reg(int rank, int size, const std::string& address = "") {
  proto::RegisterRequest r;
  r.set_rank(rank);
  r.set_size(size);
  r.set_local_rank(-1);
  r.set_host("h");
  r.set_pid(100 + rank);
  r.set_transport_address(address.empty() ? "ucx-addr-" + std::to_string(rank) : address);
  return r;
}

inline proto::RequestList Allreduce(int rank, const std::string& name) {
  proto::RequestList l;
  l.set_rank(rank);
  proto::Request* r = l.add_requests();
  r->set_name(name);
  r->set_collective(proto::ALLREDUCE);
  r->set_dtype(proto::FLOAT32);
  r->add_shape(4);
  r->set_compression("none");
  return l;
}

class ServiceTest : public ::testing::Test {
 protected:
  explicit ServiceTest(ServiceOptions o = {}) { Restart(std::move(o)); }

  // A fresh service with options `o` (the job secret and fake clock filled in).
  void Restart(ServiceOptions o = {}) {
    o.clock = [this] { return now_; };
    if (o.job_secret.empty()) o.job_secret = kTestSecret;
    if (o.register_timeout == absl::Seconds(120)) o.register_timeout = absl::Seconds(30);
    service_ = std::make_unique<CoordinatorService>(o);
    results_.clear();
    tokens_.clear();
  }

  // The job's own caller: the secret, and `rank`'s token when rank >= 0.
  Caller Job(int rank = -1) const {
    Caller c{"ipv4:127.0.0.1:1000", kTestSecret, ""};
    if (rank >= 0 && tokens_.count(rank) != 0) c.rank_token = tokens_.at(rank);
    return c;
  }

  // Registers `req` as `caller`; the result lands in results_[call id] when the service
  // answers, and a granted rank's token in tokens_[rank].
  int64_t Register(const proto::RegisterRequest& req, std::optional<Caller> caller = {}) {
    int64_t id = service_->NewCallId();
    service_->Register(id, caller ? *caller : Job(), req,
                       [this, id](absl::StatusOr<proto::RegisterResponse> r) {
                         EXPECT_EQ(results_.count(id), 0u) << "done called twice";
                         if (r.ok()) tokens_[r->rank()] = r->rank_token();
                         results_.emplace(id, std::move(r));
                       });
    return id;
  }
  absl::StatusOr<StreamKey> Open(int rank, std::shared_ptr<StreamSink> sink) {
    proto::RequestList hello;
    hello.set_rank(rank);
    return service_->OpenStream(Job(rank), hello, std::move(sink));
  }
  // Forms a job of `n` ranks and opens every rank's stream.
  std::vector<std::shared_ptr<RecordingSink>> StartJob(int n, std::vector<StreamKey>* keys) {
    std::vector<int64_t> ids;
    for (int r = 0; r < n; ++r) ids.push_back(Register(Reg(r, n)));
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(results_.at(ids[r]).ok()) << results_.at(ids[r]).status();
      auto sink = std::make_shared<RecordingSink>();
      auto key = Open(r, sink);
      EXPECT_TRUE(key.ok()) << key.status();
      keys->push_back(*key);
      sinks.push_back(sink);
    }
    return sinks;
  }
  // A heartbeat from `rank` itself.
  absl::Status Beat(int rank) {
    proto::HeartbeatRequest hb;
    hb.set_rank(rank);
    return service_->Heartbeat(Job(rank), hb);
  }
  void Goodbye(const StreamKey& key) {
    proto::RequestList bye;
    bye.set_rank(key.rank);
    bye.set_shutdown(true);
    service_->OnRequests(key, bye);
    service_->OnStreamEnd(key);  // the client half-closes after its goodbye
  }
  absl::StatusOr<proto::StatusResponse> StatusOf(int64_t job_id, const Caller& caller) {
    std::optional<absl::StatusOr<proto::StatusResponse>> got;
    proto::StatusRequest req;
    req.set_job_id(job_id);
    service_->Status(service_->NewCallId(), caller, req, [&](auto r) { got = std::move(r); });
    if (!got.has_value()) return absl::InternalError("status not answered at once");
    return *got;
  }
  proto::StatusResponse Status(int64_t job_id = 0) {
    auto got = StatusOf(job_id, Job());
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : proto::StatusResponse();
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<CoordinatorService> service_;
  std::map<int64_t, absl::StatusOr<proto::RegisterResponse>> results_;
  std::map<int, std::string> tokens_;  // rank -> its token in the latest job it joined
};

}  // namespace braid::coordinator

#endif  // BRAID_TESTS_UNIT_COORDINATOR_SERVICE_FIXTURE_H_
