// The baselines ScaleComp is measured against (sparse.h): topk (each rank its own indices,
// all-gathered as (index, value) pairs: the gradient build-up) and randomk (indices from a
// shared seed, so one all-reduce serves).
#include <cstring>
#include <vector>

#include "common/status_macros.h"
#include "compression/quantize.h"
#include "compression/sparse.h"
#include "compression/sparse_core.h"

namespace braid::compression {
namespace {

class TopKCompressor : public SparseCompressor {
 public:
  using SparseCompressor::SparseCompressor;

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    const int n = comm.size();
    for (uint64_t& p : ctx.payload_bytes) p = 0;
    BRAID_RETURN_IF_ERROR(FailBeforeCollectives(comm, bucket_.Begin(tensors, *ctx.device)));
    const size_t k = bucket_.plan().total_k, w = bucket_.plan().index_bytes;
    if (k == 0) return absl::OkStatus();
    // A block: k indices, then k float32 values.
    const size_t block = k * (w + sizeof(float));
    send_.assign(block, 0);
    const int64_t status = bucket_.SelectTopK(tensors, &indices_);
    if (status != 0) {  // no pairs: the sentinel, and the tensor's position in value 0
      bucket_.WriteWord(bucket_.Sentinel(), send_.data());
      const uint32_t position = static_cast<uint32_t>(status - 1);
      std::memcpy(send_.data() + k * w, &position, sizeof(position));
    } else {
      bucket_.PackIndices(indices_, send_.data());
      values_.resize(k);
      bucket_.Gather(tensors, indices_, values_.data());
      std::memcpy(send_.data() + k * w, values_.data(), k * sizeof(float));
    }
    recv_.resize(block * n);
    const std::vector<size_t> sizes(n, block);
    absl::Status s = comm.AllGather(send_.data(), block, recv_.data(), sizes);
    if (!s.ok()) return s;

    // Every rank holds the same blocks, so every rank reaches the same verdict.
    std::vector<int64_t> statuses(n, 0);
    bool failed = false;
    all_.resize(n);
    for (int r = 0; r < n; ++r) {
      const uint8_t* b = recv_.data() + block * r;
      if (bucket_.ReadWord(b) == bucket_.Sentinel()) {
        uint32_t position;
        std::memcpy(&position, b + k * w, sizeof(position));
        statuses[r] = static_cast<int64_t>(position) + 1;
      } else if (!bucket_.UnpackIndices(b, k, &all_[r])) {
        statuses[r] = kCorruptIndices;
      }
      failed |= statuses[r] != 0;
    }
    if (failed) return bucket_.StatusError(tensors, statuses);

    bucket_.UpdateMemoryAndClear(tensors, indices_);
    // Sum in rank order, each value divided by n first for an average.
    const float divisor = ctx.op == ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
    for (int r = 0; r < n; ++r) {
      values_.resize(k);
      std::memcpy(values_.data(), recv_.data() + block * r + k * w, k * sizeof(float));
      bucket_.Scatter(tensors, all_[r], values_.data(), divisor, /*add=*/true);
    }
    bucket_.CountPayload(indices_, w + sizeof(float), ctx);
    return absl::OkStatus();
  }

 private:
  std::vector<uint8_t> send_, recv_;
  std::vector<uint64_t> indices_;
  std::vector<std::vector<uint64_t>> all_;
  std::vector<float> values_;
};

// k stratified random indices in [first, first + count): one per stratum
// [floor(j·count/k), floor((j+1)·count/k)), drawn from `seed`. Ascending, distinct.
void StratifiedIndices(uint64_t seed, uint64_t first, uint64_t count, size_t k,
                       std::vector<uint64_t>* out) {
  using u128 = unsigned __int128;  // j·count overflows 64 bits for huge buckets
  for (size_t j = 0; j < k; ++j) {
    const uint64_t lo = static_cast<uint64_t>(static_cast<u128>(j) * count / k);
    const uint64_t hi = static_cast<uint64_t>(static_cast<u128>(j + 1) * count / k);
    out->push_back(first + lo + Mix64(seed + j) % (hi - lo));
  }
}

class SharedRandomKCompressor : public SparseCompressor {
 public:
  using SparseCompressor::SparseCompressor;

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    for (uint64_t& p : ctx.payload_bytes) p = 0;
    BRAID_RETURN_IF_ERROR(FailBeforeCollectives(comm, bucket_.Begin(tensors, *ctx.device)));
    const SparsePlan& plan = bucket_.plan();
    if (plan.total_k == 0) return absl::OkStatus();
    const int64_t status = bucket_.CheckFinite(tensors);
    auto step = [&](size_t t) { return t < ctx.steps.size() ? ctx.steps[t] : 0; };
    // The seed depends on what every rank knows alike: the job's seed, the names, the step.
    const uint64_t base = Mix64(ctx.seed ^ 0x72616e646f6d6bull);  // "randomk"
    indices_.clear();
    if (o_.granularity == SparseGranularity::kBucket) {
      uint64_t h = base;
      for (const TensorView& t : tensors) h = Mix64(h ^ NameHash(t.name));
      h = Mix64(h ^ static_cast<uint64_t>(step(0)));
      StratifiedIndices(h, 0, plan.offset.back(), plan.k[0], &indices_);
    } else {
      for (size_t t = 0; t < tensors.size(); ++t) {
        const uint64_t h = Mix64(Mix64(base ^ NameHash(tensors[t].name)) ^
                                 static_cast<uint64_t>(step(t)));
        StratifiedIndices(h, plan.offset[t], tensors[t].count, plan.k[t], &indices_);
      }
    }
    return bucket_.ReduceAtIndices(tensors, indices_, status, comm, ctx);
  }

 private:
  std::vector<uint64_t> indices_;
};

}  // namespace

std::unique_ptr<Compressor> MakeTopKCompressor(const SparseOptions& options, std::string spec) {
  return std::make_unique<TopKCompressor>(options, std::move(spec));
}

std::unique_ptr<Compressor> MakeSharedRandomKCompressor(const SparseOptions& options,
                                                        std::string spec) {
  return std::make_unique<SharedRandomKCompressor>(options, std::move(spec));
}

}  // namespace braid::compression
