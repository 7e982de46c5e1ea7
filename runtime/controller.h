// The negotiation controller: turns the collectives this rank enqueues into the buckets
// every rank agreed on, in the order they agreed, for the executor (executor.h) to run. Two
// producers of the same Bucket (control/bucket.h) live here: the coordinator (first time, a
// change, a mismatch: Note [Cycle], controller.cc) and, under BRAID_FAST_PATH, the ranks'
// own vote over the control channel for tensors whose negotiation the response cache holds
// (Note [Fast path], fast_path.h; controller_fast.cc). It also keeps the table of
// collectives in flight (InFlight), the order a barrier imposes (Note [Barrier order],
// controller_order.cc) and the local failures it reports (Note [Local failures]).
//
// Threads (Note [Threads and locks], runtime_impl.h): the callers' threads (Submit,
// ReportFailure, groups, checks), braid-loop (NextBuckets, CycleDone, and through InFlight
// the executor), braid-coord-rx (OnMessage, OnClosed). One mutex, mu_, guards the state;
// fast_stats_mu_ is a leaf. No lock is held while calling the coordinator client or the
// control channel, with one exception: OnMessage aborts the control channel (thread-safe, it
// never waits on braid-loop) under mu_ when a rank left during a vote.
#ifndef BRAID_RUNTIME_CONTROLLER_H_
#define BRAID_RUNTIME_CONTROLLER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "compression/stage.h"
#include "control/bucket.h"
#include "control/compression_groups.h"
#include "control/coordinator_client.h"
#include "proto/braid.pb.h"
#include "runtime/fast_path.h"
#include "runtime/in_flight.h"
#include "runtime/timeline.h"
#include "transport/communicator.h"

namespace braid {

class NegotiationController : public InFlight {
 public:
  struct Parts {
    int rank = 0;
    int size = 1;
    CoordinatorClient* client = nullptr;
    // The fast path's votes go over it (an all-gather of a few words per rank).
    transport::Communicator* control = nullptr;
    // Fails the data plane's collective in flight, and every later one (Executor::Abort).
    std::function<void(const absl::Status&)> abort_data_plane;
    // The job's first data-plane timeout, `s` if none yet (Executor::FirstTimeout).
    std::function<absl::Status(const absl::Status&)> first_timeout;
    std::function<std::shared_ptr<Timeline>()> timeline;  // may return null
    absl::Duration cycle_time = absl::Milliseconds(1);  // BRAID_CYCLE_TIME_MS
    // Note [Fast path]: the job's, from registration.
    bool fast_path = false;
    int64_t fusion_threshold = 0;
    absl::Duration fallback_after = absl::Seconds(1);
    // Note [Process sets]: the ranks of a set, for the fast path's agreement.
    ProcessSetRanks process_set_ranks;
  };
  // Checks a request and resolves its compression (runtime_impl.h: Enqueue), under mu_.
  using Validate = std::function<absl::StatusOr<Accepted>(const CollectiveRequest&)>;

  NegotiationController() = default;
  ~NegotiationController() override = default;

  // Starts a job: fresh state, the negotiation stream opened. The parts outlive Stop.
  absl::Status Start(const Parts& parts);
  // A failed Start, or a job that never started: back to not initialized.
  void Reset();
  // Asks braid-loop to stop after its cycle; true when it is running buckets (the caller
  // then aborts the data plane, so a collective blocked on peers wakes).
  bool RequestStop();
  // After braid-loop stopped: every collective still in flight fails (Cancelled) and the
  // job is over (FailedPrecondition for calls until the next Start).
  void EndJob();

  // ---- the callers' threads ----
  bool running() const;
  // OK while a job runs; FailedPrecondition before Start and after Finish.
  absl::Status CheckRunning() const;
  // Takes a collective (validated under the lock, so no job ends meanwhile); its handle.
  absl::StatusOr<std::shared_ptr<Handle>> Submit(CollectiveRequest req, const Validate& validate);
  absl::Status ReportFailure(const std::string& name, const absl::Status& cause);
  // Fails every collective of process set `id` in flight on this rank with `s` (the set was
  // removed: Note [Process sets]).
  void FailProcessSet(int32_t id, const absl::Status& s);
  void BeginGroup();
  absl::Status EndGroup();
  // FailedPrecondition naming the first in-flight tensor `in_flight` accepts.
  absl::Status CheckNoneInFlight(const std::function<bool(const TensorEntry&)>& in_flight,
                                 const std::function<std::string(const std::string&)>& why)
      const;
  // What this rank ran through the fast path, for its heartbeats.
  void AddFastPathTotals(proto::HeartbeatRequest* hb) const;

  // ---- Note [Settings changes] (runtime/step_settings.h), braid-loop ----
  // A change's cycle time (zero: keep this rank's own) and fast-path fusion threshold, for
  // the cycles from now on.
  void Retune(absl::Duration cycle_time, int64_t fusion_threshold);
  // Sends the coordinator a step's sample (BRAID_AUTOTUNE), at once.
  void SendSample(const proto::TuningSample& sample);
  // Bytes of `name`'s tensor on this rank when it is an all-reduce in flight, else 0.
  int64_t AllReduceBytes(const std::string& name);

  // ---- braid-loop ----
  // One cycle: waits for work, sends requests, and fills `buckets` with what the ranks
  // agreed, in order; false when the loop must stop.
  bool NextBuckets(std::deque<Bucket>* buckets);
  // The cycle's buckets ran.
  void CycleDone();

  // ---- InFlight (the executor, on braid-loop) ----
  TensorEntry* Find(const std::string& name) override;
  void Finish(const std::vector<std::string>& names, const absl::Status& s) override;
  void Abort(const absl::Status& s) override;

 private:
  enum class State { kUninitialized, kRunning, kShutDown };
  struct PendingFailure {
    uint64_t seq = 0;  // taken from the same counter as TensorEntry::seq
    proto::FailureReport report;
  };
  // What the next list may carry (Note [Barrier order]).
  struct Sendable {
    bool failures = false;
    bool requests = false;
    bool any() const { return failures || requests; }
  };

  absl::Status CheckRunningLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Queues a FailureReport of `name` for the next cycle (Note [Local failures]).
  void ReportFailureLocked(const std::string& name, const absl::Status& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailEverythingLocked(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- controller.cc: the coordinator's cycle ----
  // Waits for work (Note [Cycle]); false when the loop must stop. Fills the requests to send
  // and the buckets to run.
  bool NextCycle(proto::RequestList* out, std::deque<Bucket>* todo);
  void OnMessage(const proto::ResponseList& msg);
  // Under the fast path: holds `msg` for a round every rank agrees on; true when it did.
  bool HoldForVoteLocked(const proto::ResponseList& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The timeline's view of it.
  void MarkNegotiated(const proto::ResponseList& msg, Timeline& timeline);
  void OnClosed(const absl::Status& s);
  void Send(const proto::RequestList& list);

  // ---- controller_order.cc (Note [Barrier order]) ----
  Sendable SendableLocked(bool fast) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void TakeSendableLocked(bool fast, std::vector<proto::FailureReport>* failures,
                          std::vector<proto::Request>* requests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BarrierInFlightLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t FirstBarrierLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t SeqOfLocked(const proto::Request& r) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool FastHeldBeforeLocked(uint64_t seq) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // ---- controller_fast.cc (Note [Fast path]) ----
  // One round of the fast path; false when the loop must stop.
  bool FastCycle(std::deque<Bucket>* buckets);
  // FastCycle's first part, under mu_: waits for work or the round's time, then fills this
  // rank's vote, the requests for the coordinator and the errors to report. A value when no
  // vote follows (what FastCycle returns), nullopt when it does.
  std::optional<bool> BeginFastRound(proto::RequestList* out, Vote* vote,
                                     std::deque<Bucket>* replies);
  // The vote itself, over the control channel.
  absl::Status GatherVotes(const Vote& vote, std::vector<uint64_t>* gathered);
  // FastCycle's last part: applies the gathered votes (or handles the vote's failure: a peer
  // that left, else an abort). True when the round agreed on or changed something.
  bool FinishFastRound(const absl::Status& gathered_status,
                       const std::vector<uint64_t>& gathered, proto::RequestList* resend,
                       std::deque<Bucket>* buckets);
  void RouteAndVoteLocked(absl::Time now, proto::RequestList* out, Vote* vote)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillVoteLocked(absl::Time now, Vote* vote) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the round agreed: cached buckets, invalidations, then the coordinator's messages
  // every rank received. Fills `resend` with requests that leave the fast path.
  void ApplyAgreement(const Agreement& a, proto::RequestList* resend,
                      std::deque<Bucket>* buckets);
  Bucket FastBucket(const std::vector<int32_t>& ids);
  void ApplyCoordinatorMessage(const proto::ResponseList& msg, proto::RequestList* resend,
                               std::deque<Bucket>* buckets);
  // A tensor whose cache slot went: its full request goes to the coordinator after all.
  void LeaveFastPath(const std::string& name, proto::RequestList* resend);
  void CountFastBucket(const std::vector<int32_t>& ids);
  void StopFastPathLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseRepliesLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Parts parts_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kUninitialized;
  absl::node_hash_map<std::string, TensorEntry> table_ ABSL_GUARDED_BY(mu_);  // in flight
  std::vector<proto::Request> outgoing_ ABSL_GUARDED_BY(mu_);
  // Local failures to report (Note [Local failures]); they go out at once, unless a barrier
  // before them is still waiting (Note [Barrier order]).
  std::vector<PendingFailure> failures_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;  // TensorEntry::seq, PendingFailure::seq
  int barriers_outgoing_ ABSL_GUARDED_BY(mu_) = 0;  // barriers in outgoing_
  // The barrier sent last (name, seq): in flight while its entry is in table_.
  std::pair<std::string, uint64_t> barrier_sent_ ABSL_GUARDED_BY(mu_);
  // The highest ResponseList.sequence applied (its responses queued, its evictions done):
  // sent with every RequestList so the coordinator can forget retired cache entries.
  int64_t applied_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Bucket> ready_ ABSL_GUARDED_BY(mu_);  // agreed, not yet handed to the executor
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool executing_ ABSL_GUARDED_BY(mu_) = false;  // the executor is running this cycle's
  int64_t negotiating_ ABSL_GUARDED_BY(mu_) = 0;  // requests sent, not yet answered
  int group_depth_ ABSL_GUARDED_BY(mu_) = 0;  // open BeginGroup()s: outgoing_ is held
  // This rank's mirror of the coordinator's response cache: name -> (id, request bytes).
  std::map<std::string, std::pair<int32_t, std::string>> cache_ ABSL_GUARDED_BY(mu_);
  absl::Time last_send_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // Note [Fast path]. The cache, the count of applied messages and the pending
  // invalidations are braid-loop's alone.
  FastPathCache fast_cache_;
  uint64_t applied_ = 0;  // written by braid-loop under mu_ (others read it under mu_)
  std::vector<int32_t> invalidate_next_;
  int64_t next_fast_bucket_id_ = -1;  // negative: agreed by the ranks (timeline only)
  bool voted_ = false;       // this cycle held a vote
  bool progressed_ = false;  // and it agreed on or changed something
  std::deque<proto::ResponseList> received_ ABSL_GUARDED_BY(mu_);  // not yet applied
  // Errors for this rank alone, each with the count of common lists received before it: it
  // runs once those are applied, so a rank never acts on an error before a flush the
  // coordinator sent ahead of it (Note [Resynchronization] in coordinator/negotiation.h).
  std::deque<std::pair<uint64_t, Bucket>> held_replies_ ABSL_GUARDED_BY(mu_);
  uint64_t received_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool fast_active_ ABSL_GUARDED_BY(mu_) = false;  // parts_.fast_path, as OnMessage reads it
  absl::Status peer_left_ ABSL_GUARDED_BY(mu_);    // a rank shut down: rounds are over
  bool voting_ ABSL_GUARDED_BY(mu_) = false;       // braid-loop is in a vote's all-gather
  absl::Time last_round_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool round_progressed_ ABSL_GUARDED_BY(mu_) = false;  // the last round ran something
  int idle_rounds_ ABSL_GUARDED_BY(mu_) = 0;  // rounds in a row with nothing to run
  mutable absl::Mutex fast_stats_mu_;  // a leaf
  std::map<std::string, std::pair<int64_t, int64_t>> fast_by_method_
      ABSL_GUARDED_BY(fast_stats_mu_);  // method -> (tensors, bytes)
  // The same per method and plan pattern (Note [Compression groups]), all-reduces only.
  control::CompressionGroups<std::pair<int64_t, int64_t>> fast_by_group_
      ABSL_GUARDED_BY(fast_stats_mu_);
  int64_t fast_buckets_ ABSL_GUARDED_BY(fast_stats_mu_) = 0;
  std::map<int32_t, int64_t> fast_by_set_ ABSL_GUARDED_BY(fast_stats_mu_);  // process set -> tensors
};

}  // namespace braid

#endif  // BRAID_RUNTIME_CONTROLLER_H_
