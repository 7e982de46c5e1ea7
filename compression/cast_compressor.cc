// fp16 / bf16: cast the bucket to 16 bits, one all-reduce, cast back.
//
// Averaging divides by the world size *before* the cast, so a sum over many ranks cannot
// overflow fp16 (max 65504) when the mean itself fits. Error bound, element-wise, for n ranks
// and unit roundoff u (2^-11 fp16, 2^-8 bf16): |result - mean| <= (n + 1)·u·(1/n)·Σ_r|x_r|,
// plus fp16's underflow (2^-25 per rounding) for values below 2^-14: one rounding of each
// input, n - 1 rounded additions in the all-reduce, the float32 conversions exact.
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "common/half.h"
#include "compression/methods.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BRAID_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BRAID_MULTIVERSION
#endif

namespace braid::compression {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// F16C: 8 conversions per instruction, round to nearest even, overflow to infinity,
// subnormals exact — the same results as common/half.h (up to NaN payloads). GCC does not
// vectorize the scalar conversion, which measured ~0.12x memcpy.
__attribute__((target("avx,f16c"))) void ToFloat16F16c(const float* in, size_t n,
                                                       float divisor, uint16_t* out) {
  const __m256 d = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_div_ps(_mm256_loadu_ps(in + i), d);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = FloatToFloat16(in[i] / divisor);
}

__attribute__((target("avx,f16c"))) void FromFloat16F16c(const uint16_t* in, size_t n,
                                                         float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = Float16ToFloat(in[i]);
}

bool HasF16c() {
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has;
}
#else
bool HasF16c() { return false; }
void ToFloat16F16c(const float*, size_t, float, uint16_t*) {}
void FromFloat16F16c(const uint16_t*, size_t, float*) {}
#endif

BRAID_MULTIVERSION
void ToHalf(const float* in, size_t n, float divisor, bool bf16, uint16_t* out) {
  if (!bf16 && HasF16c()) return ToFloat16F16c(in, n, divisor, out);
  if (bf16) {
    for (size_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i] / divisor);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = FloatToFloat16(in[i] / divisor);
  }
}

BRAID_MULTIVERSION
void FromHalf(const uint16_t* in, size_t n, bool bf16, float* out) {
  if (!bf16 && HasF16c()) return FromFloat16F16c(in, n, out);
  if (bf16) {
    for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = Float16ToFloat(in[i]);
  }
}

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
