// The one execution path of all-reduces: every bucket, compressed or not, fused or not, goes
// pack -> Compressor::Reduce -> unpack (none is a Compressor like the others).
//
// Note [One pipeline]
//   Plan    the compression stage says, per tensor, which dtype its compressor takes (its
//           own when the compressor takes it natively, else float32; float32 in a warm-up
//           step) and whether the compressor reads its input out of place
//           (compression/stage.h, Note [Bucket reduction]).
//   Pack    a lone tensor whose dtype stays is reduced where its result goes: in its output,
//           read out of place from its input where the compressor can (none), else copied
//           there first. So is a bucket that lies contiguously already (Note [In place]).
//           Every other bucket is packed into the fusion buffer, one grow-only
//           allocation reused by every bucket: copied as it is, or converted to float32, so
//           each tensor is converted at most once each way (an fp16 tensor under fp16
//           compression not at all: the cast compressor takes it natively). A joined
//           rank's tensor (Note [Join]) is always packed, as the op's identity.
//   Reduce  Compressor::Reduce over the views, through the stage (warm-up, step counts).
//   Unpack  copies (or converts back) each result into its output; then the bucket's bytes
//           go to the statistics ledger.
//
// Note [In place]
//   A bucket of several tensors skips the fusion buffer when it is that buffer already: no
//   tensor is converted (each keeps its dtype) or joined, each output starts where the
//   previous one's ends (in bucket order, from an address aligned to the element size), and
//   either every tensor is in place (input == output) or the compressor reads out of place
//   (TensorPlan::separate_input), the inputs lie back to back in the same way and the two
//   spans do not overlap. Compressor::Reduce then runs over the outputs themselves: the same
//   bytes in the same order as the packed buffer would hold, so the same bits, without the
//   copy in and the copy out. The views lie as in the packed buffer (one span, the same
//   offsets), so the compressor runs the same collectives whichever layout a rank's tensors
//   have: ranks whose buckets lie differently work together. Gradients allocated as views
//   into one flat buffer in the order they are submitted (the PyTorch binding's
//   gradient_as_bucket_view) are such buckets, since buckets are runs of consecutive
//   tensors (Note [Consecutive buckets], control/fusion.h). Any other bucket (one tensor
//   out of line) is packed: the check costs one pass over the tensors' pointers.
// A bucket is described by plain values (no coordinator types), so whatever agrees on it
// can run it.
#ifndef BRAID_RUNTIME_ALLREDUCE_PIPELINE_H_
#define BRAID_RUNTIME_ALLREDUCE_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "compression/compressor.h"
#include "compression/stage.h"
#include "runtime/statistics.h"
#include "runtime/timeline.h"
#include "transport/communicator.h"

namespace braid {

// One tensor of an all-reduce bucket: where its values are and where its result goes.
struct AllReduceTensor {
  absl::string_view name;
  absl::Span<const int64_t> shape;
  const void* input = nullptr;  // NumElements(shape) elements of the bucket's dtype
  void* output = nullptr;       // the same size; may equal input
  // Note [Join]: a tensor of a rank that has joined: no input or output; the pack step
  // fills its place in the fusion buffer with the op's identity (zeros for sum and average)
  // and its result is dropped.
  bool joined = false;
};

// The fusion buffer: 64-byte aligned, grown (at least doubling) when a bucket needs more and
// never shrunk, so the steady state allocates nothing (a fresh allocation costs a page fault
// per 4 KiB when it is first written). Its contents do not survive a growth.
class FusionBuffer {
 public:
  // At least `bytes` bytes.
  char* Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }
  const char* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data_;
  size_t capacity_ = 0;
};

class AllReducePipeline {
 public:
  // Both outlive the pipeline.
  AllReducePipeline(compression::CompressionStage* stage, StatisticsLedger* ledger)
      : stage_(stage), ledger_(ledger) {}

  // Where the next Runs record their phases; null (the default): nowhere. The caller keeps
  // it alive while it is set.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

  // Reduces one bucket: `tensors` of `dtype`, all-reduced with `op` under `method`, in the
  // order every rank uses. On success every output holds the result and the bucket's bytes
  // are booked; on error the outputs' contents are unspecified. Errors: the stage's, the
  // compressor's, the communicator's. Background thread only.
  absl::Status Run(int64_t bucket_id, const compression::CompressionMethod& method,
                   DataType dtype, ReduceOp op, absl::Span<const AllReduceTensor> tensors,
                   transport::Communicator& comm);

  const FusionBuffer& buffer() const { return buffer_; }

 private:
  absl::StatusOr<absl::Span<const compression::TensorView>> Pack(
      absl::Span<const compression::TensorPlan> plans);
  // Note [In place]: true when the bucket lies contiguously, its views then set up over it.
  bool ViewInPlace(absl::Span<const compression::TensorPlan> plans);
  void Unpack();
  void Book(const compression::CompressionMethod& method, int world_size);
  // Begins (or ends) `phase` on every tensor's timeline row.
  void Phase(const char* phase, bool begin, const std::string& args = "");

  compression::CompressionStage* stage_;
  StatisticsLedger* ledger_;
  Timeline* timeline_ = nullptr;
  FusionBuffer buffer_;
  // The bucket being run.
  DataType dtype_ = DataType::kFloat32;
  ReduceOp op_ = ReduceOp::kSum;
  absl::Span<const AllReduceTensor> tensors_;
  bool packed_ = false;  // the views lie in the fusion buffer (else: where the tensors lie)
  size_t packed_bytes_ = 0;  // written into the fusion buffer by Pack
  bool reducing_ = false;  // packed, the collectives started
  // Scratch, reused across buckets.
  std::vector<compression::BucketTensor> bucket_;
  std::vector<compression::TensorView> views_;
  std::vector<size_t> offsets_;
  std::vector<compression::TensorBytes> bytes_;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_ALLREDUCE_PIPELINE_H_
