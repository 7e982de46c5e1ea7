// A Communicator over any point-to-point backend: checks the arguments, picks the algorithm of
// transport/collectives.h by message size and world size, keeps the statistics (Note
// [Transport statistics]) and the first error. The UCX and in-process backends both hand
// their PointToPoint to it, so they run exactly the same algorithms.
//
// Algorithm choice:
//   AllReduce      recursive doubling below options.ring_threshold_bytes (or with fewer
//                  elements than ranks); above, a pipelined reduce-scatter + ring all-gather
//                  whose reduce-scatter is direct up to options.direct_max_ranks ranks (the
//                  canonical order: results independent of fusion) and a ring above
//   ReduceScatter  direct up to options.direct_max_ranks ranks, ring above
//   AllGather      pipelined ring          Broadcast   binomial tree
//   AllToAll       direct                  Barrier     dissemination
#ifndef BRAID_TRANSPORT_COLLECTIVE_COMMUNICATOR_H_
#define BRAID_TRANSPORT_COLLECTIVE_COMMUNICATOR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "transport/communicator.h"
#include "transport/context.h"
#include "transport/p2p.h"

namespace braid::transport {

class CollectiveCommunicator final : public Communicator {
 public:
  // `kernels`: nullptr for host memory (HostKernels()).
  CollectiveCommunicator(std::unique_ptr<PointToPoint> p2p, CollectiveOptions options,
                         const Kernels* kernels = nullptr);

  int rank() const override { return ctx_.rank(); }
  int size() const override { return ctx_.size(); }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override;
  // Note [Gathered all-reduce] (transport/gather.h): the pipelined algorithms copy each piece
  // in and out as the transfer reaches it; recursive doubling copies in, reduces, copies out.
  absl::Status AllReduceGathered(absl::Span<const GatheredPiece> pieces, void* scratch,
                                 size_t count, DataType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* send, void* recv, absl::Span<const size_t> recv_counts,
                             DataType dtype, ReduceOp op) override;
  absl::Status AllGather(const void* send, size_t send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes) override;
  absl::Status AllToAll(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                        absl::Span<const size_t> recv_bytes) override;
  absl::Status Broadcast(void* buf, size_t bytes, int root) override;
  absl::Status Barrier() override;
  void Abort(absl::Status reason) override { ctx_.p2p().Abort(std::move(reason)); }
  void Interrupt(absl::Status reason) override { ctx_.p2p().Interrupt(std::move(reason)); }
  TransportStats stats() const override { return stats_; }
  void SetPipeline(size_t chunk_bytes, int ring_window) override {
    ctx_.SetPipeline(chunk_bytes, ring_window);
  }
  std::pair<size_t, int> pipeline() const override {
    return {ctx_.options().chunk_bytes, ctx_.options().ring_window};
  }
  std::string Describe() const override { return ctx_.p2p().Describe(); }
  absl::Status RunCollective(const std::function<absl::Status(Context&)>& body) override;

 private:
  // Runs one collective: fails at once when poisoned; on success adds the messages it
  // completed to stats_ and counts it; on failure poisons the communicator.
  absl::Status Run(absl::FunctionRef<absl::Status()> body);

  Context ctx_;
  TransportStats stats_;
  absl::Status sticky_;  // the first failure
};

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_COLLECTIVE_COMMUNICATOR_H_
