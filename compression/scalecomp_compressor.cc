// scalecomp: cyclic local top-k with low-pass filtered error feedback (sparse.h has the
// algorithm, its equations and its wire format).
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/sparse.h"
#include "compression/sparse_core.h"

namespace braid::compression {
namespace {

class ScaleCompCompressor : public SparseCompressor {
 public:
  using SparseCompressor::SparseCompressor;

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    const int n = comm.size(), rank = comm.rank();
    for (uint64_t& p : ctx.payload_bytes) p = 0;
    if (o_.leader >= n) {  // the same verdict on every rank, before any collective
      return absl::InvalidArgumentError(absl::StrCat("compression '", spec_, "': leader ",
                                                     o_.leader, " is not a rank of a world of ",
                                                     "size ", n));
    }
    BRAID_RETURN_IF_ERROR(FailBeforeCollectives(comm, bucket_.Begin(tensors, *ctx.device)));
    const SparsePlan& plan = bucket_.plan();
    const size_t k = plan.total_k, w = plan.index_bytes;
    if (k == 0) return absl::OkStatus();  // only empty tensors: nothing to send
    const int64_t t = ctx.steps.empty() ? 0 : ctx.steps[0];
    const int leader = o_.leader >= 0 ? o_.leader : static_cast<int>(t % n);

    // 1. The leader's top-k indices (its finiteness check in the same pass), or a header
    // saying why there are none; the others check their own p meanwhile.
    wire_.assign((k + 1) * w, 0);
    int64_t status = 0;
    if (rank == leader) {
      status = bucket_.SelectTopK(tensors, &indices_);
      if (status != 0) {
        bucket_.WriteWord(static_cast<uint64_t>(status), wire_.data());
      } else {
        bucket_.PackIndices(indices_, wire_.data() + w);
      }
    } else {
      status = bucket_.CheckFinite(tensors);
    }
    absl::Status s = comm.Broadcast(wire_.data(), wire_.size(), leader);
    if (!s.ok()) return s;
    const uint64_t header = bucket_.ReadWord(wire_.data());
    if (header != 0) {
      std::vector<int64_t> statuses(n, 0);
      statuses[leader] = static_cast<int64_t>(header);
      return bucket_.StatusError(tensors, statuses, leader);
    }
    int64_t mine = status;
    if (rank != leader && !bucket_.UnpackIndices(wire_.data() + w, k, &indices_)) {
      mine = kCorruptIndices;  // still joins the all-reduce, so nobody waits for it
      indices_.assign(k, 0);
    }
    // 2. One all-reduce of every rank's p at those indices; memory; result.
    return bucket_.ReduceAtIndices(tensors, indices_, mine, comm, ctx);
  }

 private:
  std::vector<uint8_t> wire_;
  std::vector<uint64_t> indices_;
};

}  // namespace

std::unique_ptr<Compressor> MakeScaleCompCompressor(const SparseOptions& options,
                                                    std::string spec) {
  return std::make_unique<ScaleCompCompressor>(options, std::move(spec));
}

}  // namespace braid::compression
