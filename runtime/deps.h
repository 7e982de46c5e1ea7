// The runtime's injectable parts (Note [Injected parts]): what tests and the composition root
// (runtime/lifecycle.cc) see, kept out of runtime.h so the public API shows no coordinator
// or proto types.
#ifndef BRAID_RUNTIME_DEPS_H_
#define BRAID_RUNTIME_DEPS_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "control/coordinator_client.h"
#include "device/device.h"
#include "proto/braid.pb.h"
#include "runtime/data_plane.h"
#include "runtime/device_planes.h"
#include "runtime/runtime.h"

namespace braid {

// What the runtime asks of the coordinator client it is given.
struct CoordinatorClientSetup {
  // Adds this rank's report (its per-method byte counters) to each heartbeat, as
  // coordinator::ClientOptions::fill_heartbeat. Thread-safe and cheap.
  std::function<void(proto::HeartbeatRequest*)> fill_heartbeat;
  // Each heartbeat's answer, as coordinator::ClientOptions::on_heartbeat_response.
  std::function<void(const proto::HeartbeatResponse&)> on_heartbeat_response;
};
using CoordinatorClientFactory =
    std::function<absl::StatusOr<std::unique_ptr<CoordinatorClient>>(
        const CoordinatorClientSetup&)>;

// Note [Injected parts]: the runtime's two dependencies, its coordinator client and its data
// plane, are replaceable, so its queue, fusion, compression pipeline, handles and error paths
// run in one process with several ranks as threads (tests/unit/runtime_*_test.cc: the
// in-process coordinator of coordinator/local_coordinator.h and the in-process communicators
// of transport/local_communicator.h). Unset parts are the real ones.
struct RuntimeDeps {
  // Makes this rank's coordinator client; unset: the gRPC client of config.coordinator,
  // with the coordinator hosted in this process on rank 0 when that is empty.
  CoordinatorClientFactory coordinator;
  // Opened before registration, connected after; unset: UCX.
  std::unique_ptr<DataPlane> data_plane;
  // Note [Devices] (device/device.h): the devices tensors may be on; unset: the host and,
  // in a build with CUDA, the GPUs (MakeDefaultDevices).
  std::shared_ptr<const device::DeviceRegistry> devices;
  // Note [GPU data planes] (runtime/device_planes.h): NCCL for the NCCL data plane; unset:
  // this build's (device::DefaultNccl). Tests give the NCCL test double.
  NcclProvider nccl;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_DEPS_H_
