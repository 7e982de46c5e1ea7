// Internal: braid::Runtime (runtime.h) in three parts, joined by one queue of agreed buckets
// (Note [Execution step], control/bucket.h):
//   NegotiationController  controller.h (controller*.cc): the collectives in flight, turned
//                          into agreed buckets through the coordinator or the fast path's vote
//   Executor               executor.h: runs each agreed bucket on the data plane (all-reduces
//                          through allreduce_pipeline.h) and completes its handles
//   Runtime::Impl          this file, the facade and the one composition root: Init creates
//                          and wires the coordinator client (or the coordinator this rank
//                          hosts), the data plane, the controller and the executor
//                          (lifecycle.cc); it checks requests (enqueue.cc) and keeps the
//                          compression state (checkpoint.cc)
//
// Note [Threads and locks]
// A rank runs, besides the caller's threads, three threads of braid's own
// (docs/architecture.md draws them) and the pools of the libraries under it (gRPC's,
// sized by the host's cores; UCX's async thread):
//   braid-loop       the background thread (Loop): asks the controller for the next agreed
//                    buckets (one cycle: requests out, or a vote of the fast path) and has
//                    the executor run them, in the order every rank agreed on. The only
//                    thread that touches the data plane, the fusion buffer and the
//                    compressors.
//   braid-coord-rx   the coordinator client's reader. Turns each ResponseList into Buckets
//                    on the controller's ready queue (OnMessage) and the stream's end into
//                    an abort (OnClosed).
//   braid-heartbeat  the coordinator client's heartbeat. Reads the statistics ledger and
//                    the controller's fast-path totals.
// Hand-offs of one collective: the caller's Enqueue puts its entry in the controller's table
// and its request on outgoing_ (under the controller's mu_) -> braid-loop sends it -> the
// coordinator agrees -> braid-coord-rx queues the Bucket on ready_ (under mu_) -> braid-loop
// takes it and the executor runs it and completes the Handle -> the caller's Wait returns.
// Entries stay put in the table until the executor finishes them (on braid-loop), so it
// reads them without mu_ while running their bucket (a node_hash_map: its entries never
// move; a hash map, so an enqueue costs O(1) however many handles are in flight). Under the
// fast path (Note [Fast path], fast_path.h), a cached tensor takes one hand-off: Enqueue ->
// braid-loop votes and runs it (controller_fast.cc); coordinator messages wait in received_
// for a round.
//
// Lock order (a thread holding one may take those to its right, never the reverse):
//   lifecycle_mu_ -> controller's mu_ -> { Handle::mu_, Timeline's, stage's methods_mu_
//     (Resolve) }
//   parts_mu_ -> the executor's mu_
//   stage's state_mu_ (held by braid-loop for a bucket; SaveState, Summarize, ApplyState)
//     -> methods_mu_
//   StatisticsLedger's mutex, timeline_mu_, the controller's fast_stats_mu_ and the
//   executor's mu_: leaves.
// No runtime lock is held while calling the coordinator client (Send, Close) or a
// communicator (collectives, Abort): those have locks of their own and may block. One
// exception: OnMessage calls the control channel's Abort (thread-safe, it never waits on
// braid-loop) under the controller's mu_ when a rank left during a vote (Note [Fast path]).
#ifndef BRAID_RUNTIME_RUNTIME_IMPL_H_
#define BRAID_RUNTIME_RUNTIME_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "compression/compression_plan.h"
#include "compression/stage.h"
#include "control/process_sets.h"
#include "runtime/controller.h"
#include "runtime/data_planes.h"
#include "runtime/deps.h"
#include "runtime/executor.h"
#include "runtime/job_identity.h"
#include "runtime/runtime.h"
#include "runtime/statistics.h"
#include "runtime/step_settings.h"
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
  absl::StatusOr<int32_t> AddProcessSet(std::vector<int> ranks, bool members_only);
  absl::Status RemoveProcessSet(int32_t id);
  absl::StatusOr<std::vector<int>> ProcessSetRanks(int32_t id) const;
  absl::StatusOr<std::map<int32_t, std::vector<int>>> ProcessSets() const;
  absl::StatusOr<transport::TransportStats> transport_stats() const;
  absl::StatusOr<std::string> transport_description() const;
  absl::StatusOr<CompressionReport> compression_report() const;
  absl::StatusOr<std::string> compression_state() const;
  // `refused`: the caller refused this rank's state (Runtime::RefuseCompressionState).
  absl::Status LoadCompressionState(absl::string_view state, const absl::Status& refused);
  absl::StatusOr<int> ForgetCompressionState(absl::Span<const std::string> names);
  absl::Status StartTimeline(const std::string& path);
  absl::Status StopTimeline();
  absl::StatusOr<std::vector<SettingsApplied>> SettingsHistory() const;

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int homogeneous_ = 1;  // 1: every rank's local_size is the same
  // The last heartbeat's HeartbeatResponse.ranks_waiting (written by the client's thread).
  std::atomic<int> ranks_waiting_{0};
  std::atomic<int> ranks_leaving_{0};  // and its ranks_leaving

 private:
  // ---- lifecycle.cc ----
  absl::Status InitLocked(const RuntimeConfig& config, RuntimeDeps deps);
  // The ledger and the compression stage of a new job, and its default method.
  absl::Status MakeCompression(const RuntimeConfig& config);
  // The gRPC client of config.coordinator, hosting the coordinator first on rank 0 when it
  // is empty (and making a lone process rank 0 of 1 in `launch`).
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectDefaultCoordinator(
      const RuntimeConfig& config, const JobSecret& secret, LaunchInfo* launch,
      const CoordinatorClientSetup& setup);
  // Starts the coordinator this rank hosts (rank 0 without BRAID_COORDINATOR; `alone`: a
  // private one on a free loopback port); its address.
  absl::StatusOr<std::string> HostCoordinator(const RuntimeConfig& config,
                                              const JobSecret& secret, const LaunchInfo& launch,
                                              bool alone);
  // Opens the timeline of `path` for this rank (rank r > 0 writes PATH.rank<r>) and makes it
  // the one events go to, closing the one before (valid JSON); "" closes it only.
  absl::Status OpenTimeline(const std::string& path);
  // The timeline events go to now, or null: kept alive by the caller while it writes.
  std::shared_ptr<Timeline> timeline() const;
  // Wires the executor and the controller to the job's parts and starts braid-loop.
  absl::Status StartLoop(const proto::JobSettings& job);
  // The executor over the job's channels, devices and GPU data planes (StartLoop's first step).
  void MakeExecutor(const proto::JobSettings& job);
  // braid-loop: the controller's buckets, run by the executor, cycle after cycle, each
  // past the step boundaries that apply settings changes (Note [Settings changes]).
  void Loop(Executor& executor, StepSettings& steps);
  // ---- lifecycle_settings.cc ----
  // The job's pipeline settings on the world's data channel and on the process sets' ones
  // (BRAID_RING_CHUNK_BYTES, BRAID_RING_WINDOW), and the step boundaries' tracker.
  StepSettings* MakeStepSettings(const proto::JobSettings& job);
  void ReleaseParts();  // after a failed Init or at the end of Shutdown

  // ---- enqueue.cc ----
  // `set_size`: the size of the request's process set.
  absl::Status CheckRequest(const CollectiveRequest& r, int set_size) const;
  // Note [Process sets]: InvalidArgument unless the request's set exists and holds this
  // rank; the set's size.
  absl::StatusOr<int> CheckProcessSet(const CollectiveRequest& r) const;
  // Note [Devices]: the request's device (null: host memory) and, for a device, the event
  // at which its input is ready on the caller's stream. InvalidArgument for a bad device
  // type or id, FailedPrecondition for a device this runtime cannot use or a collective its
  // device path does not run yet. `accepted`: the request's compression, resolved.
  absl::StatusOr<Accepted> AcceptDevice(const CollectiveRequest& r, Accepted accepted) const;
  // A change of the sets, enqueued and waited for; the handle's int32 output.
  absl::StatusOr<int32_t> ChangeProcessSets(CollectiveRequest req);
  // braid-loop, when a change's bucket runs: the mirror follows it and the collectives of a
  // removed set still in flight here fail.
  void ApplyProcessSetChange(const Bucket& bucket);
  std::optional<std::vector<int>> SetRanksOf(int32_t id) const;
  void ResetProcessSets();  // a new job's: the whole world's set only
  // The all-reduce's compression: its own spec, or the job's default where it applies.
  // `plan_name`: the name a plan's patterns match (the caller's, not the process set's
  // qualified one, Note [Process sets]). Its method, and the plan pattern it came from
  // (Note [Compression groups]: a plan's, or the caller's with a single spec).
  absl::StatusOr<Accepted> ResolveCompression(const CollectiveRequest& r,
                                              absl::string_view plan_name) const;
  // The plan of the text `plan` (parsed once); the spec it gives `r`'s tensor, resolved.
  absl::StatusOr<std::shared_ptr<const compression::CompressionPlan>> PlanOf(
      const std::string& plan) const;
  absl::StatusOr<Accepted> FromPlan(const compression::CompressionPlan& plan,
                                    const CollectiveRequest& r,
                                    absl::string_view plan_name) const;
  // FailedPrecondition when not running or while a compressed all-reduce is in flight.
  absl::Status CheckNoCompressionInFlight(absl::string_view what) const;

  // ---- checkpoint.cc ----
  // Every rank's report (Note [Restoring compression state], compression/state_summary.h),
  // in rank order, by an all-gather every rank runs.
  absl::StatusOr<std::vector<compression::LoadReport>> GatherLoadReports(
      const compression::LoadReport& mine);

  RuntimeConfig config_;
  // Held for the whole of Init and Shutdown: they may be called from any thread.
  absl::Mutex lifecycle_mu_;
  // CancelInit's view of an Init in progress (a leaf: CancelInit never waits for Init).
  absl::Mutex init_cancel_mu_;
  bool init_cancelled_ ABSL_GUARDED_BY(init_cancel_mu_) = false;
  CoordinatorClient* registering_ ABSL_GUARDED_BY(init_cancel_mu_) = nullptr;
  // Persists across jobs: Start and EndJob begin and end each one.
  NegotiationController controller_;
  std::unique_ptr<coordinator::CoordinatorServer> hosted_;
  std::unique_ptr<CoordinatorClient> client_;
  // The host data plane and the control channel (Note [Channels]), and the registry the
  // executor takes data planes from (Note [Data planes]).
  transport::Channels channels_;
  DataPlaneRegistry planes_;
  // Replaced by Init only; read by the callers' threads (stats) under parts_mu_.
  mutable absl::Mutex parts_mu_;
  std::unique_ptr<Executor> executor_ ABSL_GUARDED_BY(parts_mu_);
  std::unique_ptr<StepSettings> step_settings_ ABSL_GUARDED_BY(parts_mu_);
  std::unique_ptr<AutoCompression> auto_compression_ ABSL_GUARDED_BY(parts_mu_);
  // The host data plane's Describe(), taken in Init before braid-loop owns the planes.
  std::string transport_description_ ABSL_GUARDED_BY(parts_mu_);
  // Created by Init (per job: compressor state and counters start fresh) before the client
  // (its heartbeats read the ledger) and replaced only by the next Init, after the client
  // closed; the stage resolves specs for enqueueing threads, the executor reduces with it.
  std::unique_ptr<StatisticsLedger> ledger_;
  std::unique_ptr<compression::CompressionStage> stage_;
  // Note [Devices]: the devices tensors may be on (RuntimeDeps::devices, else the host and,
  // when built with CUDA, the GPUs). Set by Init before any enqueue, read-only after.
  std::shared_ptr<const device::DeviceRegistry> devices_ =
      std::make_shared<device::DeviceRegistry>();
  // Note [GPU data planes]: NCCL as Init was given it (RuntimeDeps::nccl), and the planes of
  // GPU buckets, made with the executor (braid-loop's, aborted from any thread).
  NcclProvider nccl_;
  std::unique_ptr<DevicePlanes> device_planes_;
  const compression::CompressionMethod* default_method_ = nullptr;  // BRAID_COMPRESSION
  // BRAID_COMPRESSION when it is a plan (Note [Compression plans]); then default_method_ is
  // unused. Set by Init, read-only after.
  std::shared_ptr<const compression::CompressionPlan> default_plan_;
  bool test_compressors_ = false;  // BRAID_TEST_COMPRESSORS, for the plans' specs
  // The plans requests named, parsed once each (by their text; at most kMaxPlans).
  mutable absl::Mutex plans_mu_;  // a leaf
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const compression::CompressionPlan>>
      plans_ ABSL_GUARDED_BY(plans_mu_);
  // Null when not recording (BRAID_TIMELINE unset and no StartTimeline). Swapped by
  // StartTimeline / StopTimeline from any thread: users copy it (timeline()) and write to
  // their copy, so a timeline being replaced closes once its last writer is done.
  mutable absl::Mutex timeline_mu_;  // a leaf
  std::shared_ptr<Timeline> timeline_ ABSL_GUARDED_BY(timeline_mu_);
  int64_t timeline_max_bytes_ = 0;  // BRAID_TIMELINE_MAX_BYTES
  std::thread loop_;
  // Note [Process sets]: this rank's mirror of the coordinator's sets, changed by braid-loop
  // as each change's bucket runs; read by the callers' threads. A leaf.
  mutable absl::Mutex sets_mu_;
  ProcessSetTable sets_ ABSL_GUARDED_BY(sets_mu_){1};
  // Changes this rank asked for (the k-th pairs with every rank's k-th): world-wide ones,
  // and members-only ones per set of ranks.
  int64_t set_changes_ ABSL_GUARDED_BY(sets_mu_) = 0;
  std::map<std::vector<int>, int64_t> members_only_changes_ ABSL_GUARDED_BY(sets_mu_);
};

}  // namespace braid

#endif  // BRAID_RUNTIME_RUNTIME_IMPL_H_
