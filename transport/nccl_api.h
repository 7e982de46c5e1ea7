// The few NCCL calls braid's NCCL data plane makes (transport/nccl_communicator.h), as an
// interface: the real one opens libnccl at run time (device/cuda/nccl_library.h, CUDA builds),
// and CPU tests drive the plane's logic through a test double over host memory and the
// in-process transport (tests/testing/fake_nccl.h), with injected asynchronous errors and
// hangs. A seam for unit tests of that logic only: a feature test of the NCCL plane runs the
// real library (scripts/gpu_check.sh).
//
// Note [Nonblocking NCCL]
//   Communicators are created nonblocking (ncclConfig_t::blocking = 0), so no NCCL call can
//   block braid's thread without a deadline: a call may return kInProgress, after which the
//   caller polls CommState until it is no longer kInProgress before the next call on that
//   communicator (NCCL's rule). Work queued on a stream completes asynchronously; an error of
//   that work (a peer gone: ncclRemoteError; a system or internal error) is reported by
//   CommState. After an error the communicator is only good for CommAbort.
#ifndef BRAID_TRANSPORT_NCCL_API_H_
#define BRAID_TRANSPORT_NCCL_API_H_

#include <array>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace braid::transport {

// ncclUniqueId: 128 opaque bytes made by rank 0's GetUniqueId and handed to every rank (the
// runtime broadcasts them over its control channel: Note [GPU data planes],
// runtime/device_planes.h).
struct NcclUniqueId {
  static constexpr size_t kBytes = 128;
  std::array<char, kBytes> bytes{};
};

// What a call or CommState says: done (ok), still in progress (Note [Nonblocking NCCL]).
enum class NcclProgress { kDone, kInProgress };

class NcclApi {
 public:
  using Comm = void*;    // ncclComm_t
  using Stream = void*;  // cudaStream_t
  using Event = void*;   // cudaEvent_t

  virtual ~NcclApi() = default;

  // "nccl 2.28.9" and the like.
  virtual std::string Version() = 0;
  // Errors below: the library's result as a Status (Internal for its internal and system
  // errors, Unavailable for ncclRemoteError, InvalidArgument for its argument and usage
  // errors), with NCCL's own message.
  virtual absl::StatusOr<NcclUniqueId> GetUniqueId() = 0;
  // Starts creating rank `rank` of `nranks` on GPU `cuda_device` (nonblocking); *comm is
  // usable for CommState and CommAbort at once, and for the rest once CommState says kDone.
  virtual absl::StatusOr<NcclProgress> CommInitRank(Comm* comm, int nranks,
                                                    const NcclUniqueId& id, int rank,
                                                    int cuda_device) = 0;
  virtual absl::StatusOr<NcclProgress> CommState(Comm comm) = 0;  // ncclCommGetAsyncError
  // Ends the communicator at once, whatever it is doing (its queued work fails or is
  // dropped), without waiting for its peers: braid ends every communicator this way, so a
  // peer that is gone never holds up a shutdown. `comm` is invalid afterwards.
  virtual void CommAbort(Comm comm) = 0;

  // Collectives queued on `stream`: counts are elements of `dtype`; `bytes` are bytes.
  virtual absl::StatusOr<NcclProgress> AllReduce(const void* send, void* recv, size_t count,
                                                 DataType dtype, ReduceOp op, Comm comm,
                                                 Stream stream) = 0;
  // `recv` receives this rank's `recv_count` elements of the reduction of `send` (size x
  // recv_count elements).
  virtual absl::StatusOr<NcclProgress> ReduceScatter(const void* send, void* recv,
                                                     size_t recv_count, DataType dtype,
                                                     ReduceOp op, Comm comm, Stream stream) = 0;
  // `recv` (size x bytes) receives every rank's `bytes` bytes of `send` in rank order.
  virtual absl::StatusOr<NcclProgress> AllGather(const void* send, void* recv, size_t bytes,
                                                 Comm comm, Stream stream) = 0;
  // `recv` of every rank receives `bytes` bytes of `root`'s `send`.
  virtual absl::StatusOr<NcclProgress> Broadcast(const void* send, void* recv, size_t bytes,
                                                 int root, Comm comm, Stream stream) = 0;
  // `recv` of `root` receives the reduction of every rank's `send` (`count` elements).
  virtual absl::StatusOr<NcclProgress> Reduce(const void* send, void* recv, size_t count,
                                              DataType dtype, ReduceOp op, int root, Comm comm,
                                              Stream stream) = 0;
  // Point to point, inside a group (GroupStart ... GroupEnd) only.
  virtual absl::StatusOr<NcclProgress> Send(const void* send, size_t bytes, int peer, Comm comm,
                                            Stream stream) = 0;
  virtual absl::StatusOr<NcclProgress> Recv(void* recv, size_t bytes, int peer, Comm comm,
                                            Stream stream) = 0;
  virtual absl::Status GroupStart() = 0;
  virtual absl::StatusOr<NcclProgress> GroupEnd() = 0;

  // The stream's side: an event after the work queued on `stream` so far; whether it is done
  // (an error of that work is the stream's: Internal); freeing it.
  virtual absl::StatusOr<Event> RecordEvent(Stream stream) = 0;
  virtual absl::StatusOr<bool> EventDone(Event event) = 0;
  virtual void DestroyEvent(Event event) = 0;
};

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_NCCL_API_H_
