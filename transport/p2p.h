// The point-to-point layer: tagged, non-blocking sends and receives of byte buffers between
// the ranks of one group, with a blocking wait that honours a deadline and can be aborted
// from another thread. It plays the part of gloo's Pair: the collective algorithms
// (transport/collectives.h) are written once over it, and each backend implements only this:
// UCX for host memory (transport/ucx_communicator.h), an in-process one for tests
// (transport/local_communicator.h), and later NCCL for device memory.
//
// Threading: a PointToPoint belongs to one thread, the one that calls the collectives; only
// Abort() may be called from another.
#ifndef BRAID_TRANSPORT_P2P_H_
#define BRAID_TRANSPORT_P2P_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/tag.h"

namespace braid::transport {

// One posted send or receive. The caller owns it (it may move it); the backend keeps its own
// state behind `handle`. A request is pending from a successful Post until Test reports it
// complete or failed, or Cancel releases it.
struct Request {
  void* handle = nullptr;  // the backend's; meaningful only while pending
  bool pending = false;
  bool is_recv = false;
  int peer = -1;
  size_t bytes = 0;
};

class PointToPoint {
 public:
  virtual ~PointToPoint() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Posts a send of `bytes` bytes at `buf` to rank `peer` (!= rank()) under `tag`. `buf` must
  // stay valid and unchanged until the request completes or is cancelled. The request may be
  // complete on return (req->pending false). Errors: Unavailable (peer lost), Internal.
  virtual absl::Status PostSend(int peer, Tag tag, const void* buf, size_t bytes,
                                Request* req) = 0;

  // Posts a receive of exactly `bytes` bytes into `buf` of the message from `peer` with `tag`.
  // A message of another length fails the request with Internal when tested.
  virtual absl::Status PostRecv(int peer, Tag tag, void* buf, size_t bytes, Request* req) = 0;

  // Without blocking: true once `req` completed (it is then released), false while it is
  // pending. A request that failed is released and its error returned: Unavailable (peer
  // lost), Internal (a message of the wrong length: ranks called different collectives or
  // sizes). Testing a request that is not pending returns true.
  virtual absl::StatusOr<bool> Test(Request* req) = 0;

  // Cancels and releases every pending request of `reqs` (after a failure). Returns within a
  // bounded time even when peers are gone.
  virtual void Cancel(absl::Span<Request> reqs) = 0;

  // Makes progress, then blocks until something may have completed or `until` passes,
  // whichever is first; may return early. `idle_since` is when the caller last saw one of its
  // requests complete: a backend that busy-polls before it blocks (UCX does when its ranks
  // do not outnumber the cores) counts its budget from there, not from this call, so a
  // stream of events that completes nothing does not keep it spinning. Returns the reason
  // given to Abort() once there is one, or Unavailable when a peer that a pending request
  // involves is lost (a peer that finished its part and left is no failure of this rank's).
  virtual absl::Status Wait(absl::Time idle_since, absl::Time until) = 0;

  // The reason given to Abort(), without waiting; OK until then.
  virtual absl::Status Health() = 0;

  // Thread-safe. Makes the owning thread's Wait (now or later) return `reason`, waking it.
  // The first reason sticks.
  virtual void Abort(absl::Status reason) = 0;

  // Thread-safe. Like Abort, but for this view of a shared layer only (a channel of Note
  // [Channels], transport/channels.h): its Wait returns `reason` from now on, while the
  // layer's other views go on. A layer that is no view aborts itself.
  virtual void Interrupt(absl::Status reason) { Abort(std::move(reason)); }

  // Thread-safe. Makes the owning thread's Wait (now or soon) return early, with no error.
  virtual void Wake() {}

  // The job's rank of this layer's rank `r` (a process set's view numbers its members from
  // 0: Note [Channels]), for messages that name ranks.
  virtual int JobRank(int r) const { return r; }

  // Human-readable description of the transports in use.
  virtual std::string Describe() const = 0;

  // Called once the collective that drew sequence number `seq` completed on this rank: every
  // message of it addressed to this rank has then been received, so a message still queued
  // under that sequence number came from no rank of this group (a forged or stray tag, Note
  // [Who may join] in coordinator/admission.h). Drops such messages, at most `limit`, and
  // returns how many. A backend whose messages come only from its group drops none.
  virtual uint64_t DropStray(uint32_t seq, uint64_t limit) { return 0; }
};

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_P2P_H_
