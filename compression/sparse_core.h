// Internal to the sparsifiers (sparse.h): what scalecomp, topk and randomk share — the plan of
// a bucket, the memory (one ErrorFeedback residual per tensor), the memory-compensated
// gradient and its finiteness check, top-k selection, gather and scatter at bucket indices,
// the wire form of indices, and the errors every rank must agree on.
#ifndef BRAID_COMPRESSION_SPARSE_CORE_H_
#define BRAID_COMPRESSION_SPARSE_CORE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "compression/compressor.h"
#include "compression/error_feedback.h"
#include "compression/sparse.h"
#include "compression/topk.h"
#include "transport/communicator.h"

namespace braid::compression {

// A rank's status word in the collectives (sparse.h, "Non-finite input"): 0 is fine,
// 1 + j means tensor j of the bucket holds a NaN or an infinity, kCorruptIndices means the
// indices this rank received were not ascending or not inside the bucket.
constexpr int64_t kCorruptIndices = -1;

class SparseBucket {
 public:
  SparseBucket(const SparseOptions& options, std::string spec)
      : o_(options), spec_(std::move(spec)), memory_(options.beta) {}

  // Plans the bucket and places each tensor's memory m on `device` (zeros at first:
  // ErrorFeedback::Place, whose errors it returns). Nothing else is written: p = g + m is
  // formed on the fly, and the memory changes only in UpdateMemoryAndClear, once every rank
  // is known to have succeeded.
  absl::Status Begin(absl::Span<const TensorView> tensors, device::Device& device);
  const SparsePlan& plan() const { return plan_; }

  // This rank's status word: 0, or 1 + the position of the first tensor whose p holds a NaN
  // or an infinity. One read of g and m.
  int64_t CheckFinite(absl::Span<const TensorView> tensors) const;

  // The top-k indices of |p| under the plan (one top-k over the bucket, or k_j per tensor),
  // global in the bucket, ascending; the finiteness check in the same pass. Returns the
  // status word as CheckFinite (then *indices is not usable).
  int64_t SelectTopK(absl::Span<const TensorView> tensors, std::vector<uint64_t>* indices);

  // out[i] = p[indices[i]] = g + m there.
  void Gather(absl::Span<const TensorView> tensors, absl::Span<const uint64_t> indices,
              float* out) const;
  // p[indices[i]] = values[i] / divisor (add: +=). Division, not a reciprocal, as documented.
  void Scatter(absl::Span<const TensorView> tensors, absl::Span<const uint64_t> indices,
               const float* values, float divisor, bool add) const;

  // m = (1 - β)·m + β·(p - p⊙1_sent) for every tensor (ErrorFeedback's Apply and Update
  // expressions, with the sent elements exactly p there), then the tensors become zeros.
  void UpdateMemoryAndClear(absl::Span<const TensorView> tensors,
                            absl::Span<const uint64_t> sent);

  // ctx.payload_bytes[j] = bytes_per_index · (number of `indices` inside tensor j).
  void CountPayload(absl::Span<const uint64_t> indices, size_t bytes_per_index,
                    StepContext& ctx) const;

  // Wire form of indices: plan().index_bytes each, native byte order.
  void PackIndices(absl::Span<const uint64_t> indices, uint8_t* out) const;
  // Reads k indices; false (and nothing usable) unless they are ascending and inside the
  // bucket, so a corrupt message never writes out of bounds.
  bool UnpackIndices(const uint8_t* in, size_t k, std::vector<uint64_t>* out) const;
  uint64_t ReadWord(const uint8_t* in) const;
  void WriteWord(uint64_t v, uint8_t* out) const;
  // The all-ones word (-1 as int32 / int64): "no indices follow" in topk's blocks.
  uint64_t Sentinel() const { return plan_.index_bytes == 4 ? 0xffffffffull : ~0ull; }

  // The error every rank returns when some status word is not 0 (`status[r]`: rank r's):
  // InvalidArgument naming each non-finite tensor and its rank, or Internal for corrupt
  // indices. `leader`: the rank whose status came from its index broadcast (-1: none).
  absl::Status StatusError(absl::Span<const TensorView> tensors,
                           absl::Span<const int64_t> status, int leader = -1) const;

  // The end of scalecomp and randomk, once every rank holds the same `indices`: one
  // all-reduce (sum) of p[indices] and of the ranks' status words (`status` is this rank's),
  // then — when every status is 0 — the memory update and the result (the sums, divided by n
  // for an average) scattered into zeros. Payload: 4 bytes per index.
  absl::Status ReduceAtIndices(absl::Span<const TensorView> tensors,
                               absl::Span<const uint64_t> indices, int64_t status,
                               transport::Communicator& comm, StepContext& ctx);

  // Below this many bytes of values (or at 2 ranks, where they send the same bytes) the
  // all-reduce of ReduceAtIndices is recursive doubling, fewer rounds than a reduce-scatter
  // and an all-gather, which above it keep the bytes each rank sends at 2(n-1)/n times the
  // values. Latency dominates below: 8 KiB is 0.7 ms at 100 Mbit/s.
  static constexpr size_t kBandwidthOptimalMinBytes = 8 * 1024;

  void Reset(absl::string_view name) { memory_.Reset(name); }
  const ErrorFeedback& memory() const { return memory_; }
  ErrorFeedback& mutable_memory() { return memory_; }

 private:
  SparseOptions o_;
  std::string spec_;
  ErrorFeedback memory_;
  TopKSelector selector_;
  SparsePlan plan_;
  std::vector<float*> mem_;  // per tensor: its memory, valid from Begin to the step's end
  // Scratch, reused across steps.
  std::vector<size_t> counts_;
  std::vector<float> values_, saved_;
  std::vector<uint64_t> part_;
  std::vector<int64_t> status_;
  std::vector<size_t> split_counts_, split_bytes_;  // SumValues: each rank's share
  std::vector<float> piece_;                         // SumValues: this rank's summed share

  // values_ summed over the ranks, in place, on every rank.
  absl::Status SumValues(transport::Communicator& comm);
};

// What scalecomp, topk and randomk share as Compressors: the spec, the bucket (its memory), and
// checkpoints of that memory (error_feedback.h's format). Everything else a sparsifier uses
// across steps derives from the stage's step counters (randomk's indices, scalecomp's leader).
class SparseCompressor : public Compressor {
 public:
  SparseCompressor(const SparseOptions& o, std::string spec)
      : o_(o), spec_(std::move(spec)), bucket_(o, spec_) {}

  const std::string& spec() const override { return spec_; }
  void Reset(absl::string_view name) override { bucket_.Reset(name); }
  absl::Status SaveState(std::string* out) const override { return bucket_.memory().Save(out); }
  absl::Status LoadState(absl::string_view state) override {
    if (state.empty()) {  // the first state format (version 1) kept no memory here
      bucket_.mutable_memory() = ErrorFeedback(o_.beta);
      return absl::OkStatus();
    }
    return bucket_.mutable_memory().Load(state, "compression '" + spec_ + "'");
  }
  void DescribeSharedState(std::vector<SharedStateField>* out) const override {
    bucket_.memory().Describe(out);
  }

 protected:
  const SparseOptions o_;
  const std::string spec_;
  SparseBucket bucket_;
};

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_SPARSE_CORE_H_
