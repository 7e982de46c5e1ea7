// The devices and the NCCL of this build (device.h: MakeDefaultDevices; nccl.h: DefaultNccl).
// Its own file: the only one of braid_device compiled differently with CUDA (BRAID_WITH_CUDA).
#include "device/device.h"
#include "device/nccl.h"

#if defined(BRAID_WITH_CUDA)
#include "device/cuda/cuda_device.h"
#endif

namespace braid::device {

std::shared_ptr<DeviceRegistry> MakeDefaultDevices(bool allow_unverified_cuda) {
  auto registry = std::make_shared<DeviceRegistry>();
#if defined(BRAID_WITH_CUDA)
  registry->Add(DeviceType::kCUDA, [allow_unverified_cuda](int32_t id) {
    return CudaDevice(id, allow_unverified_cuda);
  });
#else
  (void)allow_unverified_cuda;
#endif
  return registry;
}

#if !defined(BRAID_WITH_CUDA)
// With CUDA: device/cuda/nccl_library.cc.
absl::StatusOr<transport::NcclApi*> DefaultNccl() {
  return absl::FailedPreconditionError("this braid is built without CUDA, so without NCCL");
}
#endif

}  // namespace braid::device
