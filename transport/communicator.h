// The data plane's seam: every collective braid runs goes through a Communicator.
//
// A Communicator belongs to one thread (the runtime's background thread): its collective
// methods are not thread-safe and must be called in the same order on every rank. Only
// Abort() may be called from another thread. Every call honours the communicator's progress
// timeout (no progress for that long fails the call with DeadlineExceeded) and fails with
// Unavailable, never hangs, when a peer is lost. After any failure the communicator is
// poisoned: every later call returns the first error at once.
#ifndef BRAID_TRANSPORT_COMMUNICATOR_H_
#define BRAID_TRANSPORT_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace braid::transport {

// Transport bytes (DESIGN.md): what this rank actually put on the data plane. Never mixed
// with payload bytes, which the compression stage counts.
struct TransportStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t collectives = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = op over ranks of send[i], for `count` elements of `dtype`. In place when
  // send == recv. kAverage divides the sum by size() (floating-point dtypes only, else
  // InvalidArgument). Every rank receives bit-identical results.
  virtual absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                                 ReduceOp op) = 0;

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

  virtual TransportStats stats() const = 0;

  // Human-readable description of the transports in use, e.g. "ucx tag(sysv/memory cma/memory)".
  virtual std::string Describe() const = 0;
};

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_COMMUNICATOR_H_
