// The compression stage's seam: a Compressor reduces one bucket of tensors across
// the ranks of a Communicator, choosing its own collectives — compress, communicate,
// decompress. Every algorithm plugs in here:
//   fp16 / bf16: one all-reduce of the cast bucket;
//   fp4 / int4:  an all-to-all of quantized shards, a local float32 sum, an all-gather of the
//                re-quantized shards (one collective each for the whole bucket);
//   PowerSGD:    two all-reduces (P, then Q) of small matrices per bucket, P/Q kept per tensor;
//   ScaleComp:   a broadcast of the leader's indices, then an all-reduce of the k values.
//
// A Compressor is created per canonical spec string (see registry.h) and keeps per-tensor
// state (error-feedback residuals, PowerSGD factors, ...) keyed by tensor name, so state
// persists across steps. It belongs to the runtime's background thread: not thread-safe.
#ifndef BRAID_COMPRESSION_COMPRESSOR_H_
#define BRAID_COMPRESSION_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "transport/communicator.h"

namespace braid::compression {

// One tensor of a bucket as the stage sees it: float32, contiguous, reduced in place. The
// runtime converts float16 / bfloat16 / float64 tensors to a float32 work buffer first.
struct TensorView {
  absl::string_view name;
  absl::Span<const int64_t> shape;  // the tensor's shape (PowerSGD views it as a matrix)
  float* data = nullptr;            // NumElements(shape) elements
  size_t count = 0;
};

// What one Reduce call needs besides the data, identical on every rank except `rank`.
struct StepContext {
  ReduceOp op = ReduceOp::kAverage;  // kSum or kAverage (the only ops compression supports)
  // Per-rank reproducible randomness: stochastic rounding seeds derive from
  // (seed, rank, tensor name, step). Set from BRAID_SEED.
  uint64_t seed = 0;
  // Per tensor, in the order of `tensors`: how many compressed reductions of that tensor this
  // compressor ran before (the same on every rank). Seeds and schedules derive from it.
  absl::Span<const int64_t> steps;
  // Filled by Reduce: bytes of the compressed representation this rank contributed for each
  // tensor (payload bytes: see stage.h), in the order of `tensors`.
  absl::Span<uint64_t> payload_bytes;
};

class Compressor {
 public:
  virtual ~Compressor() = default;

  // Canonical spec, e.g. "fp4:chunk=128,ef=0" (every option spelled out).
  virtual const std::string& spec() const = 0;

  // Reduces `tensors` (one bucket: the same names, shapes and order on every rank) in place:
  // afterwards every rank holds bit-identical values approximating the sum (kSum) or mean
  // (kAverage) over ranks. Errors: the communicator's (Unavailable,
  // DeadlineExceeded, Cancelled); then the tensors' contents are unspecified.
  virtual absl::Status Reduce(absl::Span<const TensorView> tensors,
                              transport::Communicator& comm, StepContext& ctx) = 0;

  // Forgets the per-tensor state of `name` (e.g. when its shape changed).
  virtual void Reset(absl::string_view name) {}

  // Checkpointing. SaveState appends the per-tensor state this compressor keeps across steps
  // (residuals, PowerSGD's Q, ...) to `out` in the method's own versioned format (documented
  // with the method), so that LoadState into a fresh compressor of the same spec continues
  // bit-identically. Methods that keep no state, or cannot save it yet, append nothing.
  virtual absl::Status SaveState(std::string* out) const { return absl::OkStatus(); }
  // Replaces every tensor's state by `state` (what SaveState wrote). InvalidArgument when it
  // is malformed or not this method's; then the state is unchanged. The default accepts only
  // an empty state.
  virtual absl::Status LoadState(absl::string_view state) {
    if (state.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError("compression '" + spec() +
                                      "' keeps no state, but a non-empty one was given");
  }
};

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_COMPRESSOR_H_
