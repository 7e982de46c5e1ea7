// braid::Runtime: the public C++ API. A process initialises it once, then hands it
// collectives asynchronously; a background thread negotiates them with the coordinator and
// runs them over the data plane in the same order on every rank.
//
// Thread-safety: every method may be called from any thread. The background thread is the
// only one that touches the data plane; it never calls back into the caller's code. Which
// threads a rank runs and which locks they take: Note [Threads and locks] in
// runtime/runtime_impl.h.
#ifndef BRAID_RUNTIME_RUNTIME_H_
#define BRAID_RUNTIME_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "runtime/config.h"
#include "runtime/handle.h"
#include "runtime/statistics.h"
#include "transport/communicator.h"

namespace braid {

// One collective call. Shapes are in elements; buffers are host memory, contiguous,
// row-major, and must stay valid (and unmodified, for inputs) until the handle completes.
struct CollectiveRequest {
  std::string name;                // unique among this rank's in-flight collectives
  Collective collective = Collective::kAllReduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;      // this rank's input shape
  const void* input = nullptr;
  // allreduce / broadcast: same shape as the input (may equal `input` for in-place).
  // reducescatter: this rank's share of dim 0 (dim0 / size, the first dim0 % size ranks one
  // row more). allgather / alltoall: may be null, then the result lands in Handle::output().
  void* output = nullptr;
  // Size of `output` when the runtime decides the shape (all-gather, all-to-all). When the
  // result does not fit, the runtime gathers into Handle::output() instead and leaves
  // `output` untouched; compare Handle::output_shape() with what you passed.
  size_t output_capacity_bytes = 0;
  // allgather / alltoall / reducescatter: when set, where the result goes once its size is
  // known: called on braid's background thread before the collective with the result's
  // bytes and shape, it returns memory of that many bytes on the request's device (a
  // framework allocates its output tensor there, on a GPU for a device tensor) that stays
  // valid until the handle completes; it takes precedence over `output`, and
  // Handle::output() stays empty. An error (or null for a non-empty result) fails the
  // collective with ResourceExhausted naming the tensor and ends the job, as a fusion
  // buffer that cannot grow does (docs/failures.md), since the peers are in it already.
  std::function<absl::StatusOr<void*>(size_t bytes, const std::vector<int64_t>& shape)>
      allocate_output;
  ReduceOp op = ReduceOp::kAverage;
  int root_rank = 0;               // broadcast
  std::vector<int64_t> splits;     // alltoall: rows of dim 0 sent to each rank; empty = even
  // Note [Process sets] (control/process_sets.h): the set that runs it (0: every rank). A
  // rank outside the set gets InvalidArgument; a broadcast's root_rank is a rank of the job
  // in the set; the all-gather's and reduce-scatter's blocks and the all-to-all's splits go
  // by rank in the set (the members in ascending order); an average divides by the set's
  // size. Names are per set: sets may use the same names.
  int process_set_id = 0;
  // Where `input` and `output` are (Note [Devices], device/device.h): host memory (the
  // default), or a device's, which every rank must use for this tensor too (rank r on
  // cuda:r is the usual placement; a CPU tensor on one rank and a CUDA one on another is
  // InvalidArgument on every rank, naming both). `stream` is the caller's stream on that
  // device (a cudaStream_t; null: the device's default stream): braid's work on the tensor
  // waits for what the caller queued on it before enqueueing. Tensors on different devices
  // never share a bucket. A device with no device implementation or data plane in this
  // runtime is FailedPrecondition at enqueue.
  DeviceRef device;
  void* stream = nullptr;
  // allreduce only: a compression spec (compression/registry.h), e.g. "fp16", "fp4:ef=1";
  // "" = the job's default (BRAID_COMPRESSION), which applies to floating-point sum/average
  // all-reduces only. Every rank must ask for the same one (else an error on every rank).
  // Enqueue resolves it once into its canonical method, which travels to the coordinator.
  std::string compression;
  // allreduce only, statistics only: the plan pattern a caller that resolved a plan itself
  // matched to choose `compression` (braid.torch's DistributedOptimizer: CompressionPlanFor),
  // so the tensor counts in that group (Note [Compression groups] in
  // control/compression_groups.h). Used with a single spec in `compression`; where the
  // runtime resolves a plan (a plan in `compression` or the job's default) the plan's own
  // pattern replaces it. Valid UTF-8 (else InvalidArgument); cut to
  // kMaxCompressionPatternBytes.
  std::string compression_pattern;
  // Set by AddProcessSet / RemoveProcessSet for their changes (Collective::kProcessSetAdd,
  // kProcessSetRemove) only.
  std::vector<int> process_set_ranks;
  int32_t target_process_set_id = 0;
  bool members_only = false;
};

// The parts Init may be given instead of the real ones (Note [Injected parts],
// runtime/deps.h): declared here, defined where the tests and the composition root need it.
struct RuntimeDeps;

// The compression methods braid knows (compression/registry.h), in a stable order, with the
// test-only ones when `test_methods`.
std::vector<std::string> CompressionMethods(bool test_methods = false);
// The canonical form of a compression spec ("fp4:chunk=128" is "fp4") or plan (Note
// [Compression plans], compression/compression_plan.h: compact JSON, its specs canonical,
// its options explicit); InvalidArgument naming what is wrong (an unknown method or option
// lists the valid ones; a plan's error names its key).
absl::StatusOr<std::string> CanonicalCompression(absl::string_view spec,
                                                 bool test_methods = false);
// What a plan gives one tensor: its canonical spec and the pattern that matched ("" when
// none did).
struct CompressionPlanChoice {
  std::string spec;
  std::string pattern;
};
// What the plan `plan` gives the tensor `name` (Note [Compression plans]), as the runtime
// would: for a framework that names its tensors otherwise than the plan's patterns
// (braid.torch's DistributedOptimizer matches parameter names), which passes the spec as
// CollectiveRequest::compression and the pattern as its compression_pattern.
// InvalidArgument for a bad plan.
absl::StatusOr<CompressionPlanChoice> CompressionPlanFor(absl::string_view plan,
                                                         absl::string_view name,
                                                         absl::Span<const int64_t> shape,
                                                         DataType dtype, ReduceOp op,
                                                         bool test_methods = false);

// One settings change as a rank applied it (Runtime::SettingsHistory).
struct SettingsApplied {
  int64_t epoch = 0;  // 1, 2, ...: the job's own settings are epoch 0
  int64_t step = 0;   // the first step run under it (Note [Settings changes])
  int64_t fusion_threshold_bytes = 0;
  int64_t cycle_time_us = 0;
  int64_t ring_chunk_bytes = 0;
  int ring_window = 0;
  std::string reason;
  bool tuning_done = false;  // autotuning ended with these
  // The method of compression `auto` from this step on ("": unchanged, none until the first).
  std::string compression;
};

class Runtime {
 public:
  Runtime();
  ~Runtime();  // shuts down if still running
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Joins the job: rendezvous with the coordinator (hosting it in-process on rank 0 when
  // config.coordinator is empty), connects the data plane, starts the background thread.
  // OK if already initialised. Errors: InvalidArgument (bad configuration),
  // DeadlineExceeded / Unavailable (coordinator or peers unreachable).
  absl::Status Init(const RuntimeConfig& config);
  // The same with injected parts (Note [Injected parts]); `deps` is dropped when already
  // initialised.
  absl::Status Init(const RuntimeConfig& config, RuntimeDeps deps);
  // Makes an Init in progress on another thread return Cancelled promptly while it waits
  // for the other ranks to register (Ctrl-C in braid.init()); waits bounded by their own
  // timeouts (reaching the coordinator, connecting the data plane) are not cut short. An
  // Init that starts later is not affected; one that already succeeded stays initialised.
  // Thread-safe; never waits for Init.
  void CancelInit();
  // Fails every pending handle with Cancelled and leaves the job; returns within ~2 s even
  // when peers are gone. OK if not initialised. Init() may be called again afterwards.
  absl::Status Shutdown();
  bool initialized() const;

  // FailedPrecondition before Init / after Shutdown.
  absl::StatusOr<int> rank() const;
  absl::StatusOr<int> size() const;
  absl::StatusOr<int> local_rank() const;
  absl::StatusOr<int> local_size() const;
  // Whether every host runs the same number of ranks (every rank's local_size is equal).
  absl::StatusOr<bool> is_homogeneous() const;
  // Elastic jobs: how many processes wait to join (registered for the next membership), as
  // of the last heartbeat's answer (HeartbeatResponse.ranks_waiting); 0 outside them.
  absl::StatusOr<int> ranks_waiting() const;
  // Elastic jobs: how many of this membership's ranks leave the job at its end (braidrun
  // drains them), as of the last heartbeat's answer (HeartbeatResponse.ranks_leaving).
  absl::StatusOr<int> ranks_leaving() const;

  // Enqueues a collective and returns at once. Errors returned here (the handle is not
  // created): FailedPrecondition (not initialised), AlreadyExists (a collective with this
  // name is in flight on this rank), InvalidArgument (bad arguments, checked locally).
  // Errors agreed across ranks (mismatched shapes, ...) arrive through the handle.
  absl::StatusOr<std::shared_ptr<Handle>> Enqueue(CollectiveRequest request);

  // Reports that this rank's call of collective `name` failed before it reached Enqueue
  // (a binding refused its arguments): the coordinator fails the tensor on every rank that
  // submitted it, naming this rank and `cause` (Enqueue reports its own refusals the same
  // way). InvalidArgument for an OK cause or a bad name; FailedPrecondition when not
  // initialised or while `name` is in flight on this rank.
  absl::Status ReportFailure(const std::string& name, const absl::Status& cause);

  // Groups (Horovod's grouped all-reduce): the collectives this rank enqueues between
  // BeginGroup() and the matching EndGroup() are held back and sent to the coordinator in
  // one message, so on every rank that does the same they become ready at the same moment,
  // and the all-reduces among them that may fuse (same dtype, op and compression) travel in
  // one bucket when they fit under BRAID_FUSION_THRESHOLD. What a bucket holds matters to
  // compressors that select over a whole bucket (scalecomp, topk and randomk with
  // granularity=bucket): grouped, the selection covers the group whatever the timing.
  // Groups nest (the outermost EndGroup sends); while one is open, what other threads
  // enqueue is held too. EndGroup: FailedPrecondition when no group is open or the runtime
  // is not running.
  void BeginGroup();
  absl::Status EndGroup();

  // Note [Process sets] (control/process_sets.h). Adds a process set of `ranks` (any order,
  // no repeats) and returns its id once every rank agreed: every rank calls AddProcessSet and
  // RemoveProcessSet in the same order with the same arguments (blocking, like a
  // collective). With `members_only`, only `ranks` call it (torch's new_group) and an
  // existing set with these ranks is returned. Errors on every rank: InvalidArgument (bad
  // ranks; a rank asked for another change, naming the ranks and what each asked for),
  // AlreadyExists (a set with these ranks exists, naming it), FailedPrecondition (more than
  // kMaxProcessSets sets); the collective's errors (DeadlineExceeded, Unavailable).
  // FailedPrecondition when not initialised.
  absl::StatusOr<int32_t> AddProcessSet(std::vector<int> ranks, bool members_only = false);
  // Removes set `id`: its collectives still pending fail on every member, naming the set.
  // InvalidArgument for set 0 or a set that does not exist (on every rank).
  absl::Status RemoveProcessSet(int32_t id);
  // The ranks of set `id` (0: the whole world), ascending; NotFound when there is none.
  absl::StatusOr<std::vector<int>> ProcessSetRanks(int32_t id) const;
  // Every set but the whole world's, by id.
  absl::StatusOr<std::map<int32_t, std::vector<int>>> ProcessSets() const;

  // Transport bytes this rank has put on the data plane since Init (updated as each
  // collective completes). FailedPrecondition when not initialised.
  absl::StatusOr<transport::TransportStats> transport_stats() const;

  // The transports this rank's data-plane endpoints use, as Communicator::Describe() says
  // at Init: every transport to any peer, e.g. "ucx tcp/eth0" (peers on other hosts) or
  // "ucx cma/memory sysv/memory" (shared memory on one host). FailedPrecondition when not
  // initialised.
  absl::StatusOr<std::string> transport_description() const;

  // Note [Settings changes] (runtime/step_settings.h): the settings changes this rank applied
  // in its current (or last) job, in order, with the step each applied from; empty when none
  // happened. FailedPrecondition before the first Init.
  absl::StatusOr<std::vector<SettingsApplied>> SettingsHistory() const;

  // Byte counters of every all-reduce since Init, per tensor and per compression method
  // (payload vs transport bytes against the uncompressed ones; see runtime/statistics.h),
  // per tensor for the kMaxTensorStats names reduced most recently (Note [Bounded
  // per-tensor statistics]). FailedPrecondition when not initialised.
  absl::StatusOr<CompressionReport> compression_report() const;

  // This rank's compression state for a training checkpoint: the state compressors keep
  // across steps (PowerSGD's Q matrices, the error-feedback memory of every method that has
  // one) and every tensor's step counter and shape, as bytes in the versioned format of
  // CompressionStage::SaveState (compression/stage.h). Per rank: residuals differ across
  // ranks. Take it between steps: FailedPrecondition when not initialised, or while a
  // compressed all-reduce is in flight on this rank (the state would fall between two
  // buckets of a step).
  absl::StatusOr<std::string> compression_state() const;
  // Restores a compression_state() result (after resuming from a checkpoint, before the next
  // step), so training continues bit-identically. Collective: every rank calls it with its
  // own state, and the ranks compare what they restored (an all-gather of summaries, Note
  // [Restoring compression state] in compression/state_summary.h) before any applies it.
  // Either every rank applies its state, or none does and every rank returns the same error:
  // when some rank refused its own state, the code of the lowest such rank with every
  // refusing rank's reason (InvalidArgument: malformed, checked by its declared sizes before
  // anything is allocated; FailedPrecondition: a compressed all-reduce in flight there);
  // else InvalidArgument naming the ranks and what differs (states taken at different
  // steps, of another model, of another world size, one rank's state loaded on two ranks).
  // The peers' errors (Unavailable, DeadlineExceeded) as for any collective. At once and on
  // this rank only: FailedPrecondition when not initialised.
  absl::Status LoadCompressionState(absl::string_view state);
  // This rank's part of a LoadCompressionState whose state its caller refused (`why`, not
  // OK: a Python object that is not bytes): it takes part in the ranks' comparison with that
  // refusal, so every rank fails at once with it instead of waiting for this rank's report.
  absl::Status RefuseCompressionState(const absl::Status& why);
  // Forgets this rank's compression state of the tensors `names` (CompressionStage::
  // ForgetTensors): their next all-reduce starts fresh, as in a new job (the Python
  // DistributedOptimizer does it when a new optimizer takes the names of a dropped one).
  // Call it at the same point of every rank's sequence of collectives. FailedPrecondition
  // when not initialised, or while an all-reduce of one of `names` is in flight on this
  // rank (naming it); nothing is forgotten then. Returns the (method, tensor) entries
  // forgotten.
  absl::StatusOr<int> ForgetCompressionState(absl::Span<const std::string> names);

  // Starts recording the timeline (runtime/timeline.h) into `path` while the job runs, as
  // Horovod's start_timeline: rank 0 writes `path`, rank r writes `path`.rank<r>, rotated
  // beyond BRAID_TIMELINE_MAX_BYTES. A timeline already recording (BRAID_TIMELINE, or an
  // earlier call) is closed first, as valid JSON. Each rank starts and stops its own.
  // InvalidArgument for an empty path or one that cannot be written; FailedPrecondition when
  // not initialised.
  absl::Status StartTimeline(const std::string& path);
  // Stops recording and closes the file (valid JSON). OK when none is recording;
  // FailedPrecondition when not initialised.
  absl::Status StopTimeline();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The process-wide runtime the bindings share.
Runtime& GlobalRuntime();

}  // namespace braid

#endif  // BRAID_RUNTIME_RUNTIME_H_
