// The in-process backend: a world of ranks inside one process, each rank played by its own
// thread, messages moved through in-memory queues. It runs the very algorithms the UCX
// backend runs (through CollectiveCommunicator), so they, and code above the Communicator,
// can be unit-tested in one process for any world size, with deadlines and Abort.
//
// Semantics, as close to UCX's as matters to the algorithms: a receive matches the message
// with the same source and Tag (transport/tag.h); a send completes only once its receive has
// copied it (rendezvous), so an algorithm that reuses a send buffer too early reads wrong
// data here too; a message of another length than its receive fails the receive with
// Internal; when a rank's endpoint is destroyed, the pending requests of every other rank
// that involve it fail with Unavailable, as a lost peer does over UCX.
#ifndef BRAID_TRANSPORT_LOCAL_COMMUNICATOR_H_
#define BRAID_TRANSPORT_LOCAL_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "transport/communicator.h"
#include "transport/context.h"
#include "transport/p2p.h"

namespace braid::transport {

// The `size` (>= 1) point-to-point endpoints of one in-process world; endpoint r is rank r
// and belongs to the thread that plays it. They may be destroyed in any order.
std::vector<std::unique_ptr<PointToPoint>> CreateLocalPointToPoints(int size);

// The same world with a CollectiveCommunicator on each endpoint.
std::vector<std::unique_ptr<Communicator>> CreateLocalCommunicators(
    int size, const CollectiveOptions& options = {});

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_LOCAL_COMMUNICATOR_H_
