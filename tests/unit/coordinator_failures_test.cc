// A failure anywhere reaches every rank (Note [Failure reports] in coordinator/negotiation.h),
// on the coordinator's handlers without a server: plain messages in, recording stream sinks
// out, a fake clock stepped by hand and Inspect() called as the monitor would. Failure
// reports, malformed requests, the negotiation deadline, the registration deadline naming
// the missing ranks, and the bounded response cache.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/limits.h"
#include "coordinator/negotiation.h"
#include "coordinator/service.h"
#include "gtest/gtest.h"

namespace braid::coordinator {
namespace {

class RecordingSink : public StreamSink {
 public:
  void Send(const proto::ResponseList& msg) override {
    if (!closed) sent.push_back(msg);
  }
  void Close() override { closed = true; }
  // Every response received so far, in order, and forgets them.
  std::vector<proto::Response> Take() {
    std::vector<proto::Response> out;
    for (const auto& l : sent) out.insert(out.end(), l.responses().begin(), l.responses().end());
    sent.clear();
    return out;
  }
  std::vector<proto::ResponseList> sent;
  bool closed = false;
};

proto::RegisterRequest Reg(int rank, int size) {
  proto::RegisterRequest r;
  r.set_rank(rank);
  r.set_size(size);
  r.set_local_rank(-1);
  r.set_host("h");
  r.set_pid(100 + rank);
  r.mutable_settings()->set_negotiation_timeout_ms(5000);
  return r;
}

proto::Request Request(const std::string& name, std::vector<int64_t> shape = {4}) {
  proto::Request r;
  r.set_name(name);
  r.set_collective(proto::ALLREDUCE);
  r.set_dtype(proto::FLOAT32);
  for (int64_t d : shape) r.add_shape(d);
  return r;
}

constexpr char kSecret[] = "the-job-secret-of-this-test";

class FailuresTest : public ::testing::Test {
 protected:
  FailuresTest() {
    ServiceOptions o;
    o.job_secret = kSecret;  // every call below is the job's own (Note [Who may join])
    o.clock = [this] { return now_; };
    o.register_timeout = absl::Seconds(30);
    service_ = std::make_unique<CoordinatorService>(o);
  }

  // The job's own caller: the secret, and `rank`'s token when rank >= 0.
  Caller Job(int rank = -1) const {
    Caller c{"ipv4:127.0.0.1:1000", kSecret, ""};
    if (rank >= 0 && tokens_.count(rank) != 0) c.rank_token = tokens_.at(rank);
    return c;
  }
  int64_t Register(const proto::RegisterRequest& req) {
    const int64_t id = service_->NewCallId();
    service_->Register(id, Job(), req, [this, id](absl::StatusOr<proto::RegisterResponse> r) {
      if (r.ok()) tokens_[r->rank()] = r->rank_token();
      results_.emplace(id, std::move(r));
    });
    return id;
  }
  void StartJob(int n) {
    for (int r = 0; r < n; ++r) Register(Reg(r, n));
    for (int r = 0; r < n; ++r) {
      sinks_.push_back(std::make_shared<RecordingSink>());
      proto::RequestList hello;
      hello.set_rank(r);
      auto key = service_->OpenStream(Job(r), hello, sinks_.back());
      ASSERT_TRUE(key.ok()) << key.status();
      keys_.push_back(*key);
    }
  }
  void Submit(int rank, std::vector<proto::Request> reqs) {
    proto::RequestList l;
    l.set_rank(rank);
    for (auto& r : reqs) *l.add_requests() = std::move(r);
    service_->OnRequests(keys_[rank], l);
  }
  void Fail(int rank, const std::string& name, const std::string& why, bool in_collective = false) {
    proto::RequestList l;
    l.set_rank(rank);
    proto::FailureReport* f = l.add_failures();
    f->set_name(name);
    f->set_error_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    f->set_message(why);
    f->set_in_collective(in_collective);
    service_->OnRequests(keys_[rank], l);
  }
  // Each of the first `n` ranks received exactly one response since the last Take: an OK.
  void ExpectOkOnEveryRank(int n) {
    for (int r = 0; r < n; ++r) {
      auto got = sinks_[r]->Take();
      ASSERT_EQ(got.size(), 1u) << r;
      EXPECT_EQ(got[0].type(), proto::Response::OK) << got[0].error_message();
    }
  }
  void Beat() {  // every rank alive
    for (size_t r = 0; r < keys_.size(); ++r) {
      proto::HeartbeatRequest hb;
      hb.set_rank(static_cast<int>(r));
      ASSERT_TRUE(service_->Heartbeat(Job(static_cast<int>(r)), hb).ok());
    }
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<CoordinatorService> service_;
  std::map<int64_t, absl::StatusOr<proto::RegisterResponse>> results_;
  std::map<int, std::string> tokens_;  // rank -> its token
  std::vector<std::shared_ptr<RecordingSink>> sinks_;
  std::vector<StreamKey> keys_;
};

void ExpectError(const std::vector<proto::Response>& got, const std::string& name,
                 absl::StatusCode code, const std::string& message) {
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type(), proto::Response::ERROR);
  EXPECT_EQ(got[0].names(0), name);
  EXPECT_EQ(got[0].error_code(), static_cast<int>(code));
  EXPECT_EQ(got[0].error_message(), message);
}

// Rank 1's call fails locally while ranks 0 and 2 already wait for the tensor: both get the
// error at once, alone (sequence 0), and rank 1, which goes on to its next step, nothing.
TEST_F(FailuresTest, AReportFailsTheTensorOnTheRanksThatSubmittedItAtOnce) {
  StartJob(3);
  Submit(0, {Request("w")});
  Submit(2, {Request("w")});
  Fail(1, "w", "allreduce 'w' on rank 1: unsupported dtype int8");
  const std::string msg =
      "tensor 'w' failed on rank 1: allreduce 'w' on rank 1: unsupported dtype int8";
  for (int r : {0, 2}) {
    ASSERT_EQ(sinks_[r]->sent.size(), 1u);
    EXPECT_EQ(sinks_[r]->sent[0].sequence(), 0);
    ExpectError(sinks_[r]->Take(), "w", absl::StatusCode::kInvalidArgument, msg);
  }
  EXPECT_TRUE(sinks_[1]->sent.empty());
  // The next step of the same tensor negotiates normally, in the common order.
  for (int r : {1, 0, 2}) Submit(r, {Request("w")});
  for (int r = 0; r < 3; ++r) {
    auto got = sinks_[r]->Take();
    ASSERT_EQ(got.size(), 1u) << r;
    EXPECT_EQ(got[0].type(), proto::Response::OK);
  }
}

// The message a poisoned name's later calls fail with (Note [Resynchronization]).
std::string Poisoned(const std::string& name, int rank, const std::string& cause) {
  return absl::StrCat("tensor '", name, "' was not run on rank ", rank,
                      ": an earlier instance of it failed before every rank had submitted it (",
                      cause,
                      "), so braid cannot tell which step of the other ranks this call pairs "
                      "with; every call of it fails on every rank until all ranks call barrier()");
}

// The message every call fails with once the negotiation deadline made the job out of step.
std::string OutOfStep(const std::string& name, int rank, const std::string& cause) {
  return absl::StrCat("tensor '", name, "' was not run on rank ", rank,
                      ": the ranks are out of step since a collective waited out the "
                      "negotiation deadline (",
                      cause,
                      "); every collective fails on every rank until all ranks call barrier()");
}

proto::Request Barrier(const std::string& name) {
  proto::Request r;
  r.set_name(name);
  r.set_collective(proto::BARRIER);
  r.set_dtype(proto::UINT8);
  return r;
}

// The report arrives before the others submit: ranks 0 and 2 may be slow (their next 'w' is
// the failed step) or may have skipped the call (their next 'w' is the next step), and the
// coordinator cannot tell. It does not guess: every later call of 'w' fails on every rank,
// the reporter's next step too, naming the first error, until a barrier; then 'w' pairs
// again, step for step.
TEST_F(FailuresTest, AOneSidedReportFailsEveryLaterCallOfTheNameUntilABarrier) {
  StartJob(3);
  Fail(1, "w", "bad splits");
  const std::string cause = "tensor 'w' failed on rank 1: bad splits";
  Submit(1, {Request("w")});  // rank 1's next step
  ExpectError(sinks_[1]->Take(), "w", absl::StatusCode::kFailedPrecondition,
              Poisoned("w", 1, cause));
  for (int r : {0, 2}) {
    Submit(r, {Request("w")});
    ExpectError(sinks_[r]->Take(), "w", absl::StatusCode::kFailedPrecondition,
                Poisoned("w", r, cause));
    Submit(r, {Request("w")});  // and its step after that
    ExpectError(sinks_[r]->Take(), "w", absl::StatusCode::kFailedPrecondition,
                Poisoned("w", r, cause));
  }
  for (int r : {2, 0, 1}) Submit(r, {Barrier("resync")});
  for (int r = 0; r < 3; ++r) {
    auto got = sinks_[r]->Take();
    ASSERT_EQ(got.size(), 1u) << r;
    EXPECT_EQ(got[0].type(), proto::Response::OK) << got[0].error_message();
    EXPECT_EQ(got[0].names(0), "resync");
    EXPECT_EQ(got[0].cache_ids(0), 0) << "a barrier is never cached";
  }
  for (int r : {0, 1, 2}) Submit(r, {Request("w")});  // after the barrier: pairs again
  ExpectOkOnEveryRank(3);
}

// A rank's report and its next call of the same name in one list: the report is the earlier
// step (a name is reported only while no instance of it is in flight on the rank), so it
// fails the step the others wait in, and the new call waits for their next one. Taken in
// the other order, the new call would have completed with the others' failed step.
TEST_F(FailuresTest, AReportAndTheNextCallInOneListAreTakenInThatOrder) {
  StartJob(2);
  Submit(0, {Request("w")});
  proto::RequestList l;
  l.set_rank(1);
  *l.add_requests() = Request("w");
  proto::FailureReport* f = l.add_failures();
  f->set_name("w");
  f->set_error_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  f->set_message("bad splits");
  service_->OnRequests(keys_[1], l);
  ExpectError(sinks_[0]->Take(), "w", absl::StatusCode::kInvalidArgument,
              "tensor 'w' failed on rank 1: bad splits");
  EXPECT_TRUE(sinks_[1]->sent.empty());
  Submit(0, {Request("w")});  // rank 0's next step meets rank 1's
  ExpectOkOnEveryRank(2);
}

// What the coordinator still holds when a barrier completes was called before the barrier
// by some ranks and skipped by the others, which have all passed it: it fails at once on the
// ranks that called it, naming both sides and the barrier, instead of pairing with the next
// step of the ranks that skipped it (and it poisons nothing: their next calls follow the
// barrier).
TEST_F(FailuresTest, ACallStillPendingWhenABarrierCompletesFailsInsteadOfPairingLater) {
  StartJob(3);
  Submit(0, {Request("x")});
  Submit(2, {Request("x")});
  Submit(0, {Barrier("b")});
  Submit(2, {Barrier("b")});
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(sinks_[r]->sent.empty());
  Submit(1, {Barrier("b")});  // rank 1 skipped 'x'
  const std::string stale =
      "tensor 'x' was submitted by ranks 0, 2 but not by rank 1 before barrier 'b', which "
      "every rank has passed: it can never pair (a rank skipped it or called it under "
      "another name)";
  for (int r : {0, 2}) {
    auto got = sinks_[r]->Take();
    ASSERT_EQ(got.size(), 2u) << r;
    ExpectError({got[0]}, "x", absl::StatusCode::kInvalidArgument, stale);  // to it alone
    EXPECT_EQ(got[1].type(), proto::Response::OK);  // the barrier, in the common order
    EXPECT_EQ(got[1].names(0), "b");
  }
  auto got1 = sinks_[1]->Take();
  ASSERT_EQ(got1.size(), 1u);
  EXPECT_EQ(got1[0].names(0), "b");
  for (int r : {1, 0, 2}) Submit(r, {Request("x")});
  ExpectOkOnEveryRank(3);
}

// Rank 1 skipped 'x' and waits in the barrier; rank 0 waits in 'x'. The barrier reaches the
// negotiation deadline first, but the barrier is how the ranks resynchronize: 'x' fails
// instead (the job is out of step), and the barrier waits on, completing once rank 0, freed,
// comes to it; then the job runs again.
TEST_F(FailuresTest, ABarrierWaitsOnWhileACallKeepsARankFromIt) {
  StartJob(2);
  Submit(1, {Barrier("b")});
  now_ += absl::Seconds(1);
  Submit(0, {Request("x")});
  now_ += absl::Seconds(4);
  Beat();
  service_->Inspect();  // the barrier is 5 s old, 'x' 4 s
  EXPECT_TRUE(sinks_[1]->sent.empty()) << "the barrier must not fail";
  auto got = sinks_[0]->Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].names(0), "x");
  EXPECT_EQ(got[0].error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(got[0].error_message(),
            "tensor 'x' (submitted by rank 0 but not yet by rank 1) fails with the job's "
            "negotiation deadline: tensor 'b' was not negotiated within 5s "
            "(BRAID_NEGOTIATION_TIMEOUT_S): submitted by rank 1 but not by rank 0 (ranks "
            "calling collectives under different names, or a rank that never calls it); every "
            "collective fails on every rank until all ranks call barrier()");
  now_ += absl::Seconds(4);  // the barrier's deadline started again
  Beat();
  service_->Inspect();
  EXPECT_TRUE(sinks_[1]->sent.empty());
  Submit(0, {Barrier("b")});
  ExpectOkOnEveryRank(2);
  for (int r = 0; r < 2; ++r) Submit(r, {Request("x")});
  ExpectOkOnEveryRank(2);
}

// A barrier that fails one-sidedly is not poisoned (a poisoned barrier could never
// resynchronize): the late rank's barrier waits for the next one of that name.
TEST_F(FailuresTest, AFailedBarrierIsNotPoisoned) {
  StartJob(2);
  Submit(0, {Barrier("b")});
  now_ += absl::Seconds(5);
  Beat();
  service_->Inspect();
  auto got = sinks_[0]->Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].error_code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  Submit(1, {Barrier("b")});
  EXPECT_TRUE(sinks_[1]->sent.empty());
  Submit(0, {Barrier("b")});
  ExpectOkOnEveryRank(2);
}

// A rank that fails inside a collective (the others may be blocked in it): the job is
// aborted on every rank with the tensor, the rank and the cause.
TEST_F(FailuresTest, AFailureInsideACollectiveAbortsTheJob) {
  StartJob(2);
  Fail(1, "w", "compression 'fp4': scale overflow", /*in_collective=*/true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(sinks_[r]->sent.size(), 1u);
    EXPECT_EQ(sinks_[r]->sent[0].abort_message(),
              "tensor 'w' failed on rank 1 inside its collective: compression 'fp4': scale "
              "overflow");
    EXPECT_EQ(sinks_[r]->sent[0].abort_code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
}

// A request that would overflow, or exceeds a limit, fails on every rank naming the field
// and the rank; its sender is answered too (it holds a handle).
TEST_F(FailuresTest, MalformedRequestsFailOnEveryRankNamingTheField) {
  StartJob(2);
  struct Case {
    proto::Request request;
    std::string message;
  };
  proto::Request unknown_dtype = Request("d");
  unknown_dtype.set_dtype(static_cast<proto::DataType>(99));
  const std::vector<Case> cases = {
      {Request("neg", {3, -1}), "rank 1's request for tensor 'neg': the shape[1] is negative: -1"},
      {Request("huge", {int64_t{1} << 40, int64_t{1} << 40}),
       "rank 1's request for tensor 'huge': the product of the shape overflows: more than "
       "281474976710656 elements (the limit of a tensor is 2^48 bytes)"},
      {Request("bytes", {int64_t{1} << 47}),
       "rank 1's request for tensor 'bytes': the shape: 140737488355328 elements of 4 bytes "
       "exceed the limit of a tensor, 2^48 bytes"},
      {Request("dims", std::vector<int64_t>(65, 1)),
       "rank 1's request for tensor 'dims': the shape has 65 dimensions, more than the limit "
       "of 64"},
      {unknown_dtype, "rank 1's request for tensor 'd': unknown dtype 99"},
      {Request(std::string(2000, 'n')),
       absl::StrCat("rank 1's request for tensor '", std::string(64, 'n'),
                    "...': the name is 2000 bytes long, more than the limit of 1024 (it "
                    "starts '",
                    std::string(64, 'n'), "...')")},
  };
  for (const Case& c : cases) {
    Submit(1, {c.request});
    ExpectError(sinks_[1]->Take(), c.request.name(), absl::StatusCode::kInvalidArgument,
                c.message);
    // A well-formed request after it is answered at once: rank 0 may be late or may have
    // skipped that call, so the name fails until a barrier (Note [Resynchronization]).
    Submit(0, {Request(c.request.name())});
    if (c.request.name().size() > kMaxNameBytes) {  // refused again, by its own size
      ExpectError(sinks_[0]->Take(), c.request.name(), absl::StatusCode::kInvalidArgument,
                  absl::StrReplaceAll(c.message, {{"rank 1's", "rank 0's"}}));
    } else {
      ExpectError(sinks_[0]->Take(), c.request.name(), absl::StatusCode::kFailedPrecondition,
                  Poisoned(c.request.name(), 0, c.message));
    }
  }
}

// Ranks 0 and 1 submit 'a', rank 2 submits 'b' instead (different names): after the
// negotiation timeout (5 s here) every rank gets an error naming the ranks that did and did
// not submit; the stall check still reports before that. A late 'a' from rank 2 is answered,
// and every call fails until a barrier.
TEST_F(FailuresTest, TheNegotiationDeadlineFailsTensorsNamingTheRanks) {
  StartJob(3);
  Submit(0, {Request("a")});
  Submit(1, {Request("a")});
  Submit(2, {Request("b")});
  now_ += absl::Milliseconds(4900);
  Beat();
  service_->Inspect();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(sinks_[r]->sent.empty());
  now_ += absl::Milliseconds(100);
  Beat();
  service_->Inspect();
  const std::string a =
      "tensor 'a' was not negotiated within 5s (BRAID_NEGOTIATION_TIMEOUT_S): submitted by "
      "ranks 0, 1 but not by rank 2 (ranks calling collectives under different names, or a "
      "rank that never calls it)";
  const std::string b =
      "tensor 'b' was not negotiated within 5s (BRAID_NEGOTIATION_TIMEOUT_S): submitted by "
      "rank 2 but not by ranks 0, 1 (ranks calling collectives under different names, or a "
      "rank that never calls it)";
  for (int r : {0, 1}) ExpectError(sinks_[r]->Take(), "a", absl::StatusCode::kDeadlineExceeded, a);
  ExpectError(sinks_[2]->Take(), "b", absl::StatusCode::kDeadlineExceeded, b);
  // Rank 2's 'a' may be its late call or its next step's: the job is out of step, and every
  // call fails everywhere until a barrier (Note [Resynchronization]); then 'a' pairs again.
  Submit(2, {Request("a")});
  ExpectError(sinks_[2]->Take(), "a", absl::StatusCode::kFailedPrecondition,
              OutOfStep("a", 2, a));
  Submit(0, {Request("a"), Request("c")});
  auto got = sinks_[0]->Take();
  ASSERT_EQ(got.size(), 2u);
  ExpectError({got[0]}, "a", absl::StatusCode::kFailedPrecondition, OutOfStep("a", 0, a));
  ExpectError({got[1]}, "c", absl::StatusCode::kFailedPrecondition, OutOfStep("c", 0, a));
  for (int r = 0; r < 3; ++r) Submit(r, {Barrier("resync")});
  for (int r = 0; r < 3; ++r) sinks_[r]->Take();
  for (int r = 0; r < 3; ++r) Submit(r, {Request("a")});
  ExpectOkOnEveryRank(3);
  // Nothing is left pending, and the job runs on.
  std::optional<absl::StatusOr<proto::StatusResponse>> status;
  service_->Status(service_->NewCallId(), Job(), {}, [&](auto s) { status = std::move(s); });
  ASSERT_TRUE(status && status->ok());
  EXPECT_EQ((*status)->tensors_pending(), 0);
  EXPECT_EQ((*status)->settings().negotiation_timeout_ms(), 5000);
  EXPECT_EQ((*status)->job_state(), "running");
}

// A registration asking for more ranks than braid allows is refused at once (a world size
// of 2^30 would otherwise be waited for, and its missing ranks listed, by the coordinator);
// a large world's missing ranks are named up to 32, then counted.
TEST_F(FailuresTest, AWorldOverTheLimitIsRefusedAndALargeOnesMissingRanksAreCounted) {
  const int64_t huge = Register(Reg(0, kMaxWorldSize + 1));
  ASSERT_EQ(results_.count(huge), 1u);
  EXPECT_EQ(results_.at(huge).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(results_.at(huge).status().message(),
            "pid 100 on h asks for a world of 65537 ranks; braid's limit is 65536");
  const int64_t first = Register(Reg(0, 100));
  now_ += absl::Seconds(30);
  service_->Inspect();
  ASSERT_EQ(results_.count(first), 1u);
  EXPECT_EQ(results_.at(first).status().message(),
            "only 1 of 100 ranks registered within 30s: missing ranks 1, 2, 3, 4, 5, 6, 7, 8, "
            "9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, "
            "30, 31, 32 and 67 more; registered: rank 0 (pid 100 on h)");
}

// The default negotiation timeout is long (1800 s): checkpoints and evaluations on one rank
// are normal.
TEST_F(FailuresTest, TheDefaultNegotiationTimeoutIsHalfAnHour) {
  proto::RegisterRequest req = Reg(0, 1);
  req.clear_settings();
  const int64_t id = Register(req);
  ASSERT_TRUE(results_.at(id).ok());
  EXPECT_EQ(results_.at(id)->settings().negotiation_timeout_ms(), 1800 * 1000);
}

// A world that never fully registers names the missing ranks: those claimed by nobody, after
// the registrations without a rank took the lowest free ones, which name that rank (not a
// bare "(pid 200 on h)"). When the first registration's
// deadline passes, every waiting one fails with it (the world cannot form any more).
TEST_F(FailuresTest, TheRegistrationDeadlineNamesTheMissingRanks) {
  const int64_t first = Register(Reg(0, 5));
  now_ += absl::Seconds(10);
  const int64_t second = Register(Reg(3, 5));
  proto::RegisterRequest anyone = Reg(-1, 5);
  anyone.set_pid(200);
  const int64_t third = Register(anyone);
  now_ += absl::Seconds(19);
  service_->Inspect();
  EXPECT_TRUE(results_.empty());
  now_ += absl::Seconds(1);
  service_->Inspect();
  const std::string want =
      "only 3 of 5 ranks registered within 30s: missing ranks 2, 4; registered: rank 0 (pid "
      "100 on h), rank 3 (pid 103 on h), rank 1 (assigned; pid 200 on h)";
  for (int64_t id : {first, second, third}) {
    ASSERT_EQ(results_.count(id), 1u);
    EXPECT_EQ(results_.at(id).status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(results_.at(id).status().message(), want);
  }
}

// ---- The response cache stays bounded (Note [Response cache]) ----

// One tensor cycling through shapes with a cache of one entry: every step evicts. Retired
// entries are kept until every rank reports it applied the list that carried the eviction.
TEST(ResponseCacheBoundTest, RetiredEntriesAreForgottenOnceEveryRankAppliedTheirEviction) {
  NegotiationTable table(2, 0, /*cache_capacity=*/1);
  int64_t sequence = 0;
  for (int step = 0; step < 100; ++step) {
    for (int r = 0; r < 2; ++r) {
      proto::RequestList l;
      l.set_rank(r);
      *l.add_requests() = Request("w", {step % 8 + 1});
      table.Submit(r, l);
    }
    table.TakeEvictions(++sequence);
  }
  EXPECT_EQ(table.retired_entries(), 99u);  // nobody reported: all kept
  table.ReleaseRetired(sequence - 10);       // the ranks applied all but the last ten lists
  EXPECT_EQ(table.retired_entries(), 10u);
  table.ReleaseRetired(sequence);
  EXPECT_EQ(table.retired_entries(), 0u);
}

// Every list every rank receives is numbered, so ranks can report what they applied.
TEST_F(FailuresTest, BroadcastListsAreNumberedInOrder) {
  StartJob(2);
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < 2; ++r) Submit(r, {Request(absl::StrCat("t", step))});
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(sinks_[r]->sent.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sinks_[r]->sent[i].sequence(), i + 1);
  }
}

}  // namespace
}  // namespace braid::coordinator
