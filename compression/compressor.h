// The compression stage's seam: a Compressor reduces one bucket of tensors across
// the ranks of a Communicator, choosing its own collectives — compress, communicate,
// decompress. Every algorithm plugs in here, uncompressed reduction included:
//   none:        one all-reduce of the bucket in its own dtype, any reduce op;
//   fp16 / bf16: one all-reduce of the cast bucket;
//   fp4 / int4:  an all-to-all of quantized shards, a local float32 sum, an all-gather of the
//                re-quantized shards (one collective each for the whole bucket);
//   PowerSGD:    two all-reduces (P, then Q) of small matrices per bucket, P/Q kept per tensor;
//   ScaleComp:   a broadcast of the leader's indices, then an all-reduce of the k values.
//
// A Compressor is created per canonical spec string (see registry.h) and keeps per-tensor
// state (error-feedback residuals, PowerSGD factors, ...) keyed by tensor name, so state
// persists across steps, on the tensor's device (Note [Compression state on the device],
// state_array.h). It belongs to the runtime's background thread: not thread-safe.
#ifndef BRAID_COMPRESSION_COMPRESSOR_H_
#define BRAID_COMPRESSION_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "device/device.h"
#include "transport/communicator.h"

namespace braid::compression {

// One tensor of a bucket as a Compressor sees it: contiguous, reduced in place in `data`.
// Its dtype is one the compressor takes natively (Compressor::TakesNatively); the runtime
// converts every other tensor to a float32 work buffer first and back afterwards, once each
// way. Compressors that take only float32 read `f32()`.
struct TensorView {
  absl::string_view name;
  absl::Span<const int64_t> shape;  // the tensor's shape (PowerSGD views it as a matrix)
  void* data = nullptr;             // `count` elements of `dtype`; the result lands here
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  // Out of place: when set, this rank's values are read from here instead of `data` (which
  // then only receives the result). Set only for compressors whose ReadsSeparateInput() is
  // true; others always find it null and their input in `data`.
  const void* input = nullptr;
  // Gathered: when set (with `input`), the result goes here instead, and `data` is scratch
  // of the view's size, back to back with its neighbours' as in a packed bucket, holding
  // nothing yet: a bucket whose tensors lie scattered, reduced without the runtime's copies
  // into and out of its fusion buffer (Note [Gathered all-reduce], transport/gather.h). Set
  // only for compressors whose WritesSeparateOutput() is true.
  void* output = nullptr;

  float* f32() const { return static_cast<float*>(data); }
  size_t bytes() const { return count * DataTypeSize(dtype); }
};

// What one Reduce call needs besides the data, identical on every rank except `rank`.
struct StepContext {
  // kSum or kAverage for every method but none, which takes every op (MethodApplies,
  // registry.h says which method takes what).
  ReduceOp op = ReduceOp::kAverage;
  // Per-rank reproducible randomness: stochastic rounding seeds derive from
  // (seed, rank, tensor name, step). Set from BRAID_SEED.
  uint64_t seed = 0;
  // Per tensor, in the order of `tensors`: how many compressed reductions of that tensor this
  // compressor ran before (the same on every rank). Seeds and schedules derive from it.
  absl::Span<const int64_t> steps;
  // Filled by Reduce: bytes of the compressed representation this rank contributed for each
  // tensor (payload bytes: runtime/statistics.h), in the order of `tensors`.
  absl::Span<uint64_t> payload_bytes;
  // The device of the bucket's tensors, where the compressor keeps their state (Note
  // [Compression state on the device], state_array.h); the stage lets a compressor see only
  // devices whose memory the host can read. Never null.
  device::Device* device = &device::HostDevice();
};

// For a failure of this rank alone before a bucket's collectives (placing its state on the
// device): its peers are in those collectives already and fail at the data plane's timeout;
// this rank's communicator is aborted with `s`, so none of its later collectives pairs with
// theirs for this bucket (Note [Allocation failure], runtime/allreduce_pipeline.h, as for a
// fusion buffer that cannot grow). Returns `s`; does nothing when it is OK.
inline absl::Status FailBeforeCollectives(transport::Communicator& comm, absl::Status s) {
  if (!s.ok()) comm.Abort(s);
  return s;
}

// One fact about a tensor's state that every rank holds alike after every step (PowerSGD's
// matrix shape and its Q; the length of an error-feedback residual, whose values differ by
// rank). Ranks that restored checkpoints disagreeing on one are told before a step runs
// (CompressionStage::Summarize, state_summary.h).
struct SharedStateField {
  std::string tensor;
  std::string field;       // e.g. "residual length", "Q"
  uint64_t value = 0;      // the value itself, or a StableHash of it (state_io.h)
  bool hashed = false;     // `value` is a hash: messages say "differs" instead of printing it
};

class Compressor {
 public:
  virtual ~Compressor() = default;

  // Canonical spec, e.g. "fp4:ef=1" (registry.h: options that differ from their defaults).
  virtual const std::string& spec() const = 0;

  // Whether Reduce takes tensors of `dtype` as they are. The others reach it as float32,
  // converted by the runtime (once in, once out). Default: float32 only.
  virtual bool TakesNatively(DataType dtype) const { return dtype == DataType::kFloat32; }
  // Whether Reduce honours TensorView::input (reads its values from there and writes the
  // result to `data`), which saves the runtime a copy when the result goes elsewhere.
  virtual bool ReadsSeparateInput() const { return false; }
  // Whether Reduce honours TensorView::output (reads `input`, writes the result to `output`,
  // may use `data` as scratch), which saves the runtime both copies of a scattered bucket.
  virtual bool WritesSeparateOutput() const { return false; }

  // Reduces `tensors` (one bucket: the same names, shapes, dtypes and order on every rank) in
  // place: afterwards every rank holds bit-identical values approximating the sum (kSum) or
  // mean (kAverage) over ranks (none: exactly ctx.op's reduction). Errors: the communicator's (Unavailable,
  // DeadlineExceeded, Cancelled); then the tensors' contents are unspecified.
  virtual absl::Status Reduce(absl::Span<const TensorView> tensors,
                              transport::Communicator& comm, StepContext& ctx) = 0;

  // Forgets the per-tensor state of `name` (e.g. when its shape changed).
  virtual void Reset(absl::string_view name) {}

  // Checkpointing. SaveState appends the per-tensor state this compressor keeps across steps
  // (error-feedback residuals, PowerSGD's Q, ...), copied to the host from its device, to
  // `out` in the method's own versioned format (documented with the method), so that
  // LoadState into a fresh compressor of the same spec continues bit-identically. Methods
  // that keep no state append nothing. Errors: a device's, copying; then `out` is unchanged.
  virtual absl::Status SaveState(std::string* out) const { return absl::OkStatus(); }
  // Replaces every tensor's state by `state` (what SaveState wrote), in host memory until a
  // step moves it to its tensor's device. InvalidArgument when it
  // is malformed or not this method's (refused by its declared sizes before anything is
  // allocated for them); then the state is unchanged. The default accepts only an empty state.
  virtual absl::Status LoadState(absl::string_view state) {
    if (state.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError("compression '" + spec() +
                                      "' keeps no state, but a non-empty one was given");
  }
  // Appends what every rank must hold alike of each tensor's state (SharedStateField).
  virtual void DescribeSharedState(std::vector<SharedStateField>* out) const {}
};

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_COMPRESSOR_H_
