// How a rank joins the data plane, in two phases around its registration (Note [Peers at
// registration], runtime/registration.h): Open before registering, so this rank's address
// travels in its RegisterRequest; Connect once the coordinator has returned every rank's.
// The runtime uses UCX (MakeUcxDataPlane); tests inject an in-process world
// (transport/local_communicator.h) through RuntimeDeps (runtime/runtime.h).
#ifndef BRAID_RUNTIME_DATA_PLANE_H_
#define BRAID_RUNTIME_DATA_PLANE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/config.h"
#include "transport/channels.h"
#include "transport/communicator.h"
#include "transport/ucx_communicator.h"

namespace braid {

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  // Phase 1: opens this rank's endpoint (`launch` holds the rank and size when a launcher
  // set them, else -1 / 0) and returns what peers need to reach and watch it.
  virtual absl::StatusOr<transport::PeerAddress> Open(const LaunchInfo& launch) = 0;
  // Phase 2: connects to every peer. peers[r] is rank r's address as the coordinator returned
  // them, `rank` this rank's place as it assigned it. Called once, after Open. Returns the
  // data channel (tensors) and the control channel (votes, split exchanges, barriers) over
  // the same endpoints (Note [Channels], transport/channels.h).
  virtual absl::StatusOr<transport::Channels> Connect(
      int rank, std::vector<transport::PeerAddress> peers) = 0;
};

// UCX (transport/ucx_communicator.h: OpenUcxWorker, then ConnectUcx), with the timeouts and
// peer error handling of `config` and the tags keyed by `job_secret` (Note [Who may join]:
// KeyedDataPlaneTags, runtime/registration.h). Errors: Internal (UCX), InvalidArgument (the
// peers do not include this rank's worker).
std::unique_ptr<DataPlane> MakeUcxDataPlane(const RuntimeConfig& config,
                                            const std::string& job_secret);

}  // namespace braid

#endif  // BRAID_RUNTIME_DATA_PLANE_H_
