#include "runtime/allreduce_pipeline.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "compression/half_convert.h"
#include "glog/logging.h"

namespace braid {
namespace {

using compression::TensorPlan;
using compression::TensorView;

constexpr size_t kAlignment = 64;         // a cache line: every packed bucket starts on one
constexpr size_t kGrowthQuantum = 1 << 16;  // the buffer grows in whole 64 KiB steps

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The largest fusion buffer asked of the allocator: half of the address space, in whole
// growth steps, so that doubling and rounding a capacity never wraps.
constexpr size_t kMaxCapacity =
    std::numeric_limits<size_t>::max() / 2 / kGrowthQuantum * kGrowthQuantum;

void* AlignedAlloc(size_t alignment, size_t bytes) {
  return std::aligned_alloc(alignment, bytes);
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

// What the pipeline knows of the bucket it is running, passed from step to step
// (Note [One pipeline]); the spans view the pipeline's scratch.
struct AllReducePipeline::BucketRun {
  int64_t id = 0;
  const compression::CompressionMethod* method = nullptr;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  absl::Span<const AllReduceTensor> tensors;
  Timeline* timeline = nullptr;
  size_t bytes = 0;  // the tensors' own, as the caller holds them
  std::string args;  // the timeline arguments of its phases
  // Set by Describe: the tensors as the stage sees them (their element counts).
  absl::Span<const compression::BucketTensor> described;
  // Set by Pack: each tensor's view, laid out as planned.
  absl::Span<compression::TensorView> views;
  bool packed = false;      // the views lie in the fusion buffer (else where the tensors lie)
  bool gathered = false;    // packed, by the compressor as it reduces (Note [Pipelined copy])
  size_t packed_bytes = 0;  // written into the fusion buffer
};

FusionBuffer::FusionBuffer(AlignedAllocFn allocate)
    : allocate_(allocate != nullptr ? allocate : &AlignedAlloc) {}

absl::StatusOr<char*> FusionBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_.get();
  if (bytes > kMaxCapacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a fusion buffer of ", bytes, " bytes: more than half the address space"));
  }
  // At least double: buckets vary in size with timing (fusion), and every growth costs a
  // fresh allocation whose pages fault in again as they are first written. Pages the
  // buckets never reach are never touched.
  const size_t capacity = RoundUp(
      std::max<size_t>({bytes, std::min(2 * capacity_, kMaxCapacity), 1}), kGrowthQuantum);
  char* data = static_cast<char*>(allocate_(kAlignment, capacity));
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a fusion buffer of ", capacity, " bytes (", bytes,
                     " needed, ", capacity_, " held)"));
  }
  data_.reset(data);
  capacity_ = capacity;
  return data;
}

absl::Status AllReducePipeline::Run(int64_t bucket_id,
                                    const compression::CompressionMethod& method,
                                    DataType dtype, ReduceOp op,
                                    absl::Span<const AllReduceTensor> tensors,
                                    transport::Communicator& comm, Timeline* timeline) {
  BucketRun run;
  run.id = bucket_id;
  run.method = &method;
  run.dtype = dtype;
  run.op = op;
  run.tensors = tensors;
  run.timeline = timeline;
  BRAID_RETURN_IF_ERROR(Describe(run));
  if (timeline != nullptr) {
    run.args = absl::StrCat("\"bucket\": ", bucket_id, ", \"tensors\": ", tensors.size(),
                            ", \"bytes\": ", run.bytes);
    if (!method.is_none()) {
      absl::StrAppend(&run.args, ", \"compression\": \"", method.spec(), "\"");
    }
  }
  const absl::Status s = Reduce(run, comm);
  if (run.packed && !run.gathered) {
    Phase(run, "MEMCPY_OUT_FUSION_BUFFER", true, run.args);
    if (s.ok()) Unpack(run);
    Phase(run, "MEMCPY_OUT_FUSION_BUFFER", false);
  }
  if (!s.ok()) return s;
  Book(run, comm.size());
  ledger_->RecordBucket(run.packed, run.packed_bytes, run.bytes);
  return absl::OkStatus();
}

absl::Status AllReducePipeline::Describe(BucketRun& run) {
  bucket_.clear();
  for (const AllReduceTensor& t : run.tensors) {
    // Checked where the shape entered (enqueue, the coordinator's validation); a shape that
    // fails here fails alike on every rank, since the ranks agreed on it.
    auto count = ShapeElements("shape", t.shape);
    if (!count.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", run.id, ", tensor '",
                                                     Printable(t.name), "': ",
                                                     count.status().message()));
    }
    bucket_.push_back({t.name, t.shape, run.dtype, static_cast<size_t>(*count)});
    run.bytes += bucket_.back().count * DataTypeSize(run.dtype);
  }
  run.described = bucket_;
  bytes_.assign(run.tensors.size(), compression::TensorBytes{});
  return absl::OkStatus();
}

absl::Status AllReducePipeline::Reduce(BucketRun& run, transport::Communicator& comm) {
  // The stage's state stays locked from the plan to the end of the reduction (Note [Bucket
  // reduction], compression/stage.h).
  BRAID_ASSIGN_OR_RETURN(compression::PlannedBucket planned,
                         stage_->Plan(*run.method, run.described));
  if (absl::Status packed = Pack(run, planned.plans()); !packed.ok()) {
    comm.Abort(packed);  // Note [Allocation failure]
    return packed;
  }
  // The collectives start now (and the copies, for a gathered bucket).
  Phase(run, "ALLREDUCE", /*begin=*/true,
        run.gathered ? absl::StrCat(run.args, ", \"pipelined_copy\": true") : run.args);
  const absl::Status s =
      stage_->Reduce(std::move(planned), run.views, run.op, comm, absl::MakeSpan(bytes_));
  Phase(run, "ALLREDUCE", /*begin=*/false);
  return s;
}

absl::Status AllReducePipeline::Pack(BucketRun& run, absl::Span<const TensorPlan> plans) {
  views_.assign(run.tensors.size(), TensorView{});
  run.views = absl::MakeSpan(views_);
  for (size_t i = 0; i < run.tensors.size(); ++i) {
    TensorView& v = views_[i];
    v.name = run.tensors[i].name;
    v.shape = run.tensors[i].shape;
    v.count = run.described[i].count;
    v.dtype = plans[i].work_dtype;
  }
  if (run.tensors.size() == 1 && plans[0].work_dtype == run.dtype && !run.tensors[0].joined) {
    // A lone tensor is reduced in its output (Note [One pipeline]).
    const AllReduceTensor& t = run.tensors[0];
    views_[0].data = t.output;
    if (t.input != t.output) {
      if (plans[0].separate_input) {
        views_[0].input = t.input;
      } else if (views_[0].count > 0) {
        std::memcpy(t.output, t.input, views_[0].bytes());
      }
    }
    return absl::OkStatus();
  }
  if (ViewInPlace(run, plans)) return absl::OkStatus();
  // Each view starts at a multiple of its element size, so tensors of one work dtype lie
  // back to back (one collective for all of them).
  size_t total = 0;
  offsets_.clear();
  for (const TensorView& v : views_) {
    total = RoundUp(total, DataTypeSize(v.dtype));
    offsets_.push_back(total);
    total += v.bytes();
  }
  absl::StatusOr<char*> base = buffer_.Reserve(total);
  if (!base.ok()) return CannotPack(run, total, base.status());
  run.packed = true;
  run.packed_bytes = total;
  if (pipelined_copy_ && ViewGathered(run, plans, *base)) return absl::OkStatus();
  Phase(run, "MEMCPY_IN_FUSION_BUFFER", true,
        absl::StrCat("\"tensors\": ", run.tensors.size(), ", \"bytes\": ", total));
  for (size_t i = 0; i < views_.size(); ++i) {
    TensorView& v = views_[i];
    v.data = *base + offsets_[i];
    if (v.count == 0) continue;
    if (run.tensors[i].joined) {
      FillIdentity(v.data, v.dtype, run.op, v.count);
    } else if (v.dtype == run.dtype) {
      std::memcpy(v.data, run.tensors[i].input, v.bytes());
    } else {
      ToFloat32(run.tensors[i].input, run.dtype, v.count, v.f32());
    }
  }
  Phase(run, "MEMCPY_IN_FUSION_BUFFER", false);
  return absl::OkStatus();
}

absl::Status AllReducePipeline::CannotPack(const BucketRun& run, size_t bytes,
                                           const absl::Status& s) {
  constexpr size_t kNamed = 3;
  std::string names;
  for (size_t i = 0; i < run.tensors.size() && i < kNamed; ++i) {
    absl::StrAppend(&names, i == 0 ? "'" : ", '", Printable(run.tensors[i].name), "'");
  }
  if (run.tensors.size() > kNamed) {
    absl::StrAppend(&names, " and ", run.tensors.size() - kNamed, " more");
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("all-reduce bucket ", run.id, " (", run.tensors.size(), " tensors: ", names,
                   ") needs ", bytes, " bytes of fusion buffer: ", s.message()));
}

bool AllReducePipeline::ViewInPlace(BucketRun& run, absl::Span<const TensorPlan> plans) {
  const absl::Span<const AllReduceTensor> tensors = run.tensors;
  const absl::Span<TensorView> views = run.views;
  const size_t element = DataTypeSize(run.dtype);
  char* const out = static_cast<char*>(tensors[0].output);
  const char* const in = static_cast<const char*>(tensors[0].input);
  if (out == nullptr || reinterpret_cast<uintptr_t>(out) % element != 0) return false;
  const bool in_place = in == out;
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AllReduceTensor& t = tensors[i];
    if (t.joined || plans[i].work_dtype != run.dtype) return false;
    if (!in_place && !plans[i].separate_input) return false;
    // An empty tensor occupies no bytes: wherever its pointers are, it is in line.
    if (views[i].count == 0) continue;
    if (t.output != out + offset || t.input != (in_place ? out : in) + offset) return false;
    offset += views[i].bytes();
  }
  // Packing reads every input before it writes any output; reading out of place over
  // outputs that overlap the inputs would not.
  if (!in_place && in < out + offset && out < in + offset) return false;
  offset = 0;
  for (TensorView& v : views) {
    v.data = out + offset;
    if (!in_place) v.input = in + offset;
    offset += v.bytes();
  }
  return true;
}

bool AllReducePipeline::ViewGathered(BucketRun& run, absl::Span<const TensorPlan> plans,
                                     char* base) {
  spans_.clear();
  for (size_t i = 0; i < run.tensors.size(); ++i) {
    const AllReduceTensor& t = run.tensors[i];
    if (t.joined || plans[i].work_dtype != run.dtype || !plans[i].separate_input ||
        !plans[i].separate_output) {
      return false;
    }
    const size_t bytes = run.views[i].bytes();
    if (bytes == 0) continue;
    const auto in = reinterpret_cast<uintptr_t>(t.input);
    const auto out = reinterpret_cast<uintptr_t>(t.output);
    spans_.emplace_back(out, out + bytes);
    if (in != out) spans_.emplace_back(in, in + bytes);
  }
  // Pairwise apart (an input shared by two tensors too: rare, and then packed as before).
  std::sort(spans_.begin(), spans_.end());
  for (size_t k = 1; k < spans_.size(); ++k) {
    if (spans_[k].first < spans_[k - 1].second) return false;
  }
  run.gathered = true;
  for (size_t i = 0; i < run.views.size(); ++i) {
    TensorView& v = run.views[i];
    v.data = base + offsets_[i];
    // An empty tensor's pointers may be null (PyTorch's are): it points at its place in the
    // buffer instead, so that every view of the bucket is gathered and the compressor runs
    // one collective for all of them, as over the packed bucket (a rank that packs it must
    // see the same collectives).
    v.input = v.count == 0 ? v.data : run.tensors[i].input;
    v.output = v.count == 0 ? v.data : run.tensors[i].output;
  }
  return true;
}

void AllReducePipeline::Unpack(const BucketRun& run) {
  for (size_t i = 0; i < run.views.size(); ++i) {
    const TensorView& v = run.views[i];
    const AllReduceTensor& t = run.tensors[i];
    if (v.count == 0 || t.joined) continue;
    if (v.dtype == run.dtype) {
      std::memcpy(t.output, v.data, v.bytes());
    } else {
      FromFloat32(v.f32(), run.dtype, v.count, t.output);
    }
  }
}

void AllReducePipeline::Book(const BucketRun& run, int world_size) {
  for (size_t i = 0; i < run.tensors.size(); ++i) {
    const compression::TensorBytes& b = bytes_[i];
    ByteStats s;
    s.reductions = 1;
    s.uncompressed_bytes = run.described[i].count * DataTypeSize(run.dtype);
    // A warm-up step counts under its method at the tensor's size (runtime/statistics.h).
    s.payload_bytes = b.warm_up ? s.uncompressed_bytes : b.payload_bytes;
    s.transport_bytes = b.transport_bytes;
    s.reference_transport_bytes = ReferenceTransportBytes(s.uncompressed_bytes, world_size);
    ledger_->Record(run.tensors[i].name, run.method->spec(), s);
  }
}

void AllReducePipeline::Phase(const BucketRun& run, const char* phase, bool begin,
                              const std::string& args) {
  if (run.timeline == nullptr) return;
  for (const AllReduceTensor& t : run.tensors) {
    const std::string name(t.name);
    if (begin) {
      run.timeline->Begin(name, phase, args);
    } else {
      run.timeline->End(name, phase);
    }
  }
}

}  // namespace braid
