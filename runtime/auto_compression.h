// Note [Auto compression]: compression `auto` (BRAID_COMPRESSION=auto, braidrun
// --compression auto, or a call's or a plan's compression) lets braid choose the method from
// the link and the step it measures, and re-choose when they move.
//
// The ladder (AutoLadder), least lossy first: none, fp16, fp4:ef=1, powersgd:rank=4,
// scalecomp (ratio 100). One method of it is in force for the job at a time; the coordinator
// chooses it and changes it through the settings-change mechanism (TunedSettings.compression,
// Note [Settings changes] in step_settings.h), so every rank switches at the same step
// boundary, never inside a step. Until the first choice `auto` reduces as none.
//
// Per bucket: a bucket of `auto` tensors runs with the method in force unless that method
// does not pay on it, by the per-layer plans' defaults (Note [Compression plans]): fewer than
// $min_elements (1024) elements, or an estimated rate (EstimatedRate, summed over its
// tensors) below $min_compression_rate (2): then it goes uncompressed. The bucket's tensors,
// shapes, dtype and op are the same on every rank, so every rank decides alike.
//
// Measured per step on each rank (TuningSample): the `auto` buckets' dense bytes, the data
// plane's wall time for them, and for each ladder method the bytes this rank would send for
// them (the per-bucket rule applied). The coordinator (coordinator/compression_choice.h)
// derives, over a window of steps:
//   link rate   = bytes sent under the method in force / the data plane's time for them;
//   computation = the step's wall time less that data-plane time: what the step costs
//                 outside the reduction of its `auto` buckets;
//   step(m)     = computation + the bytes m would send / link rate;
// and chooses the least lossy method whose step(m) is within 25% of the shortest step(m) of
// the ladder: a lossier method has to shorten the step by more than that to be chosen. A
// method whose reduction is small against the computation is thus kept (on a fast link,
// none), and on a slow one the least lossy method that comes near the shortest step.
// step(m) assumes that no reduction overlaps the computation, which is what a network whose
// gradients come at the end of backward shows (BENCHMARKS.md, section 31). Where reductions
// do overlap, the computation is underestimated by the overlap and the choice errs toward
// compressing. It re-chooses when the link rate or the computation of a later window moves
// by more than 25% from the figures of the choice in force, which the first window under a
// newly chosen method gives (a link measured under another method is not comparable). The
// estimate counts bytes on the wire, not the methods' own encoding time (PowerSGD's
// products, the sparsifiers' selection).
//
// Stateful methods keep their state per method: a tensor that leaves fp4:ef=1 leaves its
// error-feedback residual behind, and finds it again (stale) if it comes back.
#ifndef BRAID_RUNTIME_AUTO_COMPRESSION_H_
#define BRAID_RUNTIME_AUTO_COMPRESSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "compression/stage.h"
#include "control/tuned_settings.h"
#include "proto/braid.pb.h"
#include "runtime/allreduce_pipeline.h"

namespace braid {

// The rank's side of Note [Auto compression]. braid-loop only.
class AutoCompression {
 public:
  // `stage` resolves the ladder's methods and outlives this.
  explicit AutoCompression(compression::CompressionStage* stage);

  // The method a bucket of `auto` tensors runs with now (the per-bucket rule applied); books
  // its dense bytes and what each ladder method would send for it.
  absl::StatusOr<const compression::CompressionMethod*> ForBucket(
      absl::Span<const AllReduceTensor> tensors, DataType dtype, ReduceOp op);
  // The bucket ForBucket was asked for last has been reduced: books the data plane's wall
  // time for it, from that call.
  void Ran() { micros_ += absl::ToInt64Microseconds(absl::Now() - started_); }
  // At a step boundary: the step's figures into `sample` (false when no `auto` bucket ran
  // in it, and `sample` is left alone), then zeroed.
  bool TakeStep(proto::TuningSample* sample);
  // The method in force from now on: one of AutoLadder(); "" keeps none.
  absl::Status Apply(const std::string& spec);
  const std::string& chosen() const { return chosen_spec_; }

 private:
  compression::CompressionStage* stage_;
  std::vector<compression::CompressionSpec> ladder_;
  const compression::CompressionMethod* chosen_;
  std::string chosen_spec_ = "none";
  int64_t bytes_ = 0;
  int64_t micros_ = 0;
  absl::Time started_;
  std::vector<int64_t> wire_;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_AUTO_COMPRESSION_H_
