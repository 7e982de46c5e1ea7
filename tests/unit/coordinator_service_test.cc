// The coordinator's handlers (coordinator/service.h) without a server: plain messages in,
// completion callbacks and recording stream sinks out, a fake clock stepped by hand and
// Inspect() called as the monitor would. Also the job settings' resolution and the monitor.
// Who may call them: coordinator_admission_test.cc.
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/monitor.h"
#include "coordinator/rendezvous.h"
#include "coordinator/service.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_service_fixture.h"

namespace braid::coordinator {
namespace {

// ---- Report ages: only to the ranks that asked ----

// A rank that asked (its timeline marks when every rank reported) gets one age per rank per
// tensor; the others get none, so their responses do not grow with the world size.
TEST_F(ServiceTest, ReportAgesOnlyToRanksThatAskedForThem) {
  const int n = 3;
  std::vector<int64_t> ids;
  for (int r = 0; r < n; ++r) ids.push_back(Register(Reg(r, n)));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<StreamKey> keys;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(results_.at(ids[r]).ok());
    sinks.push_back(std::make_shared<RecordingSink>());
    proto::RequestList hello;
    hello.set_rank(r);
    hello.set_report_ages(r == 1);
    keys.push_back(*service_->OpenStream(Job(r), hello, sinks.back()));
  }
  for (int r = 0; r < n; ++r) {
    now_ += absl::Microseconds(250);
    service_->OnRequests(keys[r], Allreduce(r, "w"));
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(sinks[r]->sent.size(), 1u) << "rank " << r;
    const proto::Response& resp = sinks[r]->sent[0].responses(0);
    EXPECT_EQ(resp.type(), proto::Response::OK);
    EXPECT_EQ(resp.names(0), "w");
    if (r == 1) {
      ASSERT_EQ(resp.report_age_us_size(), n);
      EXPECT_EQ(resp.report_age_us(0), 500);  // rank 0 reported two steps of 250 us earlier
      EXPECT_EQ(resp.report_age_us(1), 250);
      EXPECT_EQ(resp.report_age_us(2), 0);
    } else {
      EXPECT_EQ(resp.report_age_us_size(), 0) << "rank " << r;
    }
  }
}

// ---- Coalesced writes: never in a fast-path job ----

// Note [Coalesced writes] in server.cc: the ranks of a job with the fast path count the lists
// they receive to agree where to apply them, so their streams must not merge lists (each
// broadcast list is numbered); without the fast path they may.
class CoalesceTest : public ServiceTest {
 protected:
  // Opens the streams of ranks 0..n-1 (registered already), each by its own rank.
  std::vector<std::shared_ptr<RecordingSink>> OpenStreams(int n) {
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (int r = 0; r < n; ++r) {
      sinks.push_back(std::make_shared<RecordingSink>());
      auto key = Open(r, sinks.back());
      EXPECT_TRUE(key.ok()) << key.status();
    }
    return sinks;
  }
};

TEST_F(CoalesceTest, StreamsOfAFastPathJobAreNeverCoalesced) {
  for (int r = 0; r < 2; ++r) {
    proto::RegisterRequest req = Reg(r, 2);
    req.mutable_settings()->set_fast_path(1);  // as kDefaultFastPath, but said outright
    Register(req);
  }
  for (const auto& sink : OpenStreams(2)) {
    EXPECT_EQ(sink->coalesce, std::optional<bool>(false));
  }
}

TEST_F(CoalesceTest, StreamsOfAJobWithoutTheFastPathMayBeCoalesced) {
  for (int r = 0; r < 2; ++r) {
    proto::RegisterRequest req = Reg(r, 2);
    req.mutable_settings()->set_fast_path(0);
    Register(req);
  }
  for (const auto& sink : OpenStreams(2)) {
    EXPECT_EQ(sink->coalesce, std::optional<bool>(true));
  }
}

// ---- Registration: one call per rank, every peer in the answer ----

TEST_F(ServiceTest, RegistrationIsOneCallPerRankAndReturnsEveryPeer) {
  const int n = 8;
  std::vector<int64_t> ids;
  // Ranks 7..0 register in reverse order; nobody is answered before the last arrives.
  for (int r = n - 1; r >= 0; --r) {
    ids.push_back(Register(Reg(r, n)));
    if (r > 0) {
      EXPECT_TRUE(results_.empty());
    }
  }
  ASSERT_EQ(results_.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto& resp = results_.at(ids[i]);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->rank(), n - 1 - i);
    EXPECT_EQ(resp->size(), n);
    ASSERT_EQ(resp->peers_size(), n);
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(resp->peers(p).rank(), p);
      EXPECT_EQ(resp->peers(p).transport_address(), "ucx-addr-" + std::to_string(p));
      EXPECT_EQ(resp->peers(p).pid(), 100 + p);
    }
    EXPECT_EQ(resp->settings().SerializeAsString(), DefaultJobSettings().SerializeAsString());
  }
  proto::StatusResponse s = Status();
  EXPECT_EQ(s.job_id(), 1);
  EXPECT_EQ(s.phase(), proto::JOB_RUNNING);
  EXPECT_EQ(s.register_rpcs(), n);
  EXPECT_EQ(s.kv_rpcs(), 0);
  EXPECT_EQ(s.ranks(3).state(), "registered");
  EXPECT_EQ(s.settings().heartbeat_timeout_ms(), 10000);
}

// Ranks that disagree on the world size can never form a world: the newcomer and every rank
// already waiting fail at once, naming both sizes (not the waiting ones at the deadline).
TEST_F(ServiceTest, WorldSizeMismatchFailsEveryRankAtOnce) {
  int64_t first = Register(Reg(0, 2));
  int64_t mismatch = Register(Reg(1, 3));
  const std::string why =
      "the ranks disagree on the world size (3 vs 2): rank 1 (pid 101 on h) expects 3 but "
      "rank 0 (pid 100 on h) expects 2: give every rank the same world size (WORLD_SIZE, "
      "BRAID_SIZE, ...)";
  EXPECT_EQ(results_.at(mismatch).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(results_.at(mismatch).status().message(), why);
  EXPECT_EQ(results_.at(first).status().message(), why);
  EXPECT_EQ(Status().phase(), proto::JOB_ENDED);
}

// A coordinator hosted for one job (rank 0's, braidrun's): a rank with another world size
// may come before rank 0 registers; rank 0 then gets the same error at once, not the
// register timeout, and so does every later registration.
TEST_F(ServiceTest, OnAOneJobCoordinatorAWorldSizeMismatchRefusesTheRanksStillToCome) {
  ServiceOptions o;
  o.world_size = 2;
  o.single_job = true;
  Restart(o);
  int64_t early = Register(Reg(1, 3));
  int64_t rank0 = Register(Reg(0, 2));
  const std::string why =
      "the ranks disagree on the world size (3 vs 2): rank 1 (pid 101 on h) expects 3 but "
      "this coordinator was started for 2: give every rank the same world size (WORLD_SIZE, "
      "BRAID_SIZE, ...)";
  EXPECT_EQ(results_.at(early).status().message(), why);
  ASSERT_EQ(results_.count(rank0), 1u);
  EXPECT_EQ(results_.at(rank0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(results_.at(rank0).status().message(), why);
}

TEST_F(ServiceTest, RegistrationsThatMissTheDeadlineFailAndFreeTheWorldSize) {
  int64_t lonely = Register(Reg(0, 2));
  now_ += absl::Seconds(29);
  service_->Inspect();
  EXPECT_TRUE(results_.empty());
  // While the job forms, its status lists the ranks registered so far (braidctl's table).
  proto::StatusResponse forming = Status();
  EXPECT_EQ(forming.phase(), proto::JOB_FORMING);
  ASSERT_EQ(forming.ranks_size(), 1);
  EXPECT_EQ(forming.ranks(0).rank(), 0);
  EXPECT_EQ(forming.ranks(0).host(), "h");
  EXPECT_EQ(forming.ranks(0).pid(), 100);
  EXPECT_EQ(forming.ranks(0).state(), "registered");
  EXPECT_EQ(forming.ranks(0).last_seen_ms_ago(), 29000);
  now_ += absl::Seconds(1);
  service_->Inspect();
  ASSERT_EQ(results_.count(lonely), 1u);
  EXPECT_EQ(results_.at(lonely).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(results_.at(lonely).status().message(),
            "only 1 of 2 ranks registered within 30s: missing rank 1; registered: rank 0 (pid "
            "100 on h)");
  // The job failed, and its status says why (not "forming"), for braidctl.
  proto::StatusResponse failed = Status();
  EXPECT_EQ(failed.job_id(), 1);
  EXPECT_EQ(failed.phase(), proto::JOB_ENDED);
  EXPECT_EQ(failed.size(), 2);
  EXPECT_EQ(failed.job_state(),
            "ended, aborted: registration failed: only 1 of 2 ranks registered within 30s: "
            "missing rank 1; registered: rank 0 (pid 100 on h)");
  EXPECT_EQ(failed.abort_message(),
            "registration failed: only 1 of 2 ranks registered within 30s: missing rank 1; "
            "registered: rank 0 (pid 100 on h)");
  // Nobody waits any more: the next job, of another size, may form.
  int64_t solo = Register(Reg(0, 1));
  EXPECT_TRUE(results_.at(solo).ok()) << results_.at(solo).status();
  EXPECT_EQ(Status().job_id(), 2);
  EXPECT_EQ(Status().phase(), proto::JOB_RUNNING);
}

TEST_F(ServiceTest, CancelledRegistrationIsAnsweredOnce) {
  int64_t id = Register(Reg(0, 2));
  service_->Cancel(id);
  EXPECT_EQ(results_.at(id).status().code(), absl::StatusCode::kCancelled);
  service_->Cancel(id);  // a second cancel finds nothing
  EXPECT_EQ(Status().register_rpcs(), 1);
}

// ---- Job settings (Note [Job settings]) ----

TEST_F(ServiceTest, RanksThatDisagreeOnAJobSettingAreAllRefused) {
  proto::RegisterRequest a = Reg(0, 3), b = Reg(1, 3), c = Reg(2, 3);
  a.mutable_settings()->set_stall_check_ms(1500);
  b.mutable_settings()->set_stall_check_ms(1500);
  c.mutable_settings()->set_stall_check_ms(2000);
  std::vector<int64_t> ids = {Register(a), Register(b), Register(c)};
  for (int64_t id : ids) {
    EXPECT_EQ(results_.at(id).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(results_.at(id).status().message(),
              "BRAID_STALL_CHECK_S must be the same for the whole job, got 1.5 on ranks 0, 1; "
              "2 on rank 2");
  }
  proto::StatusResponse s = Status();
  EXPECT_EQ(s.phase(), proto::JOB_ENDED);
  EXPECT_EQ(s.job_state(),
            "ended, aborted: registration failed: BRAID_STALL_CHECK_S must be the same for the "
            "whole job, got 1.5 on ranks 0, 1; 2 on rank 2");
}

TEST(JobSettingsTest, CoordinatorsValueBindsRanksAgreeOrTakeTheJobs) {
  std::vector<proto::RegisterRequest> reqs = {Reg(0, 2), Reg(1, 2)};
  auto assigned = AssignRanks(reqs, 2);
  ASSERT_TRUE(assigned.ok());
  proto::JobSettings coordinator;
  coordinator.set_fusion_threshold_bytes(1024);
  reqs[1].mutable_settings()->set_heartbeat_timeout_ms(2000);  // rank 0 leaves it unset
  auto s = ResolveJobSettings(coordinator, reqs, *assigned);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->fusion_threshold_bytes(), 1024);
  EXPECT_EQ(s->heartbeat_timeout_ms(), 2000);
  EXPECT_EQ(s->cache_capacity(), 1024);         // default
  EXPECT_EQ(s->stall_check_ms(), 60000);        // default
  EXPECT_TRUE(s->has_stall_shutdown_ms());      // every field present
  EXPECT_EQ(s->stall_shutdown_ms(), 0);
  reqs[0].mutable_settings()->set_fusion_threshold_bytes(2048);
  EXPECT_EQ(ResolveJobSettings(coordinator, reqs, *assigned).status().message(),
            "BRAID_FUSION_THRESHOLD must be the same for the whole job, got 1024 at the "
            "coordinator; 2048 on rank 0");
  reqs[0].mutable_settings()->set_fusion_threshold_bytes(1024);  // agreeing is fine
  EXPECT_TRUE(ResolveJobSettings(coordinator, reqs, *assigned).ok());
  EXPECT_EQ(s->gpu_data_plane(), 0);  // auto, the default
  // A setting of names shows them: every rank must choose the same GPU data plane.
  reqs[0].mutable_settings()->set_gpu_data_plane(1);
  reqs[1].mutable_settings()->set_gpu_data_plane(2);
  EXPECT_EQ(ResolveJobSettings(coordinator, reqs, *assigned).status().message(),
            "BRAID_GPU_DATA_PLANE must be the same for the whole job, got nccl on rank 0; host "
            "on rank 1");
  // A number that names no value (another version's client) is refused, not run as auto.
  reqs[0].mutable_settings()->set_gpu_data_plane(3);
  reqs[1].mutable_settings()->set_gpu_data_plane(3);
  EXPECT_EQ(ResolveJobSettings(coordinator, reqs, *assigned).status().message(),
            "BRAID_GPU_DATA_PLANE = 3 on rank 0 names no value (3 values: auto, nccl, host)");
  reqs[0].mutable_settings()->set_gpu_data_plane(0);
  reqs[1].mutable_settings()->set_gpu_data_plane(0);
  // The data plane's pipeline and autotuning: defaults, and out of range refused.
  s = ResolveJobSettings(coordinator, reqs, *assigned);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ring_chunk_bytes(), 0);  // by topology
  EXPECT_EQ(s->ring_window(), 4);
  EXPECT_EQ(s->autotune(), 0);
  reqs[0].mutable_settings()->set_ring_window(0);
  reqs[1].mutable_settings()->set_ring_window(0);
  EXPECT_EQ(ResolveJobSettings(coordinator, reqs, *assigned).status().message(),
            "BRAID_RING_WINDOW = 0, BRAID_RING_CHUNK_BYTES = 0, BRAID_AUTOTUNE = 0: out of "
            "range (window 1 to 64, chunk 0 or 1024 to 67108864 bytes, autotune 0 or 1)");
}

// ---- Streams ----

TEST_F(ServiceTest, EveryStreamGetsTheSameResponsesAndGoodbyesEndTheJob) {
  std::vector<StreamKey> keys;
  auto sinks = StartJob(3, &keys);
  for (int r = 0; r < 3; ++r) service_->OnRequests(keys[r], Allreduce(r, "w"));
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(sinks[r]->sent.size(), 1u);
    EXPECT_EQ(sinks[r]->sent[0].SerializeAsString(), sinks[0]->sent[0].SerializeAsString());
  }
  EXPECT_EQ(sinks[0]->sent[0].responses(0).names(0), "w");
  EXPECT_EQ(Status().ranks(1).state(), "negotiating");
  Goodbye(keys[0]);
  Goodbye(keys[1]);
  EXPECT_TRUE(sinks[0]->closed);
  EXPECT_EQ(Status().phase(), proto::JOB_RUNNING);
  Goodbye(keys[2]);
  proto::StatusResponse s = Status();
  EXPECT_EQ(s.phase(), proto::JOB_ENDED);
  EXPECT_EQ(s.job_state(), "ended");
  EXPECT_EQ(s.ranks(2).state(), "shut down");
  EXPECT_EQ(s.tensors_negotiated(), 1);
  EXPECT_EQ(s.cycles(), 3);
}

TEST_F(ServiceTest, StreamBeforeTheJobFormedIsRefused) {
  Register(Reg(0, 2));
  auto key = Open(0, std::make_shared<RecordingSink>());
  EXPECT_EQ(key.status().message(), "rank 0 opened negotiation before job 1 formed");
}

TEST_F(ServiceTest, AStreamClosingWithoutGoodbyeLosesTheRankAndAbortsTheJob) {
  std::vector<StreamKey> keys;
  auto sinks = StartJob(2, &keys);
  service_->OnStreamEnd(keys[1]);
  ASSERT_EQ(sinks[0]->sent.size(), 1u);
  EXPECT_EQ(sinks[0]->sent[0].abort_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(sinks[0]->sent[0].abort_message(),
            "rank 1 (pid 101 on h) was lost: its connection to the coordinator closed");
  EXPECT_EQ(Status().ranks(1).state(), "lost");
  Goodbye(keys[0]);
  proto::StatusResponse s = Status();
  EXPECT_EQ(s.phase(), proto::JOB_ENDED);
  EXPECT_EQ(s.abort_message(),
            "rank 1 (pid 101 on h) was lost: its connection to the coordinator closed");
}

TEST_F(ServiceTest, ASilentRankIsLostAfterTheHeartbeatTimeout) {
  // Whoever hosts the coordinator is told which rank was lost and why (braidrun ends it).
  std::vector<std::pair<int, std::string>> told;
  ServiceOptions o;
  o.on_rank_lost = [&](int rank, int, const std::string& why) { told.emplace_back(rank, why); };
  Restart(o);
  std::vector<StreamKey> keys;
  auto sinks = StartJob(2, &keys);
  now_ += absl::Seconds(9);
  EXPECT_TRUE(Beat(0).ok());
  service_->Inspect();
  EXPECT_TRUE(sinks[0]->sent.empty());
  now_ += absl::Seconds(1);  // rank 1 silent for 10 s, the default heartbeat timeout
  service_->Inspect();
  ASSERT_EQ(sinks[0]->sent.size(), 1u);
  EXPECT_EQ(sinks[0]->sent[0].abort_message(),
            "rank 1 (pid 101 on h) was lost: silent for 10s (BRAID_HEARTBEAT_TIMEOUT_S)");
  // The lost rank is told why before its stream closes (it may only have been stopped).
  ASSERT_EQ(sinks[1]->sent.size(), 1u);
  EXPECT_EQ(sinks[1]->sent[0].abort_message(), sinks[0]->sent[0].abort_message());
  EXPECT_TRUE(sinks[1]->closed);
  EXPECT_EQ(Status().ranks(0).state(), "negotiating");
  EXPECT_EQ(Status().ranks(1).state(), "lost");
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0], std::make_pair(1, std::string("rank 1 (pid 101 on h) was lost: silent for "
                                                   "10s (BRAID_HEARTBEAT_TIMEOUT_S)")));
}

// A 2-rank job with the given stall check and shutdown, whose rank 0 alone submits 'lonely'.
class StallTest : public ServiceTest {
 protected:
  void StartStalledJob(int64_t check_ms, int64_t shutdown_ms) {
    for (int r = 0; r < 2; ++r) {
      proto::RegisterRequest req = Reg(r, 2);
      req.mutable_settings()->set_stall_check_ms(check_ms);
      req.mutable_settings()->set_stall_shutdown_ms(shutdown_ms);
      Register(req);
    }
    std::vector<StreamKey> keys;
    for (int r = 0; r < 2; ++r) {
      sinks_.push_back(std::make_shared<RecordingSink>());
      keys.push_back(*Open(r, sinks_.back()));
    }
    service_->OnRequests(keys[0], Allreduce(0, "lonely"));
  }
  // One second on: both ranks beat, the coordinator inspects.
  void Tick() {
    now_ += absl::Seconds(1);
    EXPECT_TRUE(Beat(0).ok());
    EXPECT_TRUE(Beat(1).ok());
    service_->Inspect();
  }
  // Rank 1 was told the job aborted on the 2 s stall of 'lonely', and nothing else.
  void ExpectStallAbortOnRank1() {
    ASSERT_EQ(sinks_[1]->sent.size(), 1u);
    EXPECT_EQ(sinks_[1]->sent[0].abort_code(),
              static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    EXPECT_EQ(sinks_[1]->sent[0].abort_message(),
              "stalled: tensor 'lonely' was submitted by rank 0 but not by rank 1 for 2s "
              "(BRAID_STALL_SHUTDOWN_S=2)");
  }

  std::vector<std::shared_ptr<RecordingSink>> sinks_;
};

TEST_F(StallTest, StallIsReportedThenAbortsAfterTheStallShutdown) {
  StartStalledJob(/*check_ms=*/1000, /*shutdown_ms=*/2000);
  Tick();
  proto::StatusResponse s = Status();
  ASSERT_EQ(s.pending_size(), 1);
  EXPECT_TRUE(s.pending(0).stalled());
  EXPECT_EQ(s.pending(0).missing_ranks(0), 1);
  EXPECT_TRUE(sinks_[1]->sent.empty());
  Tick();
  ExpectStallAbortOnRank1();
}

// A stall shutdown shorter than the stall check aborts at its own time (the check, 60 s by
// default, only decides when the stall is logged).
TEST_F(StallTest, AStallShutdownShorterThanTheCheckAbortsAtItsOwnTime) {
  StartStalledJob(/*check_ms=*/60000, /*shutdown_ms=*/2000);
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(sinks_[1]->sent.empty()) << "aborted after " << s << "s";
    Tick();
  }
  ExpectStallAbortOnRank1();
}

// ---- Process sets in the status (Note [Process sets] in control/process_sets.h) ----

// `rank`'s k-th change of the sets: add `ranks` (remove set `target` when `ranks` is empty),
// named as the runtime names it.
proto::RequestList SetChange(int rank, int k, const std::vector<int>& ranks, int32_t target = 0) {
  proto::RequestList l;
  l.set_rank(rank);
  proto::Request* r = l.add_requests();
  r->set_name("process_set.change." + std::to_string(k));
  r->set_collective(ranks.empty() ? proto::PROCESS_SET_REMOVE : proto::PROCESS_SET_ADD);
  for (int m : ranks) r->add_process_set_ranks(m);
  r->set_target_process_set_id(target);
  return l;
}

// An all-reduce of set `set`'s tensor `name`, under its qualified name.
proto::RequestList SetAllreduce(int rank, int32_t set, const std::string& name) {
  proto::RequestList l = Allreduce(rank, "ps" + std::to_string(set) + "/" + name);
  l.mutable_requests(0)->set_process_set_id(set);
  return l;
}

// Every set but the world's, by id, with its ranks, the responses negotiated in it and its
// tensors pending; the world's tensors count in no set, and a removed set leaves the list.
TEST_F(ServiceTest, StatusListsEverySetButTheWorldsWithItsCounts) {
  const int n = 3;
  std::vector<StreamKey> keys;
  auto sinks = StartJob(n, &keys);
  EXPECT_EQ(Status().process_sets_size(), 0);
  for (int r = 0; r < n; ++r) service_->OnRequests(keys[r], SetChange(r, 0, {0, 1}));
  for (int r = 0; r < n; ++r) service_->OnRequests(keys[r], SetChange(r, 1, {1, 2}));
  ASSERT_EQ(sinks[2]->sent.size(), 2u);
  EXPECT_EQ(sinks[2]->sent[0].responses(0).target_process_set_id(), 1);
  EXPECT_EQ(sinks[2]->sent[1].responses(0).target_process_set_id(), 2);
  // Set 1 negotiates 'a' twice (two steps) and 'b' once; 'late' waits for rank 1. Set 2's
  // 'c' waits for rank 2. The world negotiates 'w' and waits for rank 2's 'v'.
  for (int step = 0; step < 2; ++step) {
    for (int r : {0, 1}) service_->OnRequests(keys[r], SetAllreduce(r, 1, "a"));
  }
  for (int r : {0, 1}) service_->OnRequests(keys[r], SetAllreduce(r, 1, "b"));
  service_->OnRequests(keys[0], SetAllreduce(0, 1, "late"));
  service_->OnRequests(keys[1], SetAllreduce(1, 2, "c"));
  for (int r = 0; r < n; ++r) service_->OnRequests(keys[r], Allreduce(r, "w"));
  service_->OnRequests(keys[0], Allreduce(0, "v"));
  service_->OnRequests(keys[1], Allreduce(1, "v"));

  proto::StatusResponse s = Status();
  EXPECT_EQ(s.tensors_pending(), 3);
  ASSERT_EQ(s.process_sets_size(), 2) << s.DebugString();
  EXPECT_EQ(s.process_sets(0).id(), 1);
  EXPECT_EQ(std::vector<int>(s.process_sets(0).ranks().begin(), s.process_sets(0).ranks().end()),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(s.process_sets(0).tensors_negotiated(), 3);
  EXPECT_EQ(s.process_sets(0).tensors_pending(), 1);
  EXPECT_EQ(s.process_sets(1).id(), 2);
  EXPECT_EQ(std::vector<int>(s.process_sets(1).ranks().begin(), s.process_sets(1).ranks().end()),
            (std::vector<int>{1, 2}));
  EXPECT_EQ(s.process_sets(1).tensors_negotiated(), 0);
  EXPECT_EQ(s.process_sets(1).tensors_pending(), 1);
  // The ranks' fast path reports its steps per set with their heartbeats: the largest report
  // adds to the coordinator's count (every rank counts the same agreed work).
  for (int r : {0, 1}) {
    proto::HeartbeatRequest hb;
    hb.set_rank(r);
    hb.set_fast_path_buckets(10 + r);
    (*hb.mutable_fast_path_sets())[1] = 10 + r;
    ASSERT_TRUE(service_->Heartbeat(Job(r), hb).ok());
  }
  s = Status();
  EXPECT_EQ(s.process_sets(0).tensors_negotiated(), 3 + 11);
  EXPECT_EQ(s.process_sets(1).tensors_negotiated(), 0);
  // braidctl lists a set's pending tensor under its qualified name.
  std::vector<std::string> pending;
  for (const auto& p : s.pending()) pending.push_back(p.name());
  EXPECT_EQ(pending, (std::vector<std::string>{"ps1/late", "ps2/c", "v"}));

  // Removing set 2 (its 'c' fails) leaves set 1 alone in the list, its counts unchanged.
  for (int r = 0; r < n; ++r) service_->OnRequests(keys[r], SetChange(r, 2, {}, 2));
  s = Status();
  EXPECT_EQ(s.tensors_pending(), 2);
  ASSERT_EQ(s.process_sets_size(), 1) << s.DebugString();
  EXPECT_EQ(s.process_sets(0).id(), 1);
  EXPECT_EQ(s.process_sets(0).tensors_negotiated(), 3 + 11);
  EXPECT_EQ(s.process_sets(0).tensors_pending(), 1);
}

// ---- Compression per group (Note [Compression groups]) ----

proto::RequestList PlanAllreduce(int rank, const std::string& name, const std::string& spec,
                                 const std::string& pattern) {
  proto::RequestList l = Allreduce(rank, name);
  l.mutable_requests(0)->set_compression(spec);
  l.mutable_requests(0)->set_compression_pattern(pattern);
  return l;
}

proto::MethodBytes* Reported(google::protobuf::RepeatedPtrField<proto::MethodBytes>* to,
                             const std::string& method, const std::string& pattern,
                             int64_t reductions) {
  proto::MethodBytes* m = to->Add();
  m->set_method(method);
  m->set_pattern(pattern);
  m->set_reductions(reductions);
  m->set_uncompressed_bytes(16 * reductions);
  m->set_payload_bytes(method == "none" ? 16 * reductions : 8 * reductions);
  return m;
}

std::map<std::pair<std::string, std::string>, proto::CompressionStat> Rows(
    const proto::StatusResponse& s) {
  std::map<std::pair<std::string, std::string>, proto::CompressionStat> out;
  for (const proto::CompressionStat& c : s.compression()) out[{c.method(), c.pattern()}] = c;
  return out;
}

// The status counts tensors and bytes per method and plan pattern: negotiated (the first
// rank's pattern), agreed on the fast path, and reported by the ranks (summed over them), one
// row per group sorted by method then pattern; a rank that predates the groups reports per
// method, under no pattern.
TEST_F(ServiceTest, StatusCountsCompressionPerMethodAndPlanPattern) {
  std::vector<StreamKey> keys;
  StartJob(2, &keys);
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < 2; ++r) {
      service_->OnRequests(keys[r], PlanAllreduce(r, "emb.w", "fp16", "emb.*"));
      service_->OnRequests(keys[r], PlanAllreduce(r, "fc.w", "fp16", "*"));
      service_->OnRequests(keys[r], PlanAllreduce(r, "fc.b", "none", "*.bias"));
      service_->OnRequests(keys[r], PlanAllreduce(r, "loss", "none", ""));
    }
  }
  for (int r = 0; r < 2; ++r) {
    proto::HeartbeatRequest hb;
    hb.set_rank(r);
    Reported(hb.mutable_compression(), "fp16", "", 4);  // per method, for old coordinators
    Reported(hb.mutable_compression(), "none", "", 4);
    Reported(hb.mutable_compression_groups(), "fp16", "*", 2);
    Reported(hb.mutable_compression_groups(), "fp16", "emb.*", 2);
    Reported(hb.mutable_compression_groups(), "none", "", 2);
    Reported(hb.mutable_compression_groups(), "none", "*.bias", 2);
    // The fast path agreed 3 more steps of fc.w (the largest report counts).
    hb.set_fast_path_buckets(3);
    proto::MethodNegotiated* f = hb.add_fast_path_groups();
    f->set_method("fp16");
    f->set_pattern("*");
    f->set_tensors(1 + 2 * r);
    f->set_bytes(16 * (1 + 2 * r));
    ASSERT_TRUE(service_->Heartbeat(Job(r), hb).ok());
  }
  proto::StatusResponse s = Status();
  std::vector<std::pair<std::string, std::string>> order;
  for (const auto& c : s.compression()) order.emplace_back(c.method(), c.pattern());
  EXPECT_EQ(order, (std::vector<std::pair<std::string, std::string>>{
                       {"fp16", "*"}, {"fp16", "emb.*"}, {"none", ""}, {"none", "*.bias"}}));
  auto rows = Rows(s);
  auto at = [&rows](const char* method, const char* pattern) -> proto::CompressionStat& {
    return rows[{method, pattern}];
  };
  EXPECT_EQ(at("fp16", "*").tensors(), 2 + 3);
  EXPECT_EQ(at("fp16", "*").bytes_before(), (2 + 3) * 16);
  EXPECT_EQ(at("fp16", "emb.*").tensors(), 2);
  EXPECT_EQ(at("none", "*.bias").tensors(), 2);
  EXPECT_EQ(at("none", "").tensors(), 2);
  for (const auto& [group, c] : rows) {
    SCOPED_TRACE(group.first + " " + group.second);
    EXPECT_EQ(c.ranks_reporting(), 2);
    EXPECT_EQ(c.reductions(), 2 * 2);
    EXPECT_EQ(c.uncompressed_bytes(), 2 * 2 * 16);
    EXPECT_EQ(c.ratio(), group.first == "none" ? 1.0 : 2.0);
  }
  // A rank that predates the groups: its per-method counts land under no pattern.
  proto::HeartbeatRequest old;
  old.set_rank(1);
  old.set_fast_path_buckets(3);  // the same buckets, reported per method only (none here)
  Reported(old.mutable_compression(), "fp16", "", 9);  // more reductions: the newer report
  ASSERT_TRUE(service_->Heartbeat(Job(1), old).ok());
  rows = Rows(Status());
  EXPECT_EQ(at("fp16", "").reductions(), 9);
  EXPECT_EQ(at("fp16", "").ranks_reporting(), 1);
  EXPECT_EQ(at("fp16", "*").ranks_reporting(), 1);
  EXPECT_EQ(at("fp16", "*").tensors(), 2 + 1) << "rank 0's fast path is left";
}

// Note [Compression groups]: a plan of many patterns leaves the status bounded: 64 groups of
// their own, the rest of each method in one "(other patterns)" row, the totals exact.
TEST_F(ServiceTest, StatusFoldsThePatternsBeyondTheBound) {
  std::vector<StreamKey> keys;
  StartJob(2, &keys);
  for (int i = 0; i < 100; ++i) {
    for (int r = 0; r < 2; ++r) {
      service_->OnRequests(keys[r], PlanAllreduce(r, absl::StrCat("t", i), "fp16",
                                                  absl::StrCat("t", i, "*")));
    }
  }
  for (int r = 0; r < 2; ++r) service_->OnRequests(keys[r], Allreduce(r, "loss"));
  proto::HeartbeatRequest hb;  // one rank reports 100 groups: folded the same way
  hb.set_rank(0);
  for (int i = 0; i < 100; ++i) {
    Reported(hb.mutable_compression_groups(), "fp16", absl::StrCat("t", i, "*"), 1);
  }
  ASSERT_TRUE(service_->Heartbeat(Job(0), hb).ok());
  const proto::StatusResponse s = Status();
  ASSERT_EQ(s.compression_size(), 64 + 2) << "64 groups, fp16's other patterns, none's";
  auto rows = Rows(s);
  auto at = [&rows](const char* method, const char* pattern) -> proto::CompressionStat& {
    return rows[{method, pattern}];
  };
  const proto::CompressionStat& other = at("fp16", "(other patterns)");
  EXPECT_EQ(other.tensors(), 100 - 64);
  EXPECT_EQ(other.reductions(), 100 - 64);
  EXPECT_EQ(other.ranks_reporting(), 1) << "one rank, however many of its groups folded";
  int64_t tensors = 0, reductions = 0;
  for (const auto& c : s.compression()) {
    if (c.method() != "fp16") continue;
    tensors += c.tensors();
    reductions += c.reductions();
  }
  EXPECT_EQ(tensors, 100);
  EXPECT_EQ(reductions, 100);
  EXPECT_EQ(at("none", "").tensors(), 1);
}

// `auto` tensors count at the coordinator under the spec `auto` and their pattern, while the
// ranks book their bytes under the chosen method and "<pattern> (auto)": rows the ranks do
// not have. With 34 `auto` patterns and 30 others (64 byte rows per rank, within the bound),
// every byte row keeps its name, and only `auto`'s tensor counts fold.
TEST_F(ServiceTest, StatusKeepsTheRanksByteRowsBeforeAutosTensorCounts) {
  // The group a rank books tensor `i`'s bytes in.
  auto byte_pattern = [](int i) { return absl::StrCat("t", i, i < 34 ? "* (auto)" : "*"); };
  std::vector<StreamKey> keys;
  StartJob(2, &keys);
  for (int i = 0; i < 64; ++i) {
    for (int r = 0; r < 2; ++r) {
      service_->OnRequests(keys[r], PlanAllreduce(r, absl::StrCat("t", i),
                                                  i < 34 ? "auto" : "fp16",
                                                  absl::StrCat("t", i, "*")));
    }
  }
  for (int r = 0; r < 2; ++r) {
    proto::HeartbeatRequest hb;
    hb.set_rank(r);
    for (int i = 0; i < 64; ++i) {
      Reported(hb.mutable_compression_groups(), "fp16", byte_pattern(i), 1);
    }
    ASSERT_TRUE(service_->Heartbeat(Job(r), hb).ok());
  }
  auto rows = Rows(Status());
  auto at = [&rows](const std::string& method, const std::string& pattern) {
    return rows.find(std::make_pair(method, pattern));
  };
  for (int i = 0; i < 64; ++i) {
    const std::string pattern = byte_pattern(i);
    auto row = at("fp16", pattern);
    ASSERT_NE(row, rows.end()) << pattern;
    EXPECT_EQ(row->second.reductions(), 2) << pattern;
    EXPECT_EQ(row->second.ranks_reporting(), 2) << pattern;
    if (i >= 34) EXPECT_EQ(row->second.tensors(), 1) << pattern;
  }
  int64_t auto_tensors = 0;
  for (const auto& [group, c] : rows) {
    if (group.first == "auto") auto_tensors += c.tensors();
  }
  EXPECT_EQ(auto_tensors, 34) << "folded, but counted";
  ASSERT_NE(at("auto", "(other patterns)"), rows.end());
  EXPECT_EQ(at("auto", "(other patterns)")->second.tensors(), 34);
}

// ---- One job at a time (Note [One job at a time]) ----

TEST_F(ServiceTest, TheNextJobStartsFromZeroAndTheEndedOneStaysReadable) {
  std::vector<StreamKey> keys;
  StartJob(2, &keys);
  for (int r = 0; r < 2; ++r) service_->OnRequests(keys[r], Allreduce(r, "a"));
  for (int r = 0; r < 2; ++r) service_->OnRequests(keys[r], Allreduce(r, "b"));
  for (const StreamKey& k : keys) Goodbye(k);
  proto::StatusResponse first = Status();
  EXPECT_EQ(first.phase(), proto::JOB_ENDED);
  EXPECT_EQ(first.tensors_negotiated(), 2);

  Register(Reg(0, 3));  // the next job's first rank, with another world size
  proto::StatusResponse second = Status();
  EXPECT_EQ(second.job_id(), 2);
  EXPECT_EQ(second.phase(), proto::JOB_FORMING);
  EXPECT_EQ(second.size(), 3);
  EXPECT_EQ(second.register_rpcs(), 1);
  EXPECT_EQ(second.tensors_negotiated(), 0);
  EXPECT_EQ(second.cycles(), 0);
  // Its one registered rank only, none of the ended job's two.
  ASSERT_EQ(second.ranks_size(), 1);
  EXPECT_EQ(second.ranks(0).state(), "registered");
  // The ended job by its id, unchanged; a stale stream of it touches nothing.
  EXPECT_EQ(Status(1).SerializeAsString().size(), first.SerializeAsString().size());
  EXPECT_EQ(Status(1).tensors_negotiated(), 2);
  service_->OnRequests(keys[0], Allreduce(0, "stale"));
  EXPECT_EQ(Status().cycles(), 0);
  std::optional<absl::StatusOr<proto::StatusResponse>> old;
  proto::StatusRequest req;
  req.set_job_id(7);
  service_->Status(service_->NewCallId(), Job(), req, [&](auto r) { old = std::move(r); });
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ServiceTest, ARegistrationDuringAJobWaitsForItsEnd) {
  std::vector<StreamKey> keys;
  StartJob(2, &keys);
  results_.clear();
  int64_t early = Register(Reg(0, 2));  // rank 0 re-inits before rank 1 has left
  EXPECT_TRUE(results_.empty());
  EXPECT_EQ(Status().job_id(), 1);
  Goodbye(keys[0]);
  Goodbye(keys[1]);  // job 1 ends: job 2 starts with the waiting registration
  proto::StatusResponse s = Status();
  EXPECT_EQ(s.job_id(), 2);
  EXPECT_EQ(s.register_rpcs(), 1);
  int64_t late = Register(Reg(1, 2));
  ASSERT_TRUE(results_.at(early).ok());
  ASSERT_TRUE(results_.at(late).ok());
  EXPECT_EQ(Status().phase(), proto::JOB_RUNNING);
  // A registration that waits longer than the register timeout for a job to end fails.
  int64_t third = Register(Reg(0, 2));
  now_ += absl::Seconds(30);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(Beat(r).ok());
  service_->Inspect();
  EXPECT_EQ(results_.at(third).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(results_.at(third).status().message(),
            "a job is already running on this coordinator: job 2 did not end within 30s");
}

TEST_F(ServiceTest, AStatusWaitIsAnsweredWhenTheJobEnds) {
  std::vector<StreamKey> keys;
  StartJob(2, &keys);
  std::optional<absl::StatusOr<proto::StatusResponse>> got;
  proto::StatusRequest req;
  req.set_wait_for_end_ms(60000);
  service_->Status(service_->NewCallId(), Job(), req, [&](auto r) { got = std::move(r); });
  EXPECT_FALSE(got.has_value());
  Goodbye(keys[0]);
  EXPECT_FALSE(got.has_value());
  Goodbye(keys[1]);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok());
  EXPECT_EQ((*got)->phase(), proto::JOB_ENDED);
  EXPECT_EQ((*got)->job_id(), 1);
  // A wait that times out is answered with the job as it is.
  Register(Reg(0, 2));
  got.reset();
  req.set_wait_for_end_ms(1000);
  service_->Status(service_->NewCallId(), Job(), req, [&](auto r) { got = std::move(r); });
  now_ += absl::Seconds(1);
  service_->Inspect();
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_EQ((*got)->phase(), proto::JOB_FORMING);
}

// ---- Key-value store, shutdown ----

TEST_F(ServiceTest, KeyValueGetWaitsForItsKeyAndEveryCallIsCounted) {
  std::optional<absl::StatusOr<proto::KeyValueGetResponse>> got;
  proto::KeyValueGetRequest get;
  get.set_key("k");
  get.set_timeout_ms(5000);
  service_->KeyValueGet(service_->NewCallId(), Job(), get, [&](auto r) { got = r; });
  EXPECT_FALSE(got.has_value());
  proto::KeyValueSetRequest set;
  set.set_key("k");
  set.set_value("v");
  EXPECT_TRUE(service_->KeyValueSet(Job(), set).ok());
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_TRUE((*got)->found());
  EXPECT_EQ((*got)->value(), "v");
  got.reset();
  get.set_key("missing");
  service_->KeyValueGet(service_->NewCallId(), Job(), get, [&](auto r) { got = r; });
  now_ += absl::Seconds(5);
  service_->Inspect();
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_FALSE((*got)->found());
  EXPECT_EQ(Status().kv_rpcs(), 3);
}

TEST_F(ServiceTest, ShutdownEndsEveryStreamAndAnswersEveryWaitingCall) {
  std::vector<StreamKey> keys;
  auto sinks = StartJob(2, &keys);
  int64_t waiting = Register(Reg(0, 2));
  proto::ShutdownRequest req;
  EXPECT_TRUE(service_->RequestShutdown(Job(), req).ok());
  EXPECT_TRUE(service_->shutdown_requested());
  service_->BeginShutdown();
  for (const auto& sink : sinks) {
    ASSERT_FALSE(sink->sent.empty());
    EXPECT_TRUE(sink->sent.back().shutdown());
    EXPECT_TRUE(sink->closed);
  }
  EXPECT_EQ(results_.at(waiting).status().code(), absl::StatusCode::kUnavailable);
  int64_t after = Register(Reg(0, 2));
  EXPECT_EQ(results_.at(after).status().message(), "the coordinator is shutting down");
}

// ---- The monitor ----

TEST(MonitorTest, InspectsEveryPeriodUntilDestroyed) {
  absl::Mutex mu;
  int calls = 0;
  const absl::Time start = absl::Now();
  auto monitor = std::make_unique<Monitor>(absl::Milliseconds(20), [&] {
    absl::MutexLock lock(&mu);
    ++calls;
  });
  EXPECT_EQ(monitor->period(), absl::Milliseconds(20));
  {
    absl::MutexLock lock(&mu);
    auto three = [&]() { return calls >= 3; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&three), absl::Seconds(10)));
  }
  // Three ticks take at least three periods.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(60));
  monitor.reset();
  absl::MutexLock lock(&mu);
  const int at_stop = calls;
  auto more = [&]() { return calls > at_stop; };
  EXPECT_FALSE(mu.AwaitWithTimeout(absl::Condition(&more), absl::Milliseconds(60)));
}

// Note [Elastic membership]: each membership is sized by the provider (braidrun's count of
// running processes) and the survivors of one form the next, renumbered.
class ElasticTest : public ServiceTest {
 protected:
  ElasticTest() {
    ServiceOptions o;
    o.elastic_world_size = [this]() -> absl::StatusOr<int> {
      if (!failed_.empty()) return absl::FailedPreconditionError(failed_);
      return running_;
    };
    o.on_rank_lost = [this](int rank, int worker, const std::string&) {
      lost_.emplace_back(rank, worker);
    };
    o.elastic_admit = [this](int worker) {
      auto it = leaving_.find(worker);
      if (it == leaving_.end()) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(kElasticLeave, ": ", it->second));
    };
    o.elastic_leaving = [this](int worker) { return leaving_.count(worker) > 0; };
    Restart(o);
  }
  // A process that registers without a rank or world size of its own, as braidrun's do.
  static proto::RegisterRequest Worker(int worker) {
    proto::RegisterRequest r = Reg(-1, 0);
    r.set_pid(500 + worker);
    r.set_worker(worker);
    return r;
  }
  int running_ = 3;
  std::string failed_;
  std::vector<std::pair<int, int>> lost_;  // (rank, worker)
  std::map<int, std::string> leaving_;     // worker -> why braidrun drains it
};

TEST_F(ElasticTest, TheSurvivorsOfALostRankFormTheNextMembershipRenumbered) {
  std::vector<int64_t> ids;
  for (int w = 0; w < 3; ++w) ids.push_back(Register(Worker(w)));
  std::map<int, int> rank_of;  // worker -> rank
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(results_.at(ids[w]).ok()) << results_.at(ids[w]).status();
    EXPECT_EQ(results_.at(ids[w])->size(), 3);
    rank_of[w] = results_.at(ids[w])->rank();
  }
  std::vector<StreamKey> keys(3);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int r = 0; r < 3; ++r) {
    sinks.push_back(std::make_shared<RecordingSink>());
    keys[r] = *Open(r, sinks.back());
  }
  const std::string old_token = tokens_.at(0);
  // Worker 1's connection closes: its rank is lost, braidrun is told which process it was,
  // and every survivor's operations fail.
  const int lost_rank = rank_of[1];
  service_->OnStreamEnd(keys[lost_rank]);
  ASSERT_EQ(lost_.size(), 1u);
  EXPECT_EQ(lost_[0], std::make_pair(lost_rank, 1));
  for (int r = 0; r < 3; ++r) {
    if (r == lost_rank) continue;
    ASSERT_FALSE(sinks[r]->sent.empty());
    EXPECT_EQ(sinks[r]->sent.back().abort_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  }
  running_ = 2;
  // The survivors register again while the membership still runs: they wait for its end.
  const int64_t again0 = Register(Worker(0)), again2 = Register(Worker(2));
  EXPECT_EQ(results_.count(again0), 0u);
  for (int r = 0; r < 3; ++r) {
    if (r != lost_rank) Goodbye(keys[r]);
  }
  ASSERT_EQ(results_.count(again0), 1u);
  ASSERT_TRUE(results_.at(again0).ok()) << results_.at(again0).status();
  ASSERT_TRUE(results_.at(again2).ok()) << results_.at(again2).status();
  EXPECT_EQ(results_.at(again0)->size(), 2);
  EXPECT_EQ(results_.at(again2)->size(), 2);
  EXPECT_NE(results_.at(again0)->rank(), results_.at(again2)->rank());
  EXPECT_EQ(Status().job_id(), 2);
  // A token of the ended membership speaks for no rank of this one.
  Caller stale = Job();
  stale.rank_token = old_token;
  proto::HeartbeatRequest hb;
  hb.set_rank(0);
  EXPECT_EQ(service_->Heartbeat(stale, hb).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(ElasticTest, ADrainedProcessCountsAsLeavingAndItsRejoinIsRefused) {
  std::vector<int64_t> ids;
  for (int w = 0; w < 3; ++w) ids.push_back(Register(Worker(w)));
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(results_.at(ids[w]).ok()) << results_.at(ids[w]).status();
  }
  std::vector<StreamKey> keys(3);
  for (int r = 0; r < 3; ++r) keys[r] = *Open(r, std::make_shared<RecordingSink>());
  proto::HeartbeatRequest hb;
  hb.set_rank(0);
  proto::HeartbeatResponse resp;
  ASSERT_TRUE(service_->Heartbeat(Job(0), hb, &resp).ok());
  EXPECT_EQ(resp.ranks_leaving(), 0);
  // braidrun drains worker 1: every rank's heartbeat now says one rank leaves.
  const std::string why = "worker 1's host h2 is no longer in the discovery output";
  leaving_[1] = why;
  running_ = 2;
  for (int r = 0; r < 3; ++r) {
    hb.set_rank(r);
    ASSERT_TRUE(service_->Heartbeat(Job(r), hb, &resp).ok());
    EXPECT_EQ(resp.ranks_leaving(), 1) << "rank " << r;
    EXPECT_EQ(resp.ranks_waiting(), 0);
  }
  // At the commit every rank re-registers: the drained one is refused at once, with the
  // mark braid.torch.elastic recognises; the others form the next membership without it.
  const int64_t again0 = Register(Worker(0)), again1 = Register(Worker(1));
  const int64_t again2 = Register(Worker(2));
  ASSERT_EQ(results_.count(again1), 1u);
  EXPECT_EQ(results_.at(again1).status(),
            absl::FailedPreconditionError(absl::StrCat(kElasticLeave, ": ", why)));
  EXPECT_EQ(results_.count(again0), 0u);  // the membership still runs
  for (int r = 0; r < 3; ++r) Goodbye(keys[r]);
  ASSERT_EQ(results_.count(again0), 1u);
  ASSERT_TRUE(results_.at(again0).ok()) << results_.at(again0).status();
  ASSERT_TRUE(results_.at(again2).ok()) << results_.at(again2).status();
  EXPECT_EQ(results_.at(again0)->size(), 2);
  EXPECT_EQ(results_.at(again2)->size(), 2);
  EXPECT_TRUE(lost_.empty());  // leaving is not being lost
}

TEST_F(ElasticTest, AProcessDrainedWhileItWaitsToRegisterIsRefusedThen) {
  const int64_t a = Register(Worker(0)), b = Register(Worker(1));
  service_->Inspect();
  EXPECT_EQ(results_.count(a), 0u);  // 3 running, 2 registered: it waits
  leaving_[1] = "worker 1's host h2 is no longer in the discovery output";
  running_ = 2;
  service_->Inspect();
  ASSERT_EQ(results_.count(b), 1u);  // refused while it waited: not one of the 2
  EXPECT_EQ(results_.at(b).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(results_.count(a), 0u);
  const int64_t c = Register(Worker(2));
  ASSERT_EQ(results_.count(a), 1u);
  ASSERT_TRUE(results_.at(a).ok()) << results_.at(a).status();
  EXPECT_EQ(results_.at(a)->size(), 2);
  EXPECT_TRUE(results_.at(c).ok());
}

TEST_F(ElasticTest, AProcessThatDiesWhileTheOthersRegisterLowersTheSize) {
  const int64_t a = Register(Worker(0)), b = Register(Worker(1));
  service_->Inspect();
  EXPECT_EQ(results_.count(a), 0u);  // 3 running, 2 registered: it waits
  running_ = 2;                      // worker 2 died before registering
  service_->Inspect();
  ASSERT_EQ(results_.count(a), 1u);
  ASSERT_TRUE(results_.at(a).ok()) << results_.at(a).status();
  EXPECT_EQ(results_.at(a)->size(), 2);
  EXPECT_TRUE(results_.at(b).ok());
}

TEST_F(ElasticTest, TooFewRanksLeftFailsEveryRegistrationWithBraidrunsReason) {
  const int64_t a = Register(Worker(0));
  failed_ = "braidrun: the elastic job fails: 1 rank left, fewer than --min-np 2";
  service_->Inspect();
  ASSERT_EQ(results_.count(a), 1u);
  EXPECT_EQ(results_.at(a).status(), absl::FailedPreconditionError(failed_));
  const int64_t late = Register(Worker(1));
  ASSERT_EQ(results_.count(late), 1u);
  EXPECT_EQ(results_.at(late).status(), absl::FailedPreconditionError(failed_));
}

}  // namespace
}  // namespace braid::coordinator
