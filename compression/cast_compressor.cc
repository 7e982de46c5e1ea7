// fp16 / bf16: cast the bucket to 16 bits, one all-reduce, cast back.
//
// Averaging divides by the world size *before* the cast, so no x/n overflows fp16 (max
// 65504) when x fits in float32 below 65504·n, and the all-reduce keeps its partial sums in
// float32 (Note [16-bit arithmetic] in transport/canonical_reduce.h), so the mean is returned
// whenever it fits. Error bound, element-wise, for n ranks and unit roundoff u (2^-11 fp16,
// 2^-8 bf16): |result - mean| <= (2·u + (n - 1)·2^-24)·(1/n)·Σ_r|x_r|, plus fp16's underflow
// (2^-25 per rounding) for values below 2^-14: one rounding of each input, the float32 sum,
// one rounding of the result; the float32 conversions are exact.
//
// Non-finite input and overflow (README: Non-finite values): NaN stays NaN and ±inf stays
// ±inf (inf - inf is NaN); a finite x with |x/n| (average) or |x| (sum) beyond the format's
// largest value (65504 fp16; about 3.39e38 bf16) becomes ±inf on the wire, so the result is
// ±inf (or NaN) on every rank: never a silently clipped finite value.
#include <vector>

#include "compression/half_convert.h"
#include "compression/methods.h"

namespace braid::compression {
namespace {

class CastCompressor : public Compressor {
 public:
  CastCompressor(DataType wire, std::string spec) : wire_(wire), spec_(std::move(spec)) {}

  const std::string& spec() const override { return spec_; }

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    const bool bf16 = wire_ == DataType::kBFloat16;
    const float divisor = ctx.op == ReduceOp::kAverage ? static_cast<float>(comm.size()) : 1.0f;
    size_t total = 0;
    for (const TensorView& t : tensors) total += t.count;
    if (wire_buffer_.size() < total) wire_buffer_.resize(total);
    size_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      ToHalf(tensors[i].data, tensors[i].count, divisor, bf16, wire_buffer_.data() + offset);
      offset += tensors[i].count;
      if (i < ctx.payload_bytes.size()) ctx.payload_bytes[i] = 2 * tensors[i].count;
    }
    absl::Status s = comm.AllReduce(wire_buffer_.data(), wire_buffer_.data(), total, wire_,
                                    ReduceOp::kSum);
    if (!s.ok()) return s;
    offset = 0;
    for (const TensorView& t : tensors) {
      FromHalf(wire_buffer_.data() + offset, t.count, bf16, t.data);
      offset += t.count;
    }
    return absl::OkStatus();
  }

 private:
  DataType wire_;
  std::string spec_;
  std::vector<uint16_t> wire_buffer_;  // reused across steps
};

}  // namespace

std::unique_ptr<Compressor> MakeCastCompressor(DataType wire, std::string spec) {
  return std::make_unique<CastCompressor>(wire, std::move(spec));
}

}  // namespace braid::compression
