// The CUDA implementation of the device interface (Note [Devices], device/device.h): one
// Device per GPU, its memory work queued on the caller's stream (cudaMemcpyAsync and the
// kernels of device_kernels.h), its events CUDA events polled against a deadline (never
// cudaStreamSynchronize, which has none).
//
// Note [Unverified CUDA]
//   No user runs GPU code that no GPU has run: until scripts/gpu_check.sh has passed on a GPU
//   machine (recorded in BENCHMARKS.md with its commit, and kCudaVerifiedCommit below set to
//   it), the CUDA devices are refused (FailedPrecondition, saying so) unless the user opts in
//   with BRAID_CUDA_UNVERIFIED=1. A build without CUDA has no CUDA device at all.
#ifndef BRAID_DEVICE_CUDA_CUDA_DEVICE_H_
#define BRAID_DEVICE_CUDA_CUDA_DEVICE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "device/device.h"

namespace braid::device {

// The commit whose scripts/gpu_check.sh last passed on a GPU ("" while none has).
inline constexpr char kCudaVerifiedCommit[] = "";

// GPU `id` of this process's CUDA driver (created on first use, never destroyed). Errors,
// each naming the device: FailedPrecondition when CUDA is unverified and not opted into
// (`allow_unverified`: BRAID_CUDA_UNVERIFIED=1), or when no CUDA driver or GPU can be used;
// InvalidArgument for an id past the GPUs there are.
absl::StatusOr<Device*> CudaDevice(int32_t id, bool allow_unverified);

}  // namespace braid::device

#endif  // BRAID_DEVICE_CUDA_CUDA_DEVICE_H_
