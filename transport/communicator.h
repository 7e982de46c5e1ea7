// The data plane's seam: every collective braid runs goes through a Communicator.
//
// A Communicator belongs to one thread (the runtime's background thread): its collective
// methods are not thread-safe and must be called in the same order on every rank. Only
// Abort() may be called from another thread. Every call honours the communicator's progress
// timeout (no progress for that long fails the call with DeadlineExceeded) and fails with
// Unavailable, never hangs, when a peer is lost. After any failure the communicator is
// poisoned: every later call returns the first error at once (a call rejected for bad
// arguments, InvalidArgument on this rank alone, does not poison it).
//
// Implementations: CollectiveCommunicator (transport/collective_communicator.h) runs the
// algorithms of transport/collectives.h over any point-to-point backend; UCX
// (transport/ucx_communicator.h) and in-process (transport/local_communicator.h) make one.
#ifndef BRAID_TRANSPORT_COMMUNICATOR_H_
#define BRAID_TRANSPORT_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace braid::transport {

class Context;

// Note [Transport statistics]
// Transport bytes: what this rank actually put on the data plane, which depends on the
// algorithm (a ring all-reduce sends 2(n-1)/n of the buffer). Never mixed with payload bytes,
// which the compression stage counts. Everything is counted once, when a collective call
// returns OK, and only then; a call that fails (or is rejected) adds nothing:
//   bytes_sent        payload bytes of the point-to-point messages this rank sent in those
//                     calls (local copies, e.g. a rank's own block of an all-gather, are not
//                     messages; neither are a backend's headers or acknowledgements)
//   bytes_received    the same for the messages it received
//   messages_sent     messages sent, zero-byte ones (a barrier's) included
//   messages_received messages received
//   collectives       successful collective calls of every kind, on a world of one too
//   stray_messages_dropped  messages that no rank of the group sent (forged or stray tags),
//                     dropped once their sequence number's collective completed here
//                     (PointToPoint::DropStray); not counted as received
// Summed over ranks, bytes_sent equals bytes_received and messages_sent messages_received.
struct TransportStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t collectives = 0;
  uint64_t stray_messages_dropped = 0;
  // Adds `o`'s counters: the traffic of several communicators of one rank as one.
  TransportStats& operator+=(const TransportStats& o) {
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    messages_sent += o.messages_sent;
    messages_received += o.messages_received;
    collectives += o.collectives;
    stray_messages_dropped += o.stray_messages_dropped;
    return *this;
  }
};

// One piece of a gathered all-reduce (Communicator::AllReduceGathered, Note [Gathered
// all-reduce] in transport/gather.h): `bytes` bytes of the buffer read from `input`, their
// result written to `output` (equal to `input` for a piece reduced in place).
struct GatheredPiece {
  const void* input = nullptr;
  void* output = nullptr;
  size_t bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = op over ranks of send[i], for `count` elements of `dtype`. In place when
  // send == recv. kAverage divides the sum by size() (floating-point dtypes only, else
  // InvalidArgument). Every rank receives bit-identical results, and each element's result
  // does not depend on its position, on `count` or on the algorithm chosen, so a tensor
  // reduces to the same bits fused with others or alone (Note [Canonical reduction order] in
  // transport/canonical_reduce.h); CollectiveCommunicator gives up the last property above
  // CollectiveOptions::direct_max_ranks ranks, where its reduce-scatter becomes a ring.
  virtual absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                                 ReduceOp op) = 0;

  // AllReduce of the `count` elements of `dtype` that `pieces` hold back to back, in their
  // order (their bytes sum to count * DataTypeSize(dtype)), each piece's result going to its
  // `output`; `scratch` (count elements, 64-byte aligned) is where the buffer is gathered
  // and reduced, its contents unspecified afterwards. The same bits as AllReduce of the
  // gathered buffer, and the same collectives on the wire, so ranks may gather or not as
  // they like. An output may equal its own input but must not overlap any other piece's
  // input or output (the copy out of one piece may precede the copy in of the next).
  // InvalidArgument when the pieces' bytes do not add up. Errors otherwise as AllReduce's;
  // on error the outputs' contents are unspecified. This implementation copies every piece
  // in, all-reduces `scratch` in place and copies every piece out (host memory);
  // CollectiveCommunicator overlaps the copies with the transfer instead.
  virtual absl::Status AllReduceGathered(absl::Span<const GatheredPiece> pieces, void* scratch,
                                         size_t count, DataType dtype, ReduceOp op);

  // `send` holds sum(recv_counts) elements; rank r receives into `recv` the reduction of
  // elements [sum(recv_counts[0..r)), +recv_counts[r]). recv_counts.size() == size().
  virtual absl::Status ReduceScatter(const void* send, void* recv,
                                     absl::Span<const size_t> recv_counts, DataType dtype,
                                     ReduceOp op) = 0;

  // Rank r contributes `send_bytes` bytes; `recv` receives every rank's block back to back
  // in rank order, block r being recv_bytes[r] bytes (recv_bytes[rank()] == send_bytes).
  virtual absl::Status AllGather(const void* send, size_t send_bytes, void* recv,
                                 absl::Span<const size_t> recv_bytes) = 0;

  // `send` holds size() blocks back to back, block p (send_bytes[p] bytes) going to rank p;
  // `recv` receives size() blocks, block p (recv_bytes[p] bytes) coming from rank p.
  virtual absl::Status AllToAll(const void* send, absl::Span<const size_t> send_bytes,
                                void* recv, absl::Span<const size_t> recv_bytes) = 0;

  // Copies `bytes` bytes of `buf` on rank `root` into `buf` on every other rank.
  virtual absl::Status Broadcast(void* buf, size_t bytes, int root) = 0;

  // Returns once every rank has entered Barrier().
  virtual absl::Status Barrier() = 0;

  // Thread-safe. Fails the collective in flight (and every later one) with `reason`,
  // waking the owning thread if it is blocked. The coordinator uses it when a rank is lost.
  virtual void Abort(absl::Status reason) = 0;

  // Thread-safe. Fails the collective in flight on this communicator (and every later one)
  // with `reason`, leaving the other communicators over the same point-to-point layer (Note
  // [Channels], transport/channels.h) running. By default, Abort.
  virtual void Interrupt(absl::Status reason) { Abort(std::move(reason)); }

  // Note [Transport statistics].
  virtual TransportStats stats() const = 0;

  // The pipeline piece and window of later collectives (CollectiveOptions::chunk_bytes and
  // ring_window, transport/context.h); chunk_bytes 0 keeps the current piece. Every rank must
  // change them at the same point of its sequence of collectives (the runtime does it at a
  // step boundary: Note [Settings changes] in runtime/step_settings.h), on the thread that
  // runs them, between two of them. A communicator without a pipeline ignores it.
  virtual void SetPipeline(size_t chunk_bytes, int ring_window) {}
  // The pipeline piece and window in force: {0, 0} without a pipeline.
  virtual std::pair<size_t, int> pipeline() const { return {0, 0}; }

  // Runs `body` as one collective on the point-to-point layer under this communicator, for
  // algorithms composed outside transport/ from those of transport/collectives.h (e.g. a
  // broadcast of indices then an all-reduce of values): called on every rank in the same
  // order like any collective, counted as one in stats(), and a failure poisons the
  // communicator. Unimplemented for a communicator without a point-to-point layer.
  virtual absl::Status RunCollective(const std::function<absl::Status(Context&)>& body) {
    return absl::UnimplementedError("this communicator has no point-to-point layer");
  }

  // Human-readable description of the transports in use, e.g. "ucx tag(sysv/memory cma/memory)".
  virtual std::string Describe() const = 0;
};

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_COMMUNICATOR_H_
