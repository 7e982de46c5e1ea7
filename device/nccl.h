// NCCL for the NCCL data plane (transport/nccl_communicator.h), where this build has it: in a
// build with CUDA, device/cuda/nccl_library.cc; else default_devices.cc says there is none.
#ifndef BRAID_DEVICE_NCCL_H_
#define BRAID_DEVICE_NCCL_H_

#include "absl/status/statusor.h"
#include "transport/nccl_api.h"

namespace braid::device {

// This build's NCCL: in a build with CUDA, the library opened at run time (libnccl.so.2);
// FailedPrecondition saying why when there is none (a build without CUDA; the library not
// found, or older than 2.14). Thread-safe; the library is opened once, on the first call,
// and every later call gets that call's result.
absl::StatusOr<transport::NcclApi*> DefaultNccl();

}  // namespace braid::device

#endif  // BRAID_DEVICE_NCCL_H_
