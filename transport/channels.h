// Control and data apart over one point-to-point layer.
//
// Note [Channels]
// A rank's runtime talks to its peers for two reasons: to move tensors (the data plane) and
// to coordinate (the fast path's votes, an all-to-all's split exchange, barriers: a few
// bytes each). They go over two communicators, each with its own collective sequence, so a
// second data plane (device memory) can come without the coordinating traffic having to
// follow it, and so neither channel's sequence numbers depend on the other's traffic. Both
// share the one point-to-point layer (one UCX worker and its endpoints): the tag's sequence
// field gives its top bit to the channel (Note [Tag layout], transport/tag.h), so a receive
// of one channel never matches a message of the other and DropStray of one never drops the
// other's messages. Each channel keeps 2^15 sequence numbers in flight, far more than the
// window of collectives a rank can run ahead of a peer (tag.h). Aborting either channel
// aborts the layer under both: a failed peer is failed for both.
#ifndef BRAID_TRANSPORT_CHANNELS_H_
#define BRAID_TRANSPORT_CHANNELS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "transport/communicator.h"
#include "transport/context.h"
#include "transport/p2p.h"

namespace braid::transport {

struct Channels {
  std::unique_ptr<Communicator> data;     // tensors
  std::unique_ptr<Communicator> control;  // votes, split exchanges, barriers
  // The world's channels only: the channels of a process set (Note [Process sets] in
  // control/process_sets.h) over the same point-to-point layer, `ranks` (ascending, this
  // rank among them) numbered 0..n-1, with tags in the set's own space `slot` (1 to
  // 2^kTagSetBits - 1: Note [Tag layout]). Null for channels made otherwise.
  std::function<Channels(uint32_t slot, const std::vector<int>& ranks)> subset;
};

// The two point-to-point views of Note [Channels] over `p2p`: `data` and `control`, sharing
// it (it lives as long as either view).
struct PointToPointChannels {
  std::unique_ptr<PointToPoint> data;
  std::unique_ptr<PointToPoint> control;
};
PointToPointChannels SplitPointToPoint(std::unique_ptr<PointToPoint> p2p);

// The two channels of Note [Channels] over `p2p`, each a CollectiveCommunicator with
// `options`. Both must be used by one thread at a time (the runtime's braid-loop); Abort from
// any thread.
Channels SplitChannels(std::unique_ptr<PointToPoint> p2p, const CollectiveOptions& options);

// The in-process world of CreateLocalCommunicators (local_communicator.h), split so.
std::vector<Channels> CreateLocalChannels(int size, const CollectiveOptions& options = {});

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_CHANNELS_H_
