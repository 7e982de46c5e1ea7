// NCCL, opened at run time (nccl_library.cc), behind braid's NCCL interface.
#ifndef BRAID_DEVICE_CUDA_NCCL_LIBRARY_H_
#define BRAID_DEVICE_CUDA_NCCL_LIBRARY_H_

#include "absl/status/statusor.h"
#include "transport/nccl_api.h"

namespace braid::device {

// The library, opened once (every later call gets the first's result; never closed).
// FailedPrecondition saying which libraries were tried and why each failed when none is
// NCCL 2.14 or newer.
absl::StatusOr<transport::NcclApi*> OpenNccl();

}  // namespace braid::device

#endif  // BRAID_DEVICE_CUDA_NCCL_LIBRARY_H_
