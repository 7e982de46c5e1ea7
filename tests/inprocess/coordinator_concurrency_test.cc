// The coordinator's handlers (coordinator/service.h) called from many threads at once, as
// gRPC's threads and the monitor call them in a server: ranks as threads registering,
// negotiating and beating, a monitor inspecting every millisecond, status readers, and an
// outsider whose calls are refused. Every rank must receive the same responses in the same
// order. Its point is the ThreadSanitizer suite (scripts/sanitize_test.sh), which sees every
// access here: unlike the gRPC server's test, nothing is handed between threads inside an
// uninstrumented library.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/service.h"
#include "gtest/gtest.h"

namespace braid::coordinator {
namespace {

constexpr char kSecret[] = "concurrency-test-secret";
constexpr int kRanks = 4;
constexpr int kSteps = 100;

// A stream's far end: what the rank received, and whether the coordinator closed it.
class Inbox : public StreamSink {
 public:
  void Send(const proto::ResponseList& msg) override {
    absl::MutexLock lock(&mu_);
    for (const proto::Response& r : msg.responses()) names_.push_back(r.names(0));
  }
  void Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Waits until `n` responses arrived; false after 30 s.
  bool Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto arrived = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return names_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&arrived), absl::Seconds(30));
  }
  std::vector<std::string> names() const {
    absl::MutexLock lock(&mu_);
    return names_;
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

proto::RequestList Tensor(int rank, int step) {
  proto::RequestList l;
  l.set_rank(rank);
  proto::Request* r = l.add_requests();
  r->set_name(absl::StrCat("t", step % 8));
  r->set_dtype(proto::FLOAT32);
  r->add_shape(16);
  r->set_compression("none");
  return l;
}

// One rank: registers, opens its stream, submits a tensor per step and waits for it, beats.
void RunRank(CoordinatorService& service, int rank, Inbox* inbox, std::atomic<int>* failures) {
  const Caller job{"rank", kSecret, ""};
  absl::Notification registered;
  std::string token;
  proto::RegisterRequest req;
  req.set_rank(rank);
  req.set_size(kRanks);
  req.set_host("h");
  req.set_pid(rank);
  service.Register(service.NewCallId(), job, req,
                   [&](absl::StatusOr<proto::RegisterResponse> r) {
                     if (r.ok()) token = r->rank_token();
                     if (!r.ok()) ++*failures;
                     registered.Notify();
                   });
  if (!registered.WaitForNotificationWithTimeout(absl::Seconds(30)) || token.empty()) {
    ++*failures;
    return;
  }
  Caller me{"rank", kSecret, token};
  proto::RequestList hello;
  hello.set_rank(rank);
  std::shared_ptr<Inbox> sink(inbox, [](Inbox*) {});  // owned by the test
  auto key = service.OpenStream(me, hello, sink);
  if (!key.ok()) {
    ++*failures;
    return;
  }
  for (int step = 0; step < kSteps; ++step) {
    service.OnRequests(*key, Tensor(rank, step));
    proto::HeartbeatRequest hb;
    hb.set_rank(rank);
    if (!service.Heartbeat(me, hb).ok()) ++*failures;
    if (!inbox->Await(step + 1)) {
      ++*failures;
      return;
    }
  }
  proto::RequestList bye;
  bye.set_rank(rank);
  bye.set_shutdown(true);
  service.OnRequests(*key, bye);
  service.OnStreamEnd(*key);
}

TEST(CoordinatorConcurrencyTest, RanksMonitorReadersAndOutsidersAtOnce) {
  ServiceOptions o;
  o.job_secret = kSecret;
  o.register_timeout = absl::Seconds(30);
  CoordinatorService service(o);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, refused{0}, statuses{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // the monitor
    while (!stop) {
      service.Inspect();
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  threads.emplace_back([&] {  // braidctl status, over and over
    while (!stop) {
      service.Status(service.NewCallId(), Caller{"ctl", kSecret, ""}, proto::StatusRequest(),
                     [&](absl::StatusOr<proto::StatusResponse> s) { statuses += s.ok(); });
    }
  });
  threads.emplace_back([&] {  // an outsider
    const Caller outsider{"outsider", "guess", "guess"};
    while (!stop) {
      proto::HeartbeatRequest hb;
      hb.set_rank(0);
      refused += service.Heartbeat(outsider, hb).code() == absl::StatusCode::kPermissionDenied;
      proto::RequestList hello;
      hello.set_rank(1);
      refused += service.OpenStream(outsider, hello, std::make_shared<Inbox>()).status().code() ==
                 absl::StatusCode::kPermissionDenied;
    }
  });
  std::vector<Inbox> inboxes(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] { RunRank(service, r, &inboxes[r], &failures); });
  }
  for (auto& t : ranks) t.join();
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_GT(refused, 0);
  EXPECT_GT(statuses, 0);
  const std::vector<std::string> first = inboxes[0].names();
  EXPECT_EQ(first.size(), static_cast<size_t>(kSteps));
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(inboxes[r].names(), first) << "rank " << r;
    EXPECT_TRUE(inboxes[r].closed()) << "rank " << r;
  }
  service.BeginShutdown();
}

}  // namespace
}  // namespace braid::coordinator
