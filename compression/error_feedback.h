// Error feedback (residual memory), shared by every lossy compressor.
//
// Seide et al. 2014 ("1-bit SGD"), Karimireddy et al. 2019 ("Error Feedback Fixes SignSGD"):
// what compression dropped this step is added back next step. Per tensor e (same length):
//   p      = g + e_old                       (Apply: in place on the gradient)
//   sent   = decompress(compress(p))
//   e_new  = (1 - beta)·e_old + beta·(p - sent)    (Update)
// beta = 1 is classic error feedback (sent + e_new == p, element for element). beta < 1 is
// ScaleCom's low-pass filtered memory (Chen et al., NeurIPS 2020, eq. 4), which damps the
// residual of noisy, sparse selections.
//
// The residuals live on the device of their tensors (Note [Compression state on the
// device], state_array.h): Place puts them there before a step.
#ifndef BRAID_COMPRESSION_ERROR_FEEDBACK_H_
#define BRAID_COMPRESSION_ERROR_FEEDBACK_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "compression/compressor.h"
#include "compression/state_array.h"
#include "device/device.h"

namespace braid::compression {

class ErrorFeedback {
 public:
  explicit ErrorFeedback(float beta = 1.0f) : beta_(beta) {}

  // Makes the residual of every tensor of `tensors` (name, count) a residual of `count`
  // elements on `device`, which the next calls use: created as zeros at a tensor's first
  // step, reset to zeros (with a warning) when its count changed, moved there when it lives
  // on another device (a loaded checkpoint's, in host memory). Errors: the devices'
  // (ResourceExhausted, ...); then the residuals placed so far stay where they went.
  absl::Status Place(device::Device& device, absl::Span<const TensorView> tensors);

  // g[i] += e_old[i] for the residual of `name` (host code: on a host-accessible device).
  // A residual that Place did not prepare is created, or reset, as Place would, on the
  // device of the last Place (the host before any), and a failure to allocate it is fatal,
  // as a std::vector's.
  void Apply(absl::string_view name, float* g, size_t count);

  // e = (1 - beta)·e + beta·(p - sent), where p is what Apply produced and `sent` what the
  // other ranks will see of it. Where p - sent is NaN or infinite (a non-finite gradient),
  // e becomes 0 instead, so one overflowing step does not poison later ones.
  void Update(absl::string_view name, const float* p, const float* sent, size_t count);

  // A host copy of the residual of `name` (empty if none): for tests and statistics.
  std::vector<float> residual(absl::string_view name) const;

  // The `count` values of the residual of `name` to read and write (host code), created or
  // reset as Apply does: for compressors that fuse Apply and Update into their own loops
  // (the sparsifiers, sparse.h), keeping this recurrence element for element.
  float* MutableResidual(absl::string_view name, size_t count) {
    return Slot(name, count).data();
  }

  void Reset(absl::string_view name);
  float beta() const { return beta_; }

  // Checkpoints (Compressor::SaveState of fp4/int4 with ef=1, scalecomp, topk, randomk): every
  // residual, copied to the host, in this format (integers little-endian):
  //   "EFBK" (4 bytes), version u32 = 1, tensor count u32, then per tensor, by name:
  //     name (u64 length + bytes), residual (u64 count + float32 values).
  // Errors: a device's, copying a residual to the host.
  absl::Status Save(std::string* out) const;
  // Replaces every residual by those of `state` (Save's format), in host memory until Place
  // moves them. InvalidArgument naming `what` (e.g. "compression 'fp4:ef=1'") and the field,
  // with nothing changed, when it is malformed, names a tensor twice or holds a non-finite
  // value (Update never keeps one).
  absl::Status Load(absl::string_view state, absl::string_view what);
  // Per tensor its "residual length" (SharedStateField: the values differ by rank, their
  // number does not).
  void Describe(std::vector<SharedStateField>* out) const;

 private:
  // The residual of `name` with `count` elements on device_ (created or reset there).
  absl::StatusOr<StateArray*> Prepare(absl::string_view name, size_t count);
  StateArray& Slot(absl::string_view name, size_t count);

  float beta_;
  device::Device* device_ = &device::HostDevice();  // of the last Place
  std::map<std::string, StateArray, std::less<>> residuals_;
};

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_ERROR_FEEDBACK_H_
