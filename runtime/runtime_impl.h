// Internal: the state behind braid::Runtime (runtime.h), its members split by responsibility:
//   lifecycle.cc          Init (the injected parts, registration, the coordinator this rank may
//                         host), Shutdown, the public facade
//   checkpoint.cc         the compression state: saved, restored (collectively), forgotten
//   enqueue.cc            validating a request, resolving its compression, the tensor table
//   loop.cc               the background loop: requests out, agreed buckets in, the response
//                         cache, aborts
//   execute.cc            one agreed bucket: collectives other than all-reduce, handles
//   allreduce_pipeline.h  an all-reduce bucket: pack -> Compressor::Reduce -> unpack
//
// Note [Threads and locks]
// A rank runs, besides the caller's threads, three threads of braid's own
// (docs/architecture.md draws them) and the pools of the libraries under it (gRPC's,
// sized by the host's cores; UCX's async thread):
//   braid-loop       the background thread (Loop). The only one that touches the data plane,
//                    the fusion buffer and the compressors. Sends requests, runs agreed
//                    buckets in the order every rank receives them, completes handles.
//   braid-coord-rx   the coordinator client's reader. Turns each ResponseList into Buckets
//                    on the ready queue (OnMessage) and the stream's end into an abort
//                    (OnClosed).
//   braid-heartbeat  the coordinator client's heartbeat. Reads the statistics ledger.
// Hand-offs of one collective: the caller's Enqueue puts its Entry in table_ and its request
// on outgoing_ (under mu_) -> braid-loop sends it -> the coordinator agrees -> braid-coord-rx
// queues the Bucket on ready_ (under mu_) -> braid-loop runs it and completes the Handle ->
// the caller's Wait returns. Entries stay put in table_ until braid-loop erases
// them, so it reads them without mu_ while running their bucket (a node_hash_map: its entries
// never move; a hash map, so an enqueue costs O(1) however many handles are in flight).
// Under the fast path (Note [Fast path], fast_path.h), a cached tensor takes one hand-off:
// Enqueue -> braid-loop votes and runs it (fast_loop.cc); coordinator messages wait in
// received_ for a round.
//
// Lock order (a thread holding one may take those to its right, never the reverse):
//   lifecycle_mu_ -> mu_ -> { Handle::mu_, Timeline's, stage's methods_mu_ (Resolve) }
//   stage's state_mu_ (held by braid-loop for a bucket; SaveState, Summarize, ApplyState)
//     -> methods_mu_
//   StatisticsLedger's mutex, timeline_mu_ and fast_stats_mu_: leaves.
// No runtime lock is held while calling the coordinator client (Send, Close) or the
// communicator (collectives, Abort): those have locks of their own and may block. One
// exception: OnMessage calls the communicator's Abort (thread-safe, it never waits on
// braid-loop) under mu_ when a rank left during a vote (Note [Fast path]).
#ifndef BRAID_RUNTIME_RUNTIME_IMPL_H_
#define BRAID_RUNTIME_RUNTIME_IMPL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "compression/stage.h"
#include "control/bucket.h"
#include "proto/braid.pb.h"
#include "runtime/allreduce_pipeline.h"
#include "runtime/fast_path.h"
#include "runtime/deps.h"
#include "runtime/job_identity.h"
#include "runtime/runtime.h"
#include "runtime/statistics.h"
#include "runtime/timeline.h"

namespace braid {

namespace coordinator {
class CoordinatorServer;
}

class Runtime::Impl {
 public:
  Impl();
  ~Impl();  // shuts down if still running

  absl::Status Init(const RuntimeConfig& config, RuntimeDeps deps);
  void CancelInit();
  absl::Status Shutdown();
  bool initialized() const;
  absl::StatusOr<int> Get(int Impl::*field) const;
  absl::StatusOr<std::shared_ptr<Handle>> Enqueue(CollectiveRequest req);
  absl::Status ReportFailure(const std::string& name, const absl::Status& cause);
  void BeginGroup();
  absl::Status EndGroup();
  absl::StatusOr<transport::TransportStats> transport_stats() const;
  absl::StatusOr<std::string> transport_description() const;
  absl::StatusOr<CompressionReport> compression_report() const;
  absl::StatusOr<std::string> compression_state() const;
  // `refused`: the caller refused this rank's state (Runtime::RefuseCompressionState).
  absl::Status LoadCompressionState(absl::string_view state, const absl::Status& refused);
  absl::StatusOr<int> ForgetCompressionState(absl::Span<const std::string> names);
  absl::Status StartTimeline(const std::string& path);
  absl::Status StopTimeline();

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;

 private:
  enum class State { kUninitialized, kRunning, kShutDown };
  struct Entry {
    CollectiveRequest req;
    std::shared_ptr<Handle> handle;
    // All-reduce: its compression, resolved once at enqueue (never null); else null.
    const compression::CompressionMethod* method = nullptr;
    std::string request_bytes;  // the proto::Request sent, serialized (response cache key)
    // Note [Fast path]: held for the ranks' vote instead of sent to the coordinator, since.
    bool fast = false;
    absl::Time fast_since;
    uint64_t seq = 0;  // enqueue order on this rank (Note [Barrier order] in loop.cc)
  };
  struct PendingFailure {
    uint64_t seq = 0;  // taken from the same counter as Entry::seq
    proto::FailureReport report;
  };
  // What the next list may carry (Note [Barrier order]).
  struct Sendable {
    bool failures = false;
    bool requests = false;
    bool any() const { return failures || requests; }
  };

  // ---- lifecycle.cc ----
  absl::Status InitLocked(const RuntimeConfig& config, RuntimeDeps deps);
  // The gRPC client of config.coordinator, hosting the coordinator first on rank 0 when it
  // is empty (and making a lone process rank 0 of 1 in `launch`).
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectDefaultCoordinator(
      const RuntimeConfig& config, const JobSecret& secret, LaunchInfo* launch,
      const CoordinatorClientSetup& setup);
  // Opens the timeline of `path` for this rank (rank r > 0 writes PATH.rank<r>) and makes it
  // the one events go to, closing the one before (valid JSON); "" closes it only.
  absl::Status OpenTimeline(const std::string& path);
  // The timeline events go to now, or null: kept alive by the caller while it writes.
  std::shared_ptr<Timeline> timeline() const;
  absl::Status StartLoop();
  void ReleaseParts();  // after a failed Init or at the end of Shutdown

  // ---- enqueue.cc ----
  absl::Status CheckRunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRequest(const CollectiveRequest& r) const;
  // Queues a FailureReport of `name` for the next cycle (Note [Local failures]).
  void ReportFailureLocked(const std::string& name, const absl::Status& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The all-reduce's compression: its own spec, or the job's default where it applies.
  absl::StatusOr<const compression::CompressionMethod*> ResolveCompression(
      const CollectiveRequest& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailedPrecondition when not running or while a compressed all-reduce is in flight.
  absl::Status CheckNoCompressionInFlight(absl::string_view what) const;

  // ---- checkpoint.cc ----
  // Every rank's report (Note [Restoring compression state], compression/state_summary.h),
  // in rank order, by an all-gather every rank runs.
  absl::StatusOr<std::vector<compression::LoadReport>> GatherLoadReports(
      const compression::LoadReport& mine);

  // ---- loop.cc ----
  void Loop();
  // Waits for work (Note [Cycle]); false when the loop must stop. Fills the requests to send
  // and the buckets to run.
  bool NextCycle(proto::RequestList* out, std::deque<Bucket>* todo);
  void FailEverythingLocked(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Note [Barrier order]: whether failure reports and requests may go out now (under the
  // fast path `fast`, a barrier also waits for the tensors held for the vote before it).
  Sendable SendableLocked(bool fast) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Moves what may go out now from failures_ and outgoing_ into `failures` and `requests`,
  // in order; a barrier is the last request taken.
  void TakeSendableLocked(bool fast, std::vector<proto::FailureReport>* failures,
                          std::vector<proto::Request>* requests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A barrier this rank sent is not answered yet.
  bool BarrierInFlightLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The enqueue order of the first barrier in outgoing_ (kNoBarrier: none).
  uint64_t FirstBarrierLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t SeqOfLocked(const proto::Request& r) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Some tensor enqueued before `seq` is held for the fast path's vote.
  bool FastHeldBeforeLocked(uint64_t seq) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void OnMessage(const proto::ResponseList& msg);
  // The timeline's view of it.
  void MarkNegotiated(const proto::ResponseList& msg, Timeline& timeline);
  void OnClosed(const absl::Status& s);
  void AbortJob(const absl::Status& s);

  // ---- fast_loop.cc (Note [Fast path], fast_path.h) ----
  // One round of the fast path; false when the loop must stop.
  bool FastCycle();
  // FastCycle's first part, under mu_: waits for work or the round's time, then fills this
  // rank's vote, the requests for the coordinator and the errors to report. A value when no
  // vote follows (what FastCycle returns), nullopt when it does.
  std::optional<bool> BeginFastRound(proto::RequestList* out, Vote* vote,
                                     std::deque<Bucket>* replies);
  // FastCycle's last part: applies the gathered votes (or handles the vote's failure: a peer
  // that left, else an abort). True when the round ran or changed something.
  bool FinishFastRound(const absl::Status& gathered_status,
                       const std::vector<uint64_t>& gathered, proto::RequestList* resend);
  // Routes new requests (cached: held for the vote, else to `out`) and fills this rank's vote.
  void RouteAndVoteLocked(absl::Time now, proto::RequestList* out, Vote* vote)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs what the round agreed: cached buckets, invalidations, then the coordinator's
  // messages every rank received. Fills `resend` with requests that leave the fast path.
  void ApplyAgreement(const Agreement& a, proto::RequestList* resend);
  void ApplyCoordinatorMessage(const proto::ResponseList& msg, proto::RequestList* resend);
  // A tensor whose cache slot went: its full request goes to the coordinator after all.
  void LeaveFastPath(const std::string& name, proto::RequestList* resend);
  void CountFastBucket(const std::vector<int32_t>& ids);
  void AddFastPathTotals(proto::HeartbeatRequest* hb) const;
  // Back to the coordinator for good (a rank left): what waits for a round goes the slow
  // way, so the coordinator fails what can no longer complete, as on the slow path.
  void StopFastPathLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the held replies whose common lists are all applied to ready_ (`all`: every one).
  void ReleaseRepliesLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- execute.cc ----
  void Execute(const Bucket& bucket);
  absl::Status RunAllReduce(const Bucket& bucket, const std::vector<Entry*>& entries, Timeline* tl);
  absl::Status RunCollective(Entry& e, const Bucket& bucket);
  // The error of a bucket whose collective timed out on the data plane (`s`, which names the
  // peers waited on, transport/context.h): the same, naming the bucket's tensors too. The
  // first such error is kept and returned for every later bucket.
  absl::Status DataPlaneTimeout(const Bucket& bucket, const absl::Status& s);
  // Note [Join]: this rank has joined and takes part in `bucket` without entries of its own.
  bool JoinedIn(const Bucket& bucket) const;
  absl::Status RunJoined(const Bucket& bucket);
  void FinishBucket(const std::vector<std::string>& names, const absl::Status& s);

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kUninitialized;
  RuntimeConfig config_;
  std::unique_ptr<coordinator::CoordinatorServer> hosted_;
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<transport::Communicator> comm_;
  absl::node_hash_map<std::string, Entry> table_ ABSL_GUARDED_BY(mu_);  // in flight here
  std::vector<proto::Request> outgoing_ ABSL_GUARDED_BY(mu_);
  // Local failures to report (Note [Local failures]); they go out at once, unless a barrier
  // before them is still waiting (Note [Barrier order]).
  std::vector<PendingFailure> failures_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;  // Entry::seq, PendingFailure::seq
  int barriers_outgoing_ ABSL_GUARDED_BY(mu_) = 0;  // barriers in outgoing_
  // The barrier sent last (name, seq): in flight while its entry is in table_.
  std::pair<std::string, uint64_t> barrier_sent_ ABSL_GUARDED_BY(mu_);
  // The highest ResponseList.sequence applied (its responses queued, its evictions done):
  // sent with every RequestList so the coordinator can forget retired cache entries.
  int64_t applied_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Bucket> ready_ ABSL_GUARDED_BY(mu_);  // agreed, not yet run
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool executing_ ABSL_GUARDED_BY(mu_) = false;  // the loop is running collectives
  int64_t negotiating_ ABSL_GUARDED_BY(mu_) = 0;  // requests sent, not yet answered
  int group_depth_ ABSL_GUARDED_BY(mu_) = 0;  // open BeginGroup()s: outgoing_ is held
  // This rank's mirror of the coordinator's response cache: name -> (id, request bytes).
  std::map<std::string, std::pair<int32_t, std::string>> cache_ ABSL_GUARDED_BY(mu_);
  absl::Time last_send_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Held for the whole of Init and Shutdown: they may be called from any thread.
  absl::Mutex lifecycle_mu_;
  // CancelInit's view of an Init in progress (a leaf: CancelInit never waits for Init).
  absl::Mutex init_cancel_mu_;
  bool init_cancelled_ ABSL_GUARDED_BY(init_cancel_mu_) = false;
  CoordinatorClient* registering_ ABSL_GUARDED_BY(init_cancel_mu_) = nullptr;
  transport::TransportStats stats_ ABSL_GUARDED_BY(mu_);  // snapshot of comm_->stats()
  // DataPlaneTimeout's first error (or a fast-path vote's, FinishFastRound); braid-loop's
  // alone (reset by Init before it starts).
  absl::Status data_plane_timeout_;
  // comm_->Describe(), taken in Init before the background thread owns comm_.
  std::string transport_description_ ABSL_GUARDED_BY(mu_);
  // Created by Init (per job: compressor state and counters start fresh) before the client
  // (its heartbeats read the ledger) and replaced only by the next Init, after the client
  // closed; the stage resolves specs for enqueueing threads, the loop reduces with it.
  std::unique_ptr<StatisticsLedger> ledger_;
  std::unique_ptr<compression::CompressionStage> stage_;
  const compression::CompressionMethod* default_method_ = nullptr;  // BRAID_COMPRESSION
  // Null when not recording (BRAID_TIMELINE unset and no StartTimeline). Swapped by
  // StartTimeline / StopTimeline from any thread: users copy it (timeline()) and write to
  // their copy, so a timeline being replaced closes once its last writer is done.
  mutable absl::Mutex timeline_mu_;  // a leaf
  std::shared_ptr<Timeline> timeline_ ABSL_GUARDED_BY(timeline_mu_);
  std::unique_ptr<AllReducePipeline> pipeline_;  // the loop's
  int64_t timeline_max_bytes_ = 0;  // BRAID_TIMELINE_MAX_BYTES
  std::thread loop_;

  // Note [Fast path] (the job's BRAID_FAST_PATH, from registration). The cache, the count of
  // applied messages and the pending invalidations are braid-loop's alone.
  bool fast_path_ = false;
  int64_t fusion_threshold_ = 0;
  absl::Duration fallback_after_ = absl::Seconds(1);
  FastPathCache fast_cache_;
  uint64_t applied_ = 0;  // written by braid-loop under mu_ (others read it under mu_)
  std::vector<int32_t> invalidate_next_;
  int64_t next_fast_bucket_id_ = -1;  // negative: agreed by the ranks (timeline only)
  std::deque<proto::ResponseList> received_ ABSL_GUARDED_BY(mu_);  // not yet applied
  // Errors for this rank alone, each with the count of common lists received before it: it
  // runs once those are applied, so a rank never acts on an error before a flush the
  // coordinator sent ahead of it (Note [Resynchronization] in coordinator/negotiation.h).
  std::deque<std::pair<uint64_t, Bucket>> held_replies_ ABSL_GUARDED_BY(mu_);
  uint64_t received_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool fast_active_ ABSL_GUARDED_BY(mu_) = false;  // fast_path_, as OnMessage reads it
  absl::Status peer_left_ ABSL_GUARDED_BY(mu_);    // a rank shut down: rounds are over
  bool voting_ ABSL_GUARDED_BY(mu_) = false;       // braid-loop is in a vote's all-gather
  absl::Time last_round_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool round_progressed_ ABSL_GUARDED_BY(mu_) = false;  // the last round ran something
  int idle_rounds_ ABSL_GUARDED_BY(mu_) = 0;  // rounds in a row with nothing to run
  // What this rank ran through the fast path, for its heartbeats (a leaf lock).
  mutable absl::Mutex fast_stats_mu_;
  std::map<std::string, std::pair<int64_t, int64_t>> fast_by_method_
      ABSL_GUARDED_BY(fast_stats_mu_);  // method -> (tensors, bytes)
  int64_t fast_buckets_ ABSL_GUARDED_BY(fast_stats_mu_) = 0;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_RUNTIME_IMPL_H_
