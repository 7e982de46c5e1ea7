// The NCCL data plane: a Communicator (transport/communicator.h) whose buffers are in GPU
// memory, every collective an NCCL call queued on braid's stream.
//
// Note [NCCL watchdog]
//   NCCL reports failures asynchronously: a lost peer surfaces as ncclRemoteError from
//   ncclCommGetAsyncError, or as a kernel that never completes. Every call here queues its
//   work, records an event after it and then waits on braid's background thread (never on
//   the framework's stream), polling three things until one answers: the event (done: the
//   call succeeds), the communicator's asynchronous state (an error: the call fails with it,
//   Unavailable for a remote error, Internal otherwise), and Abort (another thread's reason:
//   the call fails with it). A call not done within NcclOptions::timeout fails with
//   DeadlineExceeded. In every failure the communicator is aborted (ncclCommAbort), which
//   ends its queued work, so the GPU is not left spinning on a collective whose peer is
//   gone, and it is poisoned: every later call fails with the first error at once, as every
//   Communicator's. That this rank's abort reaches its peers is NCCL's (their connections to
//   it close: ncclRemoteError there); braid's coordinator also spreads the failure to every
//   rank (docs/failures.md). Creating the communicator is watched the same way (Note
//   [Nonblocking NCCL], transport/nccl_api.h): a rank that never joins fails every other
//   rank's creation within the timeout.
//
// What differs from the host data plane (CollectiveCommunicator): NCCL chooses its own
// algorithm (ring or tree) and so its reduction order, so a tensor's result may depend on
// the bucket it was fused into (every rank still gets the same bits); an average is NCCL's
// (ncclAvg); the statistics count the bytes a ring would move (NCCL does not say what it
// moved); RunCollective is not supported (no point-to-point layer of braid's underneath).
#ifndef BRAID_TRANSPORT_NCCL_COMMUNICATOR_H_
#define BRAID_TRANSPORT_NCCL_COMMUNICATOR_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "transport/communicator.h"
#include "transport/nccl_api.h"

namespace braid::transport {

struct NcclOptions {
  // A collective, or the communicator's creation, not done by then fails with
  // DeadlineExceeded and aborts the communicator (the runtime passes BRAID_TIMEOUT_S).
  absl::Duration timeout = absl::Seconds(60);
  // How often the waiting thread polls (Note [NCCL watchdog]).
  absl::Duration poll_interval = absl::Microseconds(100);
  // Polled while the communicator is created: a non-OK status (the caller aborting, e.g. at
  // shutdown) ends the creation with it, the communicator aborted. Unset: never.
  std::function<absl::Status()> abort_reason;
};

// Rank `rank` of `size` of the NCCL communicator `id` (made by rank 0's GetUniqueId), its
// work queued on `stream` of `device` (which allocates Barrier's one word and copies
// AllReduceGathered's pieces). Waits at most options.timeout for every rank to join, or until
// options.abort_reason says stop. Errors: the library's (transport/nccl_api.h),
// DeadlineExceeded naming the ranks' count when the creation does not finish in time,
// abort_reason's; the communicator is aborted in each case. `api` and `device`
// outlive the communicator.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(NcclApi& api, const NcclUniqueId& id,
                                                          int rank, int size,
                                                          NcclApi::Stream stream,
                                                          device::Device& device,
                                                          NcclOptions options = {});

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_NCCL_COMMUNICATOR_H_
