// Note [Compression state on the device]
//   A compressor's state across steps (error-feedback residuals, PowerSGD's Q) lives in the
//   memory of the device its tensor lives on, as the gradients do: a StateArray is a float32
//   array allocated through that device (device/device.h). The compressor places each
//   tensor's arrays on the bucket's device before it reduces (StepContext::device): created
//   there as zeros, or moved there (through the host) when they live elsewhere, e.g. a
//   loaded checkpoint's, which arrives in host memory. Checkpoints (compression_state())
//   copy the arrays to the host and back through the same device interface.
//
//   The compressors' arithmetic is host code today: it reads and writes the arrays directly,
//   which the stage allows only for devices whose memory the host can read (the host, the
//   host-backed test device); a GPU's buckets are refused before they reach a compressor
//   until braid's GPU data plane runs the CUDA kernels (compression/cuda) on them.
#ifndef BRAID_COMPRESSION_STATE_ARRAY_H_
#define BRAID_COMPRESSION_STATE_ARRAY_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "device/device.h"

namespace braid::compression {

// How long a copy of state between a device and the host may take before it fails
// (DeadlineExceeded): state arrays are at most a model's size, copied at memory bandwidth.
inline constexpr absl::Duration kStateCopyTimeout = absl::Seconds(60);

// `size()` float32 values in one device's memory (Note [Compression state on the device]).
// Movable, not copyable; empty arrays allocate nothing. Not thread-safe.
class StateArray {
 public:
  StateArray() = default;
  StateArray(StateArray&& other) noexcept { *this = std::move(other); }
  StateArray& operator=(StateArray&& other) noexcept {
    device_ = std::exchange(other.device_, nullptr);
    memory_ = std::move(other.memory_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  // `count` zeros on `device`. Errors: the device's (ResourceExhausted when it has not the
  // memory).
  static absl::StatusOr<StateArray> Zeros(device::Device& device, size_t count);
  // A copy of `values` (host memory) on `device`. Errors: the device's.
  static absl::StatusOr<StateArray> FromHost(device::Device& device,
                                             absl::Span<const float> values);

  // The values, in the memory of device() (host code may touch them only when the device is
  // host_accessible()). Null when empty.
  float* data() const { return static_cast<float*>(memory_.data()); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The device the values are on; null for a default-constructed array.
  device::Device* device() const { return device_; }

  // A host copy of the values, through the device. Errors: the device's (DeadlineExceeded
  // after kStateCopyTimeout).
  absl::StatusOr<std::vector<float>> ToHost() const;
  // Moves the values onto `device` (through the host when it is another device); nothing
  // when they are there already. Errors: the devices'; then the array is unchanged.
  absl::Status MoveTo(device::Device& device);
  // Makes this `count` values on `device`, as a compressor places a tensor's state before a
  // step: the values it holds, moved there (true), when it holds `count` of them; else
  // `count` zeros (false). Errors: the devices'; then the array is unchanged.
  absl::StatusOr<bool> PlaceOn(device::Device& device, size_t count);

 private:
  device::Device* device_ = nullptr;
  device::DeviceMemory memory_;
  size_t size_ = 0;
};

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_STATE_ARRAY_H_
