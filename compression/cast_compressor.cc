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
// Non-finite input and overflow (docs/compression.md: Non-finite values): NaN stays NaN and ±inf stays
// ±inf (inf - inf is NaN); a finite x with |x/n| (average) or |x| (sum) beyond the format's
// largest value (65504 fp16; about 3.39e38 bf16) becomes ±inf on the wire, so the result is
// ±inf (or NaN) on every rank: never a silently clipped finite value.
#include <cstring>
#include <vector>

#include "compression/half_convert.h"
#include "compression/methods.h"

namespace braid::compression {
namespace {

// Note [Native 16-bit tensors]: float16 and bfloat16 tensors reach Reduce as they are, so
// each element is converted at most once on the way in and once on the way out. A bucket
// whose tensors are already in the wire format and lie back to back (the runtime's fusion
// buffer, or one tensor) is its own wire buffer: a sum converts nothing, an average rounds
// x/n once in place. A lone tensor whose input lies elsewhere (TensorView::input) is read
// there, so the runtime copies nothing into its output first. Every path performs the same
// float32 operations as converting to float32 first, so the results are bit-identical
// whichever dtype a tensor has.
class CastCompressor : public Compressor {
 public:
  CastCompressor(DataType wire, std::string spec) : wire_(wire), spec_(std::move(spec)) {}

  const std::string& spec() const override { return spec_; }
  bool TakesNatively(DataType dtype) const override {
    return dtype == DataType::kFloat32 || dtype == DataType::kFloat16 ||
           dtype == DataType::kBFloat16;
  }
  // The cast reads each input once anyway: reading it where the caller has it saves the
  // runtime a copy into the output.
  bool ReadsSeparateInput() const override { return true; }

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    const float divisor = ctx.op == ReduceOp::kAverage ? static_cast<float>(comm.size()) : 1.0f;
    size_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      total += tensors[i].count;
      if (i < ctx.payload_bytes.size()) ctx.payload_bytes[i] = 2 * tensors[i].count;
    }
    if (total == 0) return absl::OkStatus();
    if (InWireFormatBackToBack(tensors)) {
      uint16_t* wire = static_cast<uint16_t*>(tensors[0].data);
      const void* send = wire;
      if (divisor != 1.0f) {
        for (const TensorView& t : tensors) {
          HalfToHalf(Source(t), bf16(), t.count, divisor, bf16(), static_cast<uint16_t*>(t.data));
        }
      } else if (tensors.size() == 1) {
        send = Source(tensors[0]);  // out of place when the input is elsewhere: no copy
      } else {
        for (const TensorView& t : tensors) {
          if (t.input != nullptr) std::memcpy(t.data, t.input, t.bytes());
        }
      }
      return comm.AllReduce(send, wire, total, wire_, ReduceOp::kSum);
    }
    if (wire_buffer_.size() < total) wire_buffer_.resize(total);
    size_t offset = 0;
    for (const TensorView& t : tensors) {
      ToWire(t, divisor, wire_buffer_.data() + offset);
      offset += t.count;
    }
    absl::Status s = comm.AllReduce(wire_buffer_.data(), wire_buffer_.data(), total, wire_,
                                    ReduceOp::kSum);
    if (!s.ok()) return s;
    offset = 0;
    for (const TensorView& t : tensors) {
      FromWire(wire_buffer_.data() + offset, t);
      offset += t.count;
    }
    return absl::OkStatus();
  }

 private:
  bool bf16() const { return wire_ == DataType::kBFloat16; }
  static const uint16_t* Source(const TensorView& t) {
    return static_cast<const uint16_t*>(t.input != nullptr ? t.input : t.data);
  }

  bool InWireFormatBackToBack(absl::Span<const TensorView> tensors) const {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].dtype != wire_) return false;
      if (i > 0 && static_cast<const char*>(tensors[i - 1].data) + tensors[i - 1].bytes() !=
                       tensors[i].data) {
        return false;
      }
    }
    return true;
  }

  // wire[i] = half(t[i] / divisor), t's values read from its input.
  void ToWire(const TensorView& t, float divisor, uint16_t* wire) const {
    if (t.dtype == DataType::kFloat32) {
      const void* in = t.input != nullptr ? t.input : t.data;
      return ToHalf(static_cast<const float*>(in), t.count, divisor, bf16(), wire);
    }
    const uint16_t* in = Source(t);
    if (t.dtype == wire_ && divisor == 1.0f) {
      std::memcpy(wire, in, t.count * sizeof(uint16_t));
      return;
    }
    HalfToHalf(in, t.dtype == DataType::kBFloat16, t.count, divisor, bf16(), wire);
  }

  void FromWire(const uint16_t* wire, const TensorView& t) const {
    if (t.dtype == DataType::kFloat32) return FromHalf(wire, t.count, bf16(), t.f32());
    auto* out = static_cast<uint16_t*>(t.data);
    if (t.dtype == wire_) {
      std::memcpy(out, wire, t.count * sizeof(uint16_t));
      return;
    }
    HalfToHalf(wire, bf16(), t.count, 1.0f, t.dtype == DataType::kBFloat16, out);
  }

  DataType wire_;
  std::string spec_;
  std::vector<uint16_t> wire_buffer_;  // reused across steps
};

}  // namespace

std::unique_ptr<Compressor> MakeCastCompressor(DataType wire, std::string spec) {
  return std::make_unique<CastCompressor>(wire, std::move(spec));
}

}  // namespace braid::compression
