// Who may call the coordinator (Note [Who may join] in coordinator/admission.h), at the level
// of its handlers: every call without the job secret, or with a wrong one, is refused and
// changes nothing; a holder of the secret cannot speak for another rank; a stale stream or
// heartbeat of an earlier job touches nothing; the key-value store is bounded and per job;
// a one-job coordinator refuses another job's rank at once.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/service.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_service_fixture.h"

namespace braid::coordinator {
namespace {

constexpr absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;

// Makes every RPC as `caller` against a running 2-rank job and returns their statuses.
struct Attempt {
  std::string rpc;
  absl::Status status;
};

class AdmissionTest : public ServiceTest {
 protected:
  std::vector<Attempt> EveryRpcAs(const Caller& caller) {
    std::vector<Attempt> out;
    std::optional<absl::Status> got;
    auto record = [&](const char* rpc) {
      out.push_back({rpc, got.value_or(absl::InternalError("not answered at once"))});
      got.reset();
    };
    service_->Register(service_->NewCallId(), caller, Reg(-1, 2),
                       [&](auto r) { got = r.status(); });
    record("Register");
    proto::KeyValueSetRequest set;
    set.set_key("peer/0");
    set.set_value("forged");
    got = service_->KeyValueSet(caller, set);
    record("KeyValueSet");
    proto::KeyValueGetRequest get;
    get.set_key("peer/0");
    get.set_timeout_ms(60000);
    service_->KeyValueGet(service_->NewCallId(), caller, get, [&](auto r) { got = r.status(); });
    record("KeyValueGet");
    got = service_->AdmitStream(caller);
    record("Negotiate (admission)");
    proto::RequestList hello;
    hello.set_rank(0);
    got = service_->OpenStream(caller, hello, std::make_shared<RecordingSink>()).status();
    record("Negotiate");
    proto::HeartbeatRequest hb;
    hb.set_rank(1);
    got = service_->Heartbeat(caller, hb);
    record("Heartbeat");
    got = StatusOf(0, caller).status();
    record("Status");
    proto::ShutdownRequest bye;
    bye.set_reason("outsider");
    got = service_->RequestShutdown(caller, bye);
    record("Shutdown");
    return out;
  }
};

TEST_F(AdmissionTest, EveryRpcWithoutOrWithAWrongSecretIsRefusedAndChangesNothing) {
  std::vector<StreamKey> keys;
  auto sinks = StartJob(2, &keys);
  service_->OnRequests(keys[0], Allreduce(0, "grad"));
  const std::string before = Status().SerializeAsString();
  int refused = 0;
  for (const Caller& outsider :
       // One address each: their refusals stay within each address's budget (Note
       // [Refusal budget]; RefusalsPerAddressAreLimitedToTenASecond tests it).
       {Caller{"ipv4:10.0.0.1:4000", "", ""}, Caller{"ipv4:10.0.0.2:4001", "guess", ""},
        Caller{"ipv4:10.0.0.3:4002", std::string(kTestSecret) + "x", tokens_[0]},
        Caller{"ipv4:10.0.0.4:4003", std::string(kTestSecret).substr(1), tokens_[1]}}) {
    for (const Attempt& a : EveryRpcAs(outsider)) {
      ++refused;
      EXPECT_EQ(a.status.code(), kDenied) << a.rpc << " as '" << outsider.job_secret << "'";
      const std::string why = outsider.job_secret.empty() ? "no job secret" : "wrong job secret";
      EXPECT_EQ(a.status.message(),
                absl::StrCat("the coordinator refused ", a.rpc == "Negotiate (admission)"
                                                             ? "Negotiate" : a.rpc,
                             ": ", why,
                             " (every rank, braidctl and braid-coordinator must use the job's "
                             "secret: BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE)"));
    }
  }
  EXPECT_EQ(service_->refusals(), refused);
  EXPECT_FALSE(service_->shutdown_requested());
  EXPECT_EQ(Status().SerializeAsString(), before);  // no counter, rank or table changed
  for (const auto& sink : sinks) EXPECT_FALSE(sink->closed);
  // The job goes on exactly as before: rank 1's request completes the tensor on both ranks.
  service_->OnRequests(keys[1], Allreduce(1, "grad"));
  for (const auto& sink : sinks) {
    ASSERT_EQ(sink->sent.size(), 1u);
    EXPECT_EQ(sink->sent[0].responses(0).names(0), "grad");
  }
}

TEST(PeerAddressTest, IsThePeerWithoutItsPort) {
  EXPECT_EQ(PeerAddress("ipv4:127.0.0.1:41234"), "ipv4:127.0.0.1");
  EXPECT_EQ(PeerAddress("ipv6:[::1]:41234"), "ipv6:[::1]");
  EXPECT_EQ(PeerAddress("ipv6:%5B::1%5D:41234"), "ipv6:%5B::1%5D");
  EXPECT_EQ(PeerAddress("ipv6:::1"), "ipv6:::1");
  EXPECT_EQ(PeerAddress("unix:/tmp/braid.sock"), "unix:/tmp/braid.sock");
  EXPECT_EQ(PeerAddress("in-process"), "in-process");
}

// Note [Refusal budget]: a brute force found BRAID_JOB_SECRET=x in 34 tries; however strong
// the secret, an address gets at most 10 wrong secrets checked a second (after a burst of
// 10), and past that its calls are refused without their secret being compared: even the
// right one. Other addresses, and the job's ranks' heartbeats, are not slowed.
TEST_F(AdmissionTest, RefusalsPerAddressAreLimitedToTenASecond) {
  std::vector<StreamKey> keys;
  auto sinks = StartJob(2, &keys);
  int port = 5000;
  auto from = [&](const std::string& ip, const std::string& secret) {
    return StatusOf(0, Caller{absl::StrCat("ipv4:", ip, ":", port++), secret, ""}).status();
  };
  const std::string wrong = "0123456789abcdef0123456789abcdef";
  const std::string throttled =
      "the coordinator refused Status: too many calls with a wrong job secret from "
      "ipv4:10.0.0.9 (at most 10 a second per address): this one's secret was not checked; "
      "retry in ";
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(absl::StrContains(from("10.0.0.9", wrong).message(), ": wrong job secret"));
  }
  // The burst is spent: the right secret from that address is not even checked.
  EXPECT_EQ(from("10.0.0.9", kTestSecret).message(), absl::StrCat(throttled, "100ms"));
  proto::RegisterRequest late = Reg(-1, 2);
  int64_t id = Register(late, Caller{"ipv4:10.0.0.9:6000", kTestSecret, ""});
  EXPECT_EQ(results_.at(id).status().code(), kDenied);
  // Another address, the job's own callers and a rank's heartbeat from the guessing
  // address (its token proves it a rank) all go through.
  EXPECT_TRUE(absl::StrContains(from("10.0.0.8", wrong).message(), ": wrong job secret"));
  EXPECT_TRUE(from("127.0.0.1", kTestSecret).ok());
  proto::HeartbeatRequest hb;
  hb.set_rank(0);
  EXPECT_TRUE(service_->Heartbeat(Caller{"ipv4:10.0.0.9:7000", kTestSecret, tokens_[0]}, hb).ok());
  // Half a token later: still refused, for the other half.
  now_ += absl::Milliseconds(50);
  EXPECT_EQ(from("10.0.0.9", wrong).message(), absl::StrCat(throttled, "50ms"));
  // A guesser trying 5 times every 100 ms for 10 s gets exactly one guess checked per 100 ms.
  int checked = 0, unchecked = 0;
  for (int step = 0; step < 100; ++step) {
    now_ += absl::Milliseconds(step == 0 ? 50 : 100);
    for (int i = 0; i < 5; ++i) {
      const std::string m(from("10.0.0.9", wrong).message());
      checked += absl::StrContains(m, ": wrong job secret");
      unchecked += absl::StartsWith(m, throttled);
    }
  }
  EXPECT_EQ(checked, 100);
  EXPECT_EQ(unchecked, 400);
  // Once it stops guessing, the right secret from that address works again.
  now_ += absl::Milliseconds(100);
  EXPECT_TRUE(from("10.0.0.9", kTestSecret).ok());
  EXPECT_EQ(service_->refusals(), 10 + 2 + 1 + 1 + 500);
  for (const auto& sink : sinks) EXPECT_FALSE(sink->closed);
}

// Guessers from many addresses: past 4096 tracked addresses the rest share one budget, so
// the table stays bounded and the many addresses together get 10 a second.
TEST_F(AdmissionTest, AddressesPastTheTableShareOneBudget) {
  int refused_checked = 0;
  auto guess = [&](int i) {
    const std::string ip = absl::StrCat("10.", i / 65536, ".", (i / 256) % 256, ".", i % 256);
    return StatusOf(0, Caller{absl::StrCat("ipv4:", ip, ":1"), "0123456789abcdef0123456789abcdef",
                              ""}).status();
  };
  for (int i = 0; i < static_cast<int>(kMaxTrackedAddresses) + 10; ++i) {
    refused_checked += absl::StrContains(guess(i).message(), ": wrong job secret");
  }
  EXPECT_EQ(refused_checked, static_cast<int>(kMaxTrackedAddresses) + 10);
  // The shared budget is spent: a new address is refused unchecked.
  EXPECT_TRUE(absl::StrContains(guess(kMaxTrackedAddresses + 10).message(),
                                "too many calls with a wrong job secret from ipv4:10."));
  // Buckets refill; full ones are dropped when the table is full, and new addresses get
  // their own again.
  now_ += absl::Seconds(1);
  EXPECT_TRUE(absl::StrContains(guess(kMaxTrackedAddresses + 11).message(), ": wrong job secret"));
}

TEST_F(AdmissionTest, ASecretHolderCannotSpeakForAnotherRank) {
  std::vector<StreamKey> keys;
  auto sinks = StartJob(2, &keys);
  ASSERT_NE(tokens_[0], tokens_[1]);
  ASSERT_EQ(tokens_[0].size(), 64u);  // 256 random bits, in hex
  // A stream as rank 0 without a token, and with rank 1's: refused, rank 0's stream kept.
  proto::RequestList hello;
  hello.set_rank(0);
  for (const std::string& token : {std::string(), tokens_[1]}) {
    Caller c = Job();
    c.rank_token = token;
    auto key = service_->OpenStream(c, hello, std::make_shared<RecordingSink>());
    EXPECT_EQ(key.status().code(), kDenied);
    EXPECT_EQ(key.status().message(),
              absl::StrCat("negotiation stream for rank 0 refused: ",
                           token.empty() ? "no rank token" : "not its token in job 1",
                           " (a stream or heartbeat speaks only for the rank that registered "
                           "it)"));
  }
  EXPECT_FALSE(sinks[0]->closed);
  EXPECT_EQ(Status().ranks(0).state(), "negotiating");
  // Rank 1 stops; heartbeats in its name with rank 0's token do not keep it alive.
  for (int i = 0; i < 10; ++i) {
    now_ += absl::Seconds(1);
    EXPECT_TRUE(Beat(0).ok());
    proto::HeartbeatRequest forged;
    forged.set_rank(1);
    absl::Status s = service_->Heartbeat(Job(0), forged);
    EXPECT_EQ(s.code(), kDenied);
    EXPECT_EQ(s.message(), "heartbeat for rank 1 refused: not its token in job 1 (a stream or "
                           "heartbeat speaks only for the rank that registered it)");
    service_->Inspect();
  }
  EXPECT_EQ(Status().ranks(1).state(), "lost");
  EXPECT_EQ(Status().ranks(0).state(), "negotiating");
  ASSERT_EQ(sinks[0]->sent.size(), 1u);
  EXPECT_EQ(sinks[0]->sent[0].abort_message(),
            "rank 1 (pid 101 on h) was lost: silent for 10s (BRAID_HEARTBEAT_TIMEOUT_S)");
}

TEST_F(AdmissionTest, AStaleStreamOrHeartbeatOfAnEarlierJobTouchesNothing) {
  std::vector<StreamKey> first;
  StartJob(2, &first);
  const std::map<int, std::string> old_tokens = tokens_;
  for (const StreamKey& k : first) Goodbye(k);
  std::vector<StreamKey> second;
  auto sinks = StartJob(2, &second);
  EXPECT_EQ(Status().job_id(), 2);
  ASSERT_NE(old_tokens.at(0), tokens_.at(0));
  // Job 1's rank 0 opens a stream (say its hello was late) and beats: both refused.
  Caller stale = Job();
  stale.rank_token = old_tokens.at(0);
  proto::RequestList hello;
  hello.set_rank(0);
  auto key = service_->OpenStream(stale, hello, std::make_shared<RecordingSink>());
  EXPECT_EQ(key.status().message(),
            "negotiation stream for rank 0 refused: not its token in job 2 (a stream or "
            "heartbeat speaks only for the rank that registered it)");
  proto::HeartbeatRequest hb;
  hb.set_rank(0);
  EXPECT_EQ(service_->Heartbeat(stale, hb).code(), kDenied);
  // Job 1's streams, still open, send requests and close: job 2 does not notice.
  service_->OnRequests(first[0], Allreduce(0, "stale"));
  service_->OnStreamEnd(first[1]);
  proto::StatusResponse s = Status();
  EXPECT_EQ(s.cycles(), 0);
  EXPECT_EQ(s.ranks(0).state(), "negotiating");
  EXPECT_EQ(s.ranks(1).state(), "negotiating");
  EXPECT_TRUE(s.abort_message().empty());
  for (const auto& sink : sinks) {
    EXPECT_FALSE(sink->closed);
    EXPECT_TRUE(sink->sent.empty());
  }
  // Job 2 negotiates normally.
  for (int r = 0; r < 2; ++r) service_->OnRequests(second[r], Allreduce(r, "fresh"));
  for (const auto& sink : sinks) ASSERT_EQ(sink->sent.size(), 1u);
}

TEST_F(AdmissionTest, TheKeyValueStoreIsBoundedAndPerJob) {
  ServiceOptions o;
  o.kv_limits.max_keys = 3;
  o.kv_limits.max_key_bytes = 8;
  o.kv_limits.max_value_bytes = 16;
  Restart(o);
  auto set = [&](const std::string& k, const std::string& v) {
    proto::KeyValueSetRequest req;
    req.set_key(k);
    req.set_value(v);
    return service_->KeyValueSet(Job(), req);
  };
  EXPECT_EQ(set("k", std::string(17, 'v')).message(),
            "key-value store of job 1: a key of 1 bytes and a value of 17 bytes exceed its "
            "limits of 8 and 16 bytes");
  EXPECT_EQ(set("a-long-key", "v").code(), absl::StatusCode::kInvalidArgument);
  for (const char* k : {"a", "b", "c"}) EXPECT_TRUE(set(k, std::string(16, 'v')).ok());
  EXPECT_EQ(set("d", "v").message(),
            "key-value store of job 1 is full: it holds its limit of 3 keys");
  EXPECT_TRUE(set("a", "replaced").ok());  // an existing key may change
  // The next job's store starts empty.
  std::vector<StreamKey> keys;
  StartJob(1, &keys);
  Goodbye(keys[0]);
  Register(Reg(0, 2));  // job 2 forms
  EXPECT_EQ(Status().job_id(), 2);
  std::optional<absl::StatusOr<proto::KeyValueGetResponse>> got;
  proto::KeyValueGetRequest get;
  get.set_key("a");
  service_->KeyValueGet(service_->NewCallId(), Job(), get, [&](auto r) { got = r; });
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_FALSE((*got)->found());
  EXPECT_TRUE(set("d", "v").ok());
}

TEST_F(AdmissionTest, AOneJobCoordinatorRefusesAnotherJobsRankAtOnce) {
  ServiceOptions o;
  o.single_job = true;
  Restart(o);
  std::vector<StreamKey> keys;
  StartJob(2, &keys);
  proto::RegisterRequest stranger = Reg(1, 2);
  stranger.set_pid(999);
  int64_t id = Register(stranger);
  ASSERT_EQ(results_.count(id), 1u);
  EXPECT_EQ(results_.at(id).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(results_.at(id).status().message(),
            "pid 999 on h tried to join a job of 2 ranks that is already running on this "
            "coordinator: is a second job using the same coordinator port? Give each job its "
            "own port (BRAID_COORDINATOR_PORT or MASTER_PORT)");
  // One of the job's own processes, initialising again, waits for the job to end.
  int64_t again = Register(Reg(0, 2));
  EXPECT_EQ(results_.count(again), 0u);
  for (const StreamKey& k : keys) Goodbye(k);
  EXPECT_EQ(Status().job_id(), 2);
  EXPECT_EQ(Status().register_rpcs(), 1);
}

TEST_F(AdmissionTest, ACoordinatorWithoutASecretRefusesEveryCall) {
  ServiceOptions o;  // no secret (Restart would fill in the test's)
  o.clock = [this] { return now_; };
  service_ = std::make_unique<CoordinatorService>(o);
  for (const Caller& c : {Caller{"p", "", ""}, Caller{"p", "anything", ""}}) {
    for (const Attempt& a : EveryRpcAs(c)) EXPECT_EQ(a.status.code(), kDenied) << a.rpc;
  }
}

}  // namespace
}  // namespace braid::coordinator
