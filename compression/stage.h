// The compression stage as the runtime uses it: resolves each spec once into a
// CompressionMethod (its canonical form, its Compressor and that compressor's per-tensor
// state), counts every tensor's reductions, runs warm-up steps (start_step) as plain float32
// all-reduces, and saves and loads the state for checkpoints. Byte counters are the
// runtime's (runtime/statistics.h): Reduce reports what each tensor of a bucket cost.
//
// Note [Bucket reduction]: a bucket is reduced in three steps, which the caller sequences
// (the runtime's pipeline, runtime/allreduce_pipeline.h). (1) Plan: per tensor its step
// count, whether it is still in its warm-up, and the dtype its view must have (its own when
// the compressor takes it natively, else float32; float32 in a warm-up step). (2) Pack: the
// caller lays the views out as planned (the runtime converts or copies into its fusion
// buffer, or points a lone tensor at its output). (3) Reduce: the warm-up tensors with none
// in float32, the others with the method's Compressor; on success each tensor's step count
// advances. The stage's state lock is held from Plan until the PlannedBucket it returns is
// reduced or dropped, so nothing (a state being loaded, ForgetTensors) changes a step count
// or a compressor between the plan and the reduction it describes. The stage never calls
// the caller: the caller owns the buffers and converts each tensor once each way, and the
// stage owns everything that persists across steps.
#ifndef BRAID_COMPRESSION_STAGE_H_
#define BRAID_COMPRESSION_STAGE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "compression/compressor.h"
#include "compression/registry.h"
#include "compression/state_summary.h"

namespace braid::compression {

struct StageOptions {
  uint64_t seed = 0;  // BRAID_SEED: stochastic rounding streams derive from it
  RegistryOptions registry;
};

// What the stage keeps of one tensor under one method.
struct TensorRecord {
  int64_t steps = 0;           // reductions so far, warm-up included
  std::vector<int64_t> shape;  // of the last one (empty when restored from a version 1 state)
};
using TensorRecords = std::map<std::string, TensorRecord, std::less<>>;

// One canonical spec, its Compressor (created at its first reduction, or by ApplyState) and
// its tensors' step counts. Owned by the stage, which never moves or destroys it while it
// lives, so a pointer resolved when a collective is enqueued stays valid.
class CompressionMethod {
 public:
  const std::string& spec() const { return spec_.canonical; }  // e.g. "fp4:ef=1", "none"
  const CompressionSpec& parsed() const { return spec_; }
  bool is_none() const { return spec_.method == "none"; }
  // MethodApplies (registry.h).
  bool Applies(DataType dtype, ReduceOp op) const { return MethodApplies(spec_, dtype, op); }

 private:
  friend class CompressionStage;
  explicit CompressionMethod(CompressionSpec spec) : spec_(std::move(spec)) {}

  const CompressionSpec spec_;
  // Guarded by the stage's state_mu_ (annotations cannot name another object's mutex).
  std::unique_ptr<Compressor> compressor_;
  // By tensor name (none keeps no records).
  TensorRecords tensors_;
};

// A compression state parsed by CompressionStage::ParseState and not applied yet: per method
// a fresh compressor holding its saved state, and its tensors' records.
struct ParsedState {
  struct Method {
    CompressionSpec spec;
    std::unique_ptr<Compressor> compressor;
    TensorRecords tensors;
  };
  int saved_rank = 0, saved_world_size = 0;
  std::map<std::string, Method> methods;  // by canonical spec
};

// One tensor of a bucket as the caller describes it before packing.
struct BucketTensor {
  absl::string_view name;
  absl::Span<const int64_t> shape;
  DataType dtype = DataType::kFloat32;  // the tensor's own
  size_t count = 0;
};

// How the stage reduces one tensor of a bucket (Note [Bucket reduction], step 1).
struct TensorPlan {
  int64_t step = 0;      // reductions of this tensor under this method so far
  bool warm_up = false;  // start_step not reached: a plain float32 all-reduce
  DataType work_dtype = DataType::kFloat32;  // the dtype its TensorView must have
  bool separate_input = false;               // its view may set TensorView::input
  bool separate_output = false;              // its view may set TensorView::output
};

// What one tensor of a bucket cost this rank.
struct TensorBytes {
  bool warm_up = false;
  uint64_t payload_bytes = 0;  // the compressor's count (warm-up and none: the bytes sent)
  // Its share of what its part of the bucket (the warm-up tensors, or the compressed ones)
  // sent on the data plane, apportioned by payload.
  uint64_t transport_bytes = 0;
};

class CompressionStage;

// A bucket planned by CompressionStage::Plan and not reduced yet (Note [Bucket reduction]):
// it holds the stage's state lock until it is reduced or destroyed, so whatever else needs
// the stage's state (SaveState, ForgetTensors, another Plan) waits meanwhile. The thread
// that planned packs and reduces it, and calls nothing else of the stage in between (it
// would wait for itself).
class PlannedBucket {
 public:
  PlannedBucket(PlannedBucket&& other) noexcept;
  PlannedBucket& operator=(PlannedBucket&&) = delete;
  PlannedBucket(const PlannedBucket&) = delete;
  PlannedBucket& operator=(const PlannedBucket&) = delete;
  // Releases the lock. (The analysis cannot follow a lock from one object to another.)
  ~PlannedBucket() ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // One per tensor, in the bucket's order: how the caller lays out its view.
  absl::Span<const TensorPlan> plans() const { return plans_; }

 private:
  friend class CompressionStage;
  PlannedBucket(CompressionStage* stage, CompressionMethod* method,
                absl::Span<const BucketTensor> tensors, absl::Span<const TensorPlan> plans)
      : stage_(stage), method_(method), tensors_(tensors), plans_(plans) {}

  CompressionStage* stage_;  // null once moved from: nothing to release
  CompressionMethod* method_;
  absl::Span<const BucketTensor> tensors_;  // the caller's, alive until the reduction
  absl::Span<const TensorPlan> plans_;      // the stage's scratch, under its lock
  device::Device* device_ = &device::HostDevice();  // of the tensors
};

class CompressionStage {
 public:
  explicit CompressionStage(const StageOptions& options);
  ~CompressionStage();

  // The canonical form of `spec` ("" and "none" give "none"); InvalidArgument as
  // ParseCompressionSpec. Thread-safe.
  absl::StatusOr<std::string> Canonicalize(absl::string_view spec) const;

  // The method of `spec` ("" is none): parsed once per distinct text, then found by it.
  // InvalidArgument as ParseCompressionSpec. Thread-safe; never waits for a bucket.
  absl::StatusOr<const CompressionMethod*> Resolve(absl::string_view spec);
  const CompressionMethod& none() const { return *none_; }

  // Step 1 of Note [Bucket reduction]: takes the stage's state lock and plans `tensors`, the
  // bucket's in the order every rank uses, all of one dtype, under `method` (creating its
  // compressor at its first bucket). The result keeps the lock and views `tensors`: both
  // must stay as they are until it is reduced or destroyed. Errors (the lock released):
  // FailedPrecondition when the method's compressor cannot be created (powersgd without
  // OpenBLAS). `device`: the device of the tensors (null: the host), where the compressor
  // keeps their state (Note [Compression state on the device], state_array.h). Background
  // thread only.
  absl::StatusOr<PlannedBucket> Plan(const CompressionMethod& method,
                                     absl::Span<const BucketTensor> tensors,
                                     device::Device* device = nullptr)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Step 3: reduces `views`, the planned bucket's tensors laid out in its order as its plans
  // say (step 2, the caller's), with `op`; `bytes` (one entry per tensor, or empty) receives
  // what each cost. Releases the lock when it returns. Errors: the compressor's, the
  // communicator's; Internal when the views are not laid out as planned; FailedPrecondition
  // (the data plane aborted) when a compressed method's planned device's memory is not
  // readable from the host, which the compressors' arithmetic needs. After an error the
  // views' contents are unspecified and no step count has advanced.
  absl::Status Reduce(PlannedBucket bucket, absl::Span<const TensorView> views, ReduceOp op,
                      transport::Communicator& comm, absl::Span<TensorBytes> bytes = {})
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Plan then Reduce, for views that are laid out already (tests and tools): each view's
  // dtype must be the one its plan asks for (float32, or the tensor's own where the
  // compressor takes it natively and its warm-up is over).
  absl::Status Reduce(const CompressionMethod& method, absl::Span<const TensorView> views,
                      ReduceOp op, transport::Communicator& comm,
                      absl::Span<TensorBytes> bytes = {});

  // Checkpointing (a training checkpoint keeps this next to the model): this rank's
  // compression state, i.e. per method the state its Compressor keeps across steps
  // (Compressor::SaveState: error-feedback residuals, PowerSGD's Q, ...) and the step counter
  // and shape of every tensor (warm-up, random streams and scalecomp's leader follow the
  // counters), so that loading it in a new job continues bit-identically. The state is per
  // rank (residuals differ across ranks). Format, integers little-endian, lengths in bytes:
  //   "BRDCMPST" (8 bytes), version u32 = 2, rank i32, world size i32,
  //   digest u64 (SummaryDigest of the state's summary, state_summary.h: what every rank
  //   must hold alike), method count u32, then per method:
  //     spec: u64 length + bytes (canonical, e.g. "powersgd:rank=2"),
  //     tensor count u32, per tensor: name (u64 length + bytes), reductions so far i64,
  //     shape: dimension count u32 + i64 each,
  //     compressor state: u64 length + bytes (the method's own format: powersgd.h,
  //     error_feedback.h; empty when it keeps none).
  // Version 1 (still read) had no digest and no shapes, and kept no error-feedback memory
  // but PowerSGD's. Methods that never reduced anything and none are not in it.
  // Errors: a device's, copying a compressor's state to the host. Thread-safe; waits for a
  // bucket being reduced.
  absl::StatusOr<std::string> SaveState(int rank, int world_size) const;
  // Parses a SaveState result without changing anything. InvalidArgument naming the field
  // when it is malformed (refused by its declared sizes before anything is allocated for
  // them), its digest does not match its contents, it names an unknown method or holds a
  // state its compressor refuses; FailedPrecondition when a method's compressor cannot be
  // created (powersgd without OpenBLAS). Thread-safe.
  absl::StatusOr<std::unique_ptr<ParsedState>> ParseState(absl::string_view state) const;
  // What every rank must hold alike (Note [Restoring compression state]) of the state this
  // stage would hold with `pending`'s methods replacing its own (null: as it is).
  // Thread-safe; waits for a bucket being reduced.
  StateSummary Summarize(const ParsedState* pending = nullptr) const;
  // Applies a parsed state: each method in it gets its fresh compressor and its tensors'
  // records; methods not in it are left as they are. Thread-safe.
  void ApplyState(std::unique_ptr<ParsedState> state);
  // ParseState, then ApplyState, for one process (the runtime checks that the ranks agree
  // first, Note [Restoring compression state]): InvalidArgument as ParseState, or when the
  // state was saved by a job of another world size; a state saved by another rank loads
  // with a warning.
  absl::Status LoadState(absl::string_view state, int rank, int world_size);
  // Forgets what every method keeps for the tensors `names` (Compressor::Reset: residuals,
  // PowerSGD's Q; and their step counters, so warm-up starts over): their next reduction
  // starts as the first one of a new job would. Names never reduced are ignored. Returns
  // how many (method, tensor) entries were forgotten. Thread-safe; waits for a bucket being
  // reduced. The caller makes sure no reduction of these tensors is queued, and that every
  // rank forgets them at the same point of its sequence of collectives.
  int ForgetTensors(absl::Span<const std::string> names);

 private:
  CompressionMethod* FindOrAddLocked(CompressionSpec spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(methods_mu_);
  friend class PlannedBucket;
  void PlanLocked(CompressionMethod& m, absl::Span<const BucketTensor> tensors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  void WarnIfLoadedForAnother(const CompressionMethod& m, absl::string_view name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Internal when `views` are not what `bucket` planned, or `bytes` does not fit them.
  absl::Status CheckPacked(const PlannedBucket& bucket, absl::Span<const TensorView> views,
                           absl::Span<TensorBytes> bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Reduces every part (warm-up, then compressed) and advances the step counts.
  absl::Status ReduceLocked(CompressionMethod& m, absl::Span<const BucketTensor> tensors,
                            absl::Span<const TensorView> views, ReduceOp op,
                            transport::Communicator& comm, absl::Span<TensorBytes> bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Reduces the views whose plan says `warm_up` with `compressor`, then books their bytes.
  absl::Status ReducePart(Compressor& compressor, bool warm_up, int64_t start_step,
                          absl::Span<const TensorView> views, ReduceOp op,
                          transport::Communicator& comm, absl::Span<TensorBytes> bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);

  const StageOptions options_;
  // Lock order: state_mu_, then methods_mu_ (Resolve takes methods_mu_ alone, so enqueueing
  // never waits for a bucket being reduced).
  mutable absl::Mutex state_mu_;  // a bucket's reduction, checkpoints: compressors and steps
  mutable absl::Mutex methods_mu_;
  // canonical spec -> method; spec text as given -> method (Resolve's cache).
  std::map<std::string, std::unique_ptr<CompressionMethod>, std::less<>> methods_
      ABSL_GUARDED_BY(methods_mu_);
  std::map<std::string, CompressionMethod*, std::less<>> by_text_ ABSL_GUARDED_BY(methods_mu_);
  CompressionMethod* none_ = nullptr;  // set by the constructor, then constant
  std::unique_ptr<Compressor> plain_;  // none, for warm-up steps (state_mu_)
  // Scratch of one Reduce call (state_mu_).
  std::vector<TensorPlan> plans_;
  std::vector<TensorView> part_;
  std::vector<size_t> part_index_;
  std::vector<uint64_t> payload_;
  std::vector<int64_t> step_values_;
  std::vector<TensorBytes> bytes_scratch_;
  // Per tensor whose state was loaded (ApplyState), the specs it was loaded for, until its
  // first bucket (WarnIfLoadedForAnother).
  std::map<std::string, std::vector<std::string>, std::less<>> loaded_specs_
      ABSL_GUARDED_BY(state_mu_);
  // The device of the bucket being reduced (StepContext::device).
  device::Device* device_ ABSL_GUARDED_BY(state_mu_) = &device::HostDevice();
};

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_STAGE_H_
