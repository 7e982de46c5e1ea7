// What the collective algorithms (transport/collectives.h) run on: a point-to-point group,
// the algorithm settings, the element-wise kernels for the memory the backend moves, a
// sequence number for tags, reusable scratch buffers, and the one progress loop with its
// deadline. After gloo's Context, which its algorithms take the same way.
#ifndef BRAID_TRANSPORT_CONTEXT_H_
#define BRAID_TRANSPORT_CONTEXT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/limits.h"
#include "transport/communicator.h"
#include "transport/p2p.h"

namespace braid::transport {

// Settings of the algorithms and of the progress loop, the same for every backend.
struct CollectiveOptions {
  // A collective in which no message completes for this long fails with DeadlineExceeded
  // (the runtime passes BRAID_TIMEOUT_S).
  absl::Duration timeout = absl::Seconds(60);
  // All-reduces of at least this many bytes use a reduce-scatter + all-gather; smaller ones
  // recursive doubling (ChooseAllReduceAlgorithm in transport/ring_schedule.h).
  size_t ring_threshold_bytes = 256 * 1024;
  // Pipeline piece of the reduce-scatter / all-gather, and how many pieces are in flight.
  size_t chunk_bytes = kDefaultRingChunkBytes;
  int ring_window = 4;
  // Reduce-scatters (alone or in an all-reduce) are direct, in the canonical reduction order,
  // up to this many ranks, and ring (constant fan-in, order depends on the position) above
  // (ChooseReduceScatterAlgorithm in transport/ring_schedule.h).
  int direct_max_ranks = 16;
};

// Element-wise operations on the memory the backend moves. Host memory by default; a device
// backend (NCCL) supplies kernels and allocations of its own, and the algorithms stay as they
// are.
class Kernels {
 public:
  virtual ~Kernels() = default;
  // out[i] = a[i] op b[i] for i < count; `out` may equal `a` or `b` (transport/reduce.h).
  virtual void Reduce(void* out, const void* a, const void* b, size_t count, DataType dtype,
                      ReduceOp op) const = 0;
  // buf[i] /= divisor (floating-point dtypes): an average from a sum.
  virtual void Divide(void* buf, size_t count, DataType dtype, int divisor) const = 0;
  // float16 / bfloat16 <-> float32 (Note [16-bit arithmetic] in canonical_reduce.h):
  // dst[i] = src[i] / divisor widened, and dst[i] = src[i] rounded to nearest even.
  virtual void Widen(float* dst, const void* src, size_t count, DataType dtype,
                     int divisor) const = 0;
  virtual void Narrow(void* dst, const float* src, size_t count, DataType dtype) const = 0;
  // memmove semantics.
  virtual void Copy(void* dst, const void* src, size_t bytes) const = 0;
  // Zero-filled (so its pages are touched once, when allocated), aligned to 64 bytes.
  virtual void* Allocate(size_t bytes) const = 0;
  virtual void Free(void* p) const = 0;
};

// Kernels for host memory (transport/reduce.h, memmove, calloc).
const Kernels& HostKernels();

class Context {
 public:
  // `kernels` must outlive the context; nullptr means HostKernels().
  Context(std::unique_ptr<PointToPoint> p2p, CollectiveOptions options,
          const Kernels* kernels = nullptr);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CollectiveOptions& options() const { return options_; }
  // Communicator::SetPipeline: between collectives, on the thread that runs them.
  void SetPipeline(size_t chunk_bytes, int ring_window) {
    if (chunk_bytes > 0) options_.chunk_bytes = chunk_bytes;
    if (ring_window > 0) options_.ring_window = ring_window;
  }
  const Kernels& kernels() const { return *kernels_; }
  PointToPoint& p2p() { return *p2p_; }
  const PointToPoint& p2p() const { return *p2p_; }

  // A fresh sequence number for one collective's tags (Note [Tag layout]). Every rank calls
  // the same collectives in the same order, so every rank draws the same numbers.
  uint32_t NextSeq() { return seq_++; }
  // The sequence number the next NextSeq() will return.
  uint32_t next_seq() const { return seq_; }

  // PointToPoint::PostSend / PostRecv, counting a message that completes at once.
  absl::Status Send(int peer, Tag tag, const void* buf, size_t bytes, Request* req);
  absl::Status Recv(int peer, Tag tag, void* buf, size_t bytes, Request* req);
  // PointToPoint::Test, counting the message when it completes.
  absl::StatusOr<bool> Test(Request* req);
  // True once every request of `reqs` completed.
  absl::StatusOr<bool> TestAll(absl::Span<Request> reqs);
  // Waits for every request of `reqs`; on failure cancels those still pending.
  absl::Status WaitAll(absl::Span<Request> reqs);
  // PointToPoint::Cancel, for requests posted through Send / Recv.
  void Cancel(absl::Span<Request> reqs);

  // The progress loop: calls `step` until it returns true, blocking in PointToPoint::Wait
  // whenever a call found no message completed. `step` tests requests and advances the
  // algorithm. Fails with DeadlineExceeded when no message completes for options().timeout,
  // or with the group's error (Abort's reason, a lost peer) or step's. The DeadlineExceeded
  // names the peers this rank was still waiting on (a receive from, a send to).
  absl::Status Drive(absl::FunctionRef<absl::StatusOr<bool>()> step);

  // Grow-only buffers from kernels().Allocate: `Scratch` stages received pieces, `Work`
  // holds partial sums. Valid until the next call of the same function; sizes are checked
  // by the Communicator (collective_communicator.cc), so they never overflow.
  char* Scratch(size_t bytes) { return scratch_.Get(*kernels_, bytes); }
  char* Work(size_t bytes) { return work_.Get(*kernels_, bytes); }
  // A third such buffer: the float32 copies and blocks of 16-bit arithmetic.
  float* Wide(size_t elements) {
    return reinterpret_cast<float*>(wide_.Get(*kernels_, elements * sizeof(float)));
  }

  // Messages (and their bytes) this rank completed since the context was made, whatever
  // became of their collectives. The Communicator turns these into TransportStats.
  const TransportStats& completed() const { return completed_; }

 private:
  struct Buffer {
    char* data = nullptr;
    size_t bytes = 0;
    char* Get(const Kernels& k, size_t want);
  };
  void Count(const Request& r);
  // Books a request posted (+1) or released (-1) in pending_recvs_ / pending_sends_.
  void Track(const Request& r, int delta);
  // "; waiting for a message from rank 1 and the delivery of a message to ranks 2, 3": the
  // peers of the requests still pending, for the deadline's error; empty when none.
  std::string WaitingOn() const;

  std::unique_ptr<PointToPoint> p2p_;
  CollectiveOptions options_;
  const Kernels* kernels_;
  int rank_;
  int size_;
  uint32_t seq_ = 0;
  uint64_t completions_ = 0;  // messages completed: the progress the deadline watches
  TransportStats completed_;
  // Per peer, the requests posted through Send / Recv and not yet completed or cancelled.
  std::vector<int> pending_recvs_;
  std::vector<int> pending_sends_;
  Buffer scratch_;
  Buffer work_;
  Buffer wide_;
};

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_CONTEXT_H_
