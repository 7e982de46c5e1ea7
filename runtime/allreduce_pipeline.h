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
//           A scattered bucket whose compressor writes separate outputs (none) skips
//           both copies here instead (Note [Pipelined copy]).
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
//
// Note [Pipelined copy]
//   A bucket that must be packed (its tensors lie scattered) is not copied into the fusion
//   buffer here when every tensor keeps its dtype, none is joined, the compressor writes
//   separate outputs (TensorPlan::separate_output: none, and warm-up steps) and no tensor's
//   output overlaps another's input or output. Each view then points at its place in the
//   fusion buffer (`data`, scratch), its input and its output, and the compressor's gathered
//   all-reduce copies each pipeline piece in and out as the transfer reaches it (Note
//   [Gathered all-reduce], transport/gather.h): the same bits as the packed bucket, the
//   copies overlapped with the transfer. The bucket still counts as packed (its bytes pass
//   through the fusion buffer); its timeline has no MEMCPY phases, the copies being inside
//   ALLREDUCE. BRAID_PIPELINED_COPY=0 packs and unpacks as three passes instead.
//
// Note [Allocation failure]
//   A rank that cannot grow its fusion buffer fails the bucket with ResourceExhausted naming
//   it (its id, its first tensors, the bytes asked), before any collective of the bucket
//   started here, and aborts its communicator with that error. Its peers are in the
//   bucket's collectives already and wait for it until the data plane's timeout; if this
//   rank went on, its next collective would pair with theirs for this bucket (collectives
//   pair by their order alone, transport/tag.h), so every later collective of this rank
//   fails with the same error instead: the job ends with the reason, never with a wrong
//   result.
//
// Note [Host staging]
//   A bucket on a device whose memory the host cannot read (a GPU's) is packed on the device
//   as any scattered bucket is (always packed, a lone tensor too: one span to move), copied
//   to the host's fusion buffer, reduced there by the compressor over the host data plane
//   (UCX) as a host bucket would be, copied back to the device's fusion buffer and unpacked
//   on the device: the host-staged plane. It needs no device data plane, so it runs where
//   NCCL cannot (several ranks on one GPU), and gives the same bits as the same bucket in
//   host memory, every method alike, since the same host code compresses and reduces it.
//   Its compression state (error feedback, PowerSGD's factors) lives in host memory. The
//   copies are the bucket's whole packed bytes each way, in the device's stream order, the
//   host waiting for the copy in before the compressor starts and for the unpack before the
//   handle completes; the timeline shows them as MEMCPY_DEVICE_TO_HOST and
//   MEMCPY_HOST_TO_DEVICE. (Compressing on the device first, so that only the payload
//   crosses to the host, is the next step: docs/gpu.md.)
//
// A bucket is described by plain values (no coordinator types), so whatever agrees on it
// can run it. Run passes what it learns about a bucket (its plans, its views, where they
// lie) from step to step in a BucketRun of its own: nothing of one bucket is left in the
// pipeline for the next but the fusion buffer and reused scratch space.
#ifndef BRAID_RUNTIME_ALLREDUCE_PIPELINE_H_
#define BRAID_RUNTIME_ALLREDUCE_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "compression/compressor.h"
#include "compression/stage.h"
#include "device/device.h"
#include "runtime/statistics.h"
#include "runtime/timeline.h"
#include "transport/communicator.h"

namespace braid {

// One tensor of an all-reduce bucket: where its values are and where its result goes.
struct AllReduceTensor {
  absl::string_view name;
  absl::Span<const int64_t> shape;
  const void* input = nullptr;  // ShapeElements(shape) elements of the bucket's dtype
  void* output = nullptr;       // the same size; may equal input
  // Note [Join]: a tensor of a rank that has joined: no input or output; the pack step
  // fills its place in the fusion buffer with the op's identity (zeros for sum and average)
  // and its result is dropped.
  bool joined = false;
  // The plan pattern its compression came from, as its bytes are booked (Note [Compression
  // groups], control/compression_groups.h); "" when none did, and for a joined tensor.
  absl::string_view pattern = "";
};

// The fusion buffer of one device: 64-byte aligned, grown (at least doubling) when a bucket
// needs more and never shrunk, so the steady state allocates nothing (a fresh allocation
// costs a page fault per 4 KiB when it is first written). Its contents do not survive a
// growth.
class FusionBuffer {
 public:
  // `device` (null: the host) outlives the buffer; its memory is allocated there.
  explicit FusionBuffer(device::Device* device = nullptr);
  // At least `bytes` bytes. ResourceExhausted, saying how many bytes it asked for (and the
  // device, when not the host), when they cannot be allocated; the buffer then stays as it
  // was.
  absl::StatusOr<char*> Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }
  char* data() const { return static_cast<char*>(data_.data()); }

 private:
  device::Device* device_;
  device::DeviceMemory data_;
  size_t capacity_ = 0;
};

// Where a bucket's tensors are (Note [Devices], device/device.h) and the stream braid's work
// on them is queued on.
struct BucketPlace {
  device::Device* device = nullptr;  // null: host memory
  device::Stream stream = nullptr;
  // The longest wait for the device's work to finish before the compressor reads it.
  absl::Duration timeout = absl::Seconds(60);
  // The bucket's communicator carries the device's memory itself (the NCCL plane, Note [GPU
  // data planes], runtime/device_planes.h): a bucket the host cannot read is not staged.
  bool device_plane = false;
};

class AllReducePipeline {
 public:
  // Both outlive the pipeline.
  AllReducePipeline(compression::CompressionStage* stage, StatisticsLedger* ledger)
      : stage_(stage), ledger_(ledger) {}

  // Reduces one bucket: `tensors` of `dtype`, all-reduced with `op` under `method`, in the
  // order every rank uses; its phases go to `timeline` (null: nowhere). The tensors are on
  // `place`'s device, whose interface does every copy, conversion, fill and allocation of
  // the pipeline (Note [Devices]); the compressor then reads the memory from the host, where
  // a bucket of a device the host cannot read is staged (Note [Host staging]). On
  // success every output holds the result and the bucket's bytes are booked; on error the
  // outputs' contents are unspecified. Errors: the stage's, the compressor's, the communicator's;
  // InvalidArgument naming the tensor for a shape ShapeElements refuses (common/limits.h);
  // ResourceExhausted naming the bucket when the fusion buffer cannot grow (Note
  // [Allocation failure]: `comm` is aborted with it, as with any other error of the device
  // before the collectives).
  // Background thread only.
  absl::Status Run(int64_t bucket_id, const compression::CompressionMethod& method,
                   DataType dtype, ReduceOp op, absl::Span<const AllReduceTensor> tensors,
                   transport::Communicator& comm, Timeline* timeline = nullptr,
                   const BucketPlace& place = {});

  // The fusion buffer of `device` (null: the host); an empty one until a bucket used it.
  const FusionBuffer& buffer(device::Device* device = nullptr) const;

  // Note [Pipelined copy]: on by default; off, every scattered bucket is packed and unpacked
  // as three passes. A rank's own choice: the result and the messages are the same.
  void set_pipelined_copy(bool on) { pipelined_copy_ = on; }

 private:
  struct BucketRun;

  // Describes the bucket to the stage (the tensors' checked element counts).
  absl::Status Describe(BucketRun& run);
  // Plan, pack and reduce (Note [One pipeline]).
  absl::Status Reduce(BucketRun& run, transport::Communicator& comm);
  // Lays out the views as planned: in place, or packed into the fusion buffer.
  absl::Status Pack(BucketRun& run, absl::Span<const compression::TensorPlan> plans);
  // A lone tensor whose dtype stays is reduced in its output (Note [One pipeline]): its view
  // set up there, its input copied in first unless the compressor reads it out of place.
  absl::Status ViewLone(BucketRun& run, const compression::TensorPlan& plan);
  // Note [In place]: true when the bucket lies contiguously, its views then set up over it.
  bool ViewInPlace(BucketRun& run, absl::Span<const compression::TensorPlan> plans);
  // Note [Pipelined copy]: true when the bucket may be gathered rather than packed, its
  // views then set up over the fusion buffer at `base` (offsets_) as scratch.
  bool ViewGathered(BucketRun& run, absl::Span<const compression::TensorPlan> plans,
                    char* base);
  // The error of a fusion buffer that could not grow to `bytes` (Note [Allocation failure]).
  static absl::Status CannotPack(const BucketRun& run, size_t bytes, const absl::Status& s);
  absl::Status Unpack(const BucketRun& run);
  // Note [Host staging]: queues the copy of the packed bucket into the host's fusion buffer.
  absl::Status StageToHost(BucketRun& run);
  // Points the views at their offsets from `base` (the staged copy, or the device's buffer).
  void Rebase(BucketRun& run, char* base);
  // The fusion buffer of the bucket's device (made on first use).
  FusionBuffer& BufferOf(device::Device* device);
  void Book(const BucketRun& run, int world_size);
  // Begins (or ends) `phase` on every tensor's timeline row.
  static void Phase(const BucketRun& run, const char* phase, bool begin,
                    const std::string& args = "");

  compression::CompressionStage* stage_;
  StatisticsLedger* ledger_;
  std::map<device::Device*, FusionBuffer> buffers_;  // one per device
  bool pipelined_copy_ = true;
  // Scratch, reused across buckets so the steady state allocates nothing; what a bucket
  // keeps in them it reaches through its BucketRun.
  std::vector<compression::BucketTensor> bucket_;
  std::vector<compression::TensorView> views_;
  std::vector<size_t> offsets_;
  std::vector<compression::TensorBytes> bytes_;
  std::vector<std::pair<uintptr_t, uintptr_t>> spans_;  // Gatherable's [begin, end)s
};

}  // namespace braid

#endif  // BRAID_RUNTIME_ALLREDUCE_PIPELINE_H_
