#include "runtime/allreduce_pipeline.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "compression/half_convert.h"
#include "glog/logging.h"

namespace braid {
namespace {

using compression::TensorPlan;
using compression::TensorView;

constexpr size_t kAlignment = 64;         // a cache line: every packed bucket starts on one
constexpr size_t kGrowthQuantum = 1 << 16;  // the buffer grows in whole 64 KiB steps

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t NumElements(absl::Span<const int64_t> shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// float16 / bfloat16 / float64 -> float32, for compressors that take float32 only. The
// 16-bit conversions are the compression kernels' (vectorized, exact).
void ToFloat32(const void* in, DataType dtype, size_t n, float* out) {
  switch (dtype) {
    case DataType::kFloat32:
      if (n) std::memcpy(out, in, n * sizeof(float));
      return;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      compression::FromHalf(static_cast<const uint16_t*>(in), n, dtype == DataType::kBFloat16,
                            out);
      return;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<const double*>(in)[i]);
      return;
    default:
      LOG(FATAL) << "a " << DataTypeName(dtype) << " tensor cannot be reduced in float32: "
                 << "MethodApplies refuses it at enqueue";
  }
}

// The inverse (round to nearest even for the 16-bit formats).
void FromFloat32(const float* in, DataType dtype, size_t n, void* out) {
  switch (dtype) {
    case DataType::kFloat32:
      if (n && out != in) std::memcpy(out, in, n * sizeof(float));
      return;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      compression::ToHalf(in, n, /*divisor=*/1.0f, dtype == DataType::kBFloat16,
                          static_cast<uint16_t*>(out));
      return;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(out)[i] = in[i];
      return;
    default:
      LOG(FATAL) << "a " << DataTypeName(dtype) << " tensor cannot be reduced in float32";
  }
}

// Fills `n` elements of `dtype` at `out` with the identity of `op` (Note [Join]): what a
// joined rank contributes, so the others' result is theirs alone. Zeros for sum and average
// (an average still divides by the whole world size), the largest value for min (+inf for
// floating point), the lowest for max (-inf), one for product.
void FillIdentity(void* out, DataType dtype, ReduceOp op, size_t n) {
  if (n == 0) return;
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
    std::memset(out, 0, n * DataTypeSize(dtype));
    return;
  }
  auto fill = [&](auto value) {
    auto* p = static_cast<decltype(value)*>(out);
    std::fill(p, p + n, value);
  };
  auto pick = [&](auto lowest, auto highest, auto one) {
    fill(op == ReduceOp::kMin ? highest : op == ReduceOp::kMax ? lowest : one);
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  switch (dtype) {
    case DataType::kFloat32: return pick(-kInf, kInf, 1.0f);
    case DataType::kFloat64:
      return pick(-std::numeric_limits<double>::infinity(),
                  std::numeric_limits<double>::infinity(), 1.0);
    case DataType::kFloat16:
      return pick(FloatToFloat16(-kInf), FloatToFloat16(kInf), FloatToFloat16(1.0f));
    case DataType::kBFloat16:
      return pick(FloatToBFloat16(-kInf), FloatToBFloat16(kInf), FloatToBFloat16(1.0f));
    case DataType::kInt32:
      return pick(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                  int32_t{1});
    case DataType::kInt64:
      return pick(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                  int64_t{1});
    case DataType::kUInt8:
      return pick(uint8_t{0}, std::numeric_limits<uint8_t>::max(), uint8_t{1});
  }
}

}  // namespace

char* FusionBuffer::Reserve(size_t bytes) {
  if (bytes > capacity_ || data_ == nullptr) {
    // At least double: buckets vary in size with timing (fusion), and every growth costs a
    // fresh allocation whose pages fault in again as they are first written. Pages the
    // buckets never reach are never touched.
    const size_t capacity =
        RoundUp(std::max<size_t>({bytes, 2 * capacity_, 1}), kGrowthQuantum);
    data_.reset(static_cast<char*>(std::aligned_alloc(kAlignment, capacity)));
    CHECK(data_ != nullptr) << "cannot allocate a fusion buffer of " << capacity << " bytes";
    capacity_ = capacity;
  }
  return data_.get();
}

absl::Status AllReducePipeline::Run(int64_t bucket_id, const compression::CompressionMethod& method,
                                    DataType dtype, ReduceOp op,
                                    absl::Span<const AllReduceTensor> tensors,
                                    transport::Communicator& comm) {
  dtype_ = dtype;
  op_ = op;
  tensors_ = tensors;
  packed_ = reducing_ = false;
  packed_bytes_ = 0;
  bucket_.clear();
  size_t bytes = 0;
  for (const AllReduceTensor& t : tensors) {
    bucket_.push_back({t.name, t.shape, dtype, NumElements(t.shape)});
    bytes += bucket_.back().count * DataTypeSize(dtype);
  }
  bytes_.assign(tensors.size(), compression::TensorBytes{});
  std::string args;
  if (timeline_ != nullptr) {
    args = absl::StrCat("\"bucket\": ", bucket_id, ", \"tensors\": ", tensors.size(),
                        ", \"bytes\": ", bytes);
    if (!method.is_none()) absl::StrAppend(&args, ", \"compression\": \"", method.spec(), "\"");
  }
  absl::Status s = stage_->Reduce(
      method, bucket_, op, comm,
      [&](absl::Span<const TensorPlan> plans) -> absl::StatusOr<absl::Span<const TensorView>> {
        auto views = Pack(plans);
        reducing_ = true;
        Phase("ALLREDUCE", /*begin=*/true, args);  // the collectives start now
        return views;
      },
      absl::MakeSpan(bytes_));
  if (reducing_) Phase("ALLREDUCE", /*begin=*/false);
  if (packed_) {
    Phase("MEMCPY_OUT_FUSION_BUFFER", true, args);
    if (s.ok()) Unpack();
    Phase("MEMCPY_OUT_FUSION_BUFFER", false);
  }
  if (s.ok()) {
    Book(method, comm.size());
    ledger_->RecordBucket(packed_, packed_bytes_, bytes);
  }
  return s;
}

absl::StatusOr<absl::Span<const TensorView>> AllReducePipeline::Pack(
    absl::Span<const TensorPlan> plans) {
  views_.assign(tensors_.size(), TensorView{});
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorView& v = views_[i];
    v.name = tensors_[i].name;
    v.shape = tensors_[i].shape;
    v.count = bucket_[i].count;
    v.dtype = plans[i].work_dtype;
  }
  if (tensors_.size() == 1 && plans[0].work_dtype == dtype_ && !tensors_[0].joined) {
    // A lone tensor is reduced in its output (Note [One pipeline]).
    const AllReduceTensor& t = tensors_[0];
    views_[0].data = t.output;
    if (t.input != t.output) {
      if (plans[0].separate_input) {
        views_[0].input = t.input;
      } else if (views_[0].count > 0) {
        std::memcpy(t.output, t.input, views_[0].bytes());
      }
    }
    return absl::MakeConstSpan(views_);
  }
  if (ViewInPlace(plans)) return absl::MakeConstSpan(views_);
  // Each view starts at a multiple of its element size, so tensors of one work dtype lie
  // back to back (one collective for all of them).
  size_t total = 0;
  std::vector<size_t>& offsets = offsets_;  // member: no allocation per bucket
  offsets.clear();
  for (const TensorView& v : views_) {
    total = RoundUp(total, DataTypeSize(v.dtype));
    offsets.push_back(total);
    total += v.bytes();
  }
  char* base = buffer_.Reserve(total);
  packed_ = true;
  packed_bytes_ = total;
  Phase("MEMCPY_IN_FUSION_BUFFER", true,
        absl::StrCat("\"tensors\": ", tensors_.size(), ", \"bytes\": ", total));
  for (size_t i = 0; i < views_.size(); ++i) {
    TensorView& v = views_[i];
    v.data = base + offsets[i];
    if (v.count == 0) continue;
    if (tensors_[i].joined) {
      FillIdentity(v.data, v.dtype, op_, v.count);
    } else if (v.dtype == dtype_) {
      std::memcpy(v.data, tensors_[i].input, v.bytes());
    } else {
      ToFloat32(tensors_[i].input, dtype_, v.count, v.f32());
    }
  }
  Phase("MEMCPY_IN_FUSION_BUFFER", false);
  return absl::MakeConstSpan(views_);
}

bool AllReducePipeline::ViewInPlace(absl::Span<const TensorPlan> plans) {
  const size_t element = DataTypeSize(dtype_);
  char* const out = static_cast<char*>(tensors_[0].output);
  const char* const in = static_cast<const char*>(tensors_[0].input);
  if (out == nullptr || reinterpret_cast<uintptr_t>(out) % element != 0) return false;
  const bool in_place = in == out;
  size_t offset = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const AllReduceTensor& t = tensors_[i];
    if (t.joined || plans[i].work_dtype != dtype_) return false;
    if (!in_place && !plans[i].separate_input) return false;
    // An empty tensor occupies no bytes: wherever its pointers are, it is in line.
    if (views_[i].count == 0) continue;
    if (t.output != out + offset || t.input != (in_place ? out : in) + offset) return false;
    offset += views_[i].bytes();
  }
  // Packing reads every input before it writes any output; reading out of place over
  // outputs that overlap the inputs would not.
  if (!in_place && in < out + offset && out < in + offset) return false;
  offset = 0;
  for (size_t i = 0; i < views_.size(); ++i) {
    views_[i].data = out + offset;
    if (!in_place) views_[i].input = in + offset;
    offset += views_[i].bytes();
  }
  return true;
}

void AllReducePipeline::Unpack() {
  for (size_t i = 0; i < views_.size(); ++i) {
    const TensorView& v = views_[i];
    if (v.count == 0 || tensors_[i].joined) continue;
    if (v.dtype == dtype_) {
      std::memcpy(tensors_[i].output, v.data, v.bytes());
    } else {
      FromFloat32(v.f32(), dtype_, v.count, tensors_[i].output);
    }
  }
}

void AllReducePipeline::Book(const compression::CompressionMethod& method, int world_size) {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const compression::TensorBytes& b = bytes_[i];
    ByteStats s;
    s.reductions = 1;
    s.uncompressed_bytes = bucket_[i].count * DataTypeSize(dtype_);
    // A warm-up step counts under its method at the tensor's size (runtime/statistics.h).
    s.payload_bytes = b.warm_up ? s.uncompressed_bytes : b.payload_bytes;
    s.transport_bytes = b.transport_bytes;
    s.reference_transport_bytes = ReferenceTransportBytes(s.uncompressed_bytes, world_size);
    ledger_->Record(tensors_[i].name, method.spec(), s);
  }
}

void AllReducePipeline::Phase(const char* phase, bool begin, const std::string& args) {
  if (timeline_ == nullptr) return;
  for (const AllReduceTensor& t : tensors_) {
    const std::string name(t.name);
    if (begin) {
      timeline_->Begin(name, phase, args);
    } else {
      timeline_->End(name, phase);
    }
  }
}

}  // namespace braid
