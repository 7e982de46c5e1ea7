// A communicator that passes every call to another, for tests that change one behaviour of a
// rank's real data channel (stall an all-reduce, record pipeline changes) and override only
// that. Header-only.
#ifndef BRAID_TESTS_TESTING_DELEGATING_COMMUNICATOR_H_
#define BRAID_TESTS_TESTING_DELEGATING_COMMUNICATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "transport/communicator.h"

namespace braid::testing {

class DelegatingCommunicator : public transport::Communicator {
 public:
  explicit DelegatingCommunicator(std::unique_ptr<transport::Communicator> inner)
      : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduce(const void* s, void* r, size_t n, DataType d, ReduceOp op) override {
    return inner_->AllReduce(s, r, n, d, op);
  }
  absl::Status AllReduceGathered(absl::Span<const transport::GatheredPiece> pieces,
                                 void* scratch, size_t n, DataType d, ReduceOp op) override {
    return inner_->AllReduceGathered(pieces, scratch, n, d, op);
  }
  absl::Status ReduceScatter(const void* s, void* r, absl::Span<const size_t> counts,
                             DataType d, ReduceOp op) override {
    return inner_->ReduceScatter(s, r, counts, d, op);
  }
  absl::Status AllGather(const void* s, size_t n, void* r,
                         absl::Span<const size_t> recv_bytes) override {
    return inner_->AllGather(s, n, r, recv_bytes);
  }
  absl::Status AllToAll(const void* s, absl::Span<const size_t> sb, void* r,
                        absl::Span<const size_t> rb) override {
    return inner_->AllToAll(s, sb, r, rb);
  }
  absl::Status Broadcast(void* buf, size_t bytes, int root) override {
    return inner_->Broadcast(buf, bytes, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }
  void Interrupt(absl::Status reason) override { inner_->Interrupt(std::move(reason)); }
  transport::TransportStats stats() const override { return inner_->stats(); }
  std::string Describe() const override { return inner_->Describe(); }
  absl::Status RunCollective(
      const std::function<absl::Status(transport::Context&)>& body) override {
    return inner_->RunCollective(body);
  }
  void SetPipeline(size_t chunk_bytes, int ring_window) override {
    inner_->SetPipeline(chunk_bytes, ring_window);
  }
  std::pair<size_t, int> pipeline() const override { return inner_->pipeline(); }

 protected:
  transport::Communicator& inner() { return *inner_; }

 private:
  std::unique_ptr<transport::Communicator> inner_;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_DELEGATING_COMMUNICATOR_H_
