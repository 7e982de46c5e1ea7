#include "compression/sparse_core.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compression/registry.h"
#include "transport/ring_schedule.h"

namespace braid::compression {
namespace {

// Calls f(tensor, element, i) for each ascending global index indices[i], walking the
// tensors' offsets once.
template <typename F>
void ForEachIndex(const SparsePlan& plan, absl::Span<const uint64_t> indices, F&& f) {
  size_t t = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    const uint64_t g = indices[i];
    while (g >= plan.offset[t + 1]) ++t;
    f(t, static_cast<size_t>(g - plan.offset[t]), i);
  }
}

}  // namespace

size_t SparseK(size_t count, double ratio) {
  if (count == 0) return 0;
  const double k = std::ceil(static_cast<double>(count) / ratio);
  if (!(k >= 1.0)) return 1;
  return k >= static_cast<double>(count) ? count : static_cast<size_t>(k);
}

SparsePlan PlanSparse(absl::Span<const size_t> counts, const SparseOptions& options) {
  SparsePlan p;
  p.offset.assign(counts.size() + 1, 0);
  for (size_t t = 0; t < counts.size(); ++t) p.offset[t + 1] = p.offset[t] + counts[t];
  const uint64_t total = p.offset.back();
  if (options.granularity == SparseGranularity::kTensor) {
    for (size_t c : counts) p.k.push_back(SparseK(c, options.ratio));
  } else {
    p.k.push_back(SparseK(total, options.ratio));
  }
  for (size_t k : p.k) p.total_k += k;
  p.index_bytes = total > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) ? 8 : 4;
  return p;
}

std::unique_ptr<Compressor> CreateSparseCompressor(const CompressionSpec& spec) {
  SparseOptions o;
  o.ratio = spec.FloatOption("ratio");
  o.beta = static_cast<float>(spec.FloatOption("beta"));
  o.granularity = spec.options.at("granularity") == "tensor" ? SparseGranularity::kTensor
                                                             : SparseGranularity::kBucket;
  if (spec.method == "scalecomp") {
    const std::string& leader = spec.options.at("leader");
    o.leader = leader == "cyclic" ? -1 : static_cast<int>(spec.IntOption("leader"));
    return MakeScaleCompCompressor(o, spec.canonical);
  }
  if (spec.method == "topk") return MakeTopKCompressor(o, spec.canonical);
  return MakeSharedRandomKCompressor(o, spec.canonical);
}

absl::Status SparseBucket::Begin(absl::Span<const TensorView> tensors,
                                 device::Device& device) {
  BRAID_RETURN_IF_ERROR(memory_.Place(device, tensors));
  counts_.clear();
  for (const TensorView& t : tensors) counts_.push_back(t.count);
  plan_ = PlanSparse(counts_, o_);
  mem_.assign(tensors.size(), nullptr);
  for (size_t t = 0; t < tensors.size(); ++t) {
    mem_[t] = memory_.MutableResidual(tensors[t].name, tensors[t].count);
  }
  return absl::OkStatus();
}

int64_t SparseBucket::CheckFinite(absl::Span<const TensorView> tensors) const {
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (MaxKeyOfSum(tensors[t].f32(), mem_[t], tensors[t].count) >= kNonFiniteKey) {
      return static_cast<int64_t>(t) + 1;
    }
  }
  return 0;
}

int64_t SparseBucket::SelectTopK(absl::Span<const TensorView> tensors,
                                 std::vector<uint64_t>* indices) {
  if (o_.granularity == SparseGranularity::kBucket) {
    std::vector<FloatSegment> segments;
    segments.reserve(tensors.size());
    for (size_t t = 0; t < tensors.size(); ++t) {
      segments.push_back({tensors[t].f32(), tensors[t].count, mem_[t]});
    }
    if (selector_.Select(segments, plan_.k[0], indices, o_.selection)) return 0;
    return CheckFinite(tensors);  // which tensor: only on this failure path
  }
  indices->clear();
  for (size_t t = 0; t < tensors.size(); ++t) {
    const FloatSegment one{tensors[t].f32(), tensors[t].count, mem_[t]};
    if (!selector_.Select(absl::MakeConstSpan(&one, 1), plan_.k[t], &part_, o_.selection)) {
      return static_cast<int64_t>(t) + 1;
    }
    for (uint64_t i : part_) indices->push_back(plan_.offset[t] + i);
  }
  return 0;
}

void SparseBucket::Gather(absl::Span<const TensorView> tensors,
                          absl::Span<const uint64_t> indices, float* out) const {
  ForEachIndex(plan_, indices, [&](size_t t, size_t e, size_t i) {
    out[i] = tensors[t].f32()[e] + mem_[t][e];
  });
}

void SparseBucket::Scatter(absl::Span<const TensorView> tensors,
                           absl::Span<const uint64_t> indices, const float* values,
                           float divisor, bool add) const {
  ForEachIndex(plan_, indices, [&](size_t t, size_t e, size_t i) {
    const float v = divisor == 1.0f ? values[i] : values[i] / divisor;
    if (add) {
      tensors[t].f32()[e] += v;
    } else {
      tensors[t].f32()[e] = v;
    }
  });
}

void SparseBucket::UpdateMemoryAndClear(absl::Span<const TensorView> tensors,
                                        absl::Span<const uint64_t> sent) {
  const float beta = o_.beta, keep = 1.0f - beta;
  if (beta != 1.0f) {  // the sent elements' old memory, before the dense pass overwrites it
    saved_.resize(sent.size());
    ForEachIndex(plan_, sent, [&](size_t t, size_t e, size_t i) { saved_[i] = mem_[t][e]; });
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    AddFilterAndClear(mem_[t], tensors[t].f32(), tensors[t].count, beta);
  }
  // Where p was sent, p - sent = +0: ErrorFeedback's next = d (β = 1) or keep·e + β·d.
  ForEachIndex(plan_, sent, [&](size_t t, size_t e, size_t i) {
    const float d = 0.0f;
    mem_[t][e] = beta == 1.0f ? d : keep * saved_[i] + beta * d;
  });
}

void SparseBucket::CountPayload(absl::Span<const uint64_t> indices, size_t bytes_per_index,
                                StepContext& ctx) const {
  for (uint64_t& p : ctx.payload_bytes) p = 0;
  ForEachIndex(plan_, indices, [&](size_t t, size_t, size_t) {
    if (t < ctx.payload_bytes.size()) ctx.payload_bytes[t] += bytes_per_index;
  });
}

uint64_t SparseBucket::ReadWord(const uint8_t* in) const {
  if (plan_.index_bytes == 4) {
    uint32_t v;
    std::memcpy(&v, in, 4);
    return v;
  }
  uint64_t v;
  std::memcpy(&v, in, 8);
  return v;
}

void SparseBucket::WriteWord(uint64_t v, uint8_t* out) const {
  if (plan_.index_bytes == 4) {
    const uint32_t w = static_cast<uint32_t>(v);
    std::memcpy(out, &w, 4);
  } else {
    std::memcpy(out, &v, 8);
  }
}

void SparseBucket::PackIndices(absl::Span<const uint64_t> indices, uint8_t* out) const {
  const size_t w = plan_.index_bytes;
  if (w == 4) {
    for (size_t i = 0; i < indices.size(); ++i) {
      const uint32_t v = static_cast<uint32_t>(indices[i]);
      std::memcpy(out + 4 * i, &v, 4);
    }
  } else {
    std::memcpy(out, indices.data(), indices.size() * 8);
  }
}

bool SparseBucket::UnpackIndices(const uint8_t* in, size_t k, std::vector<uint64_t>* out) const {
  out->resize(k);
  const size_t w = plan_.index_bytes;
  const uint64_t total = plan_.offset.back();
  bool ok = true;
  for (size_t i = 0; i < k; ++i) {
    (*out)[i] = ReadWord(in + w * i);
    ok &= (*out)[i] < total && (i == 0 || (*out)[i] > (*out)[i - 1]);
  }
  return ok;
}

absl::Status SparseBucket::StatusError(absl::Span<const TensorView> tensors,
                                       absl::Span<const int64_t> status, int leader) const {
  std::vector<std::string> nonfinite, corrupt;
  for (size_t r = 0; r < status.size(); ++r) {
    if (status[r] == kCorruptIndices) {
      corrupt.push_back(absl::StrCat(r));
    } else if (status[r] > 0 && static_cast<size_t>(status[r]) <= tensors.size()) {
      nonfinite.push_back(absl::StrCat("tensor '", tensors[status[r] - 1].name, "' on rank ", r,
                                       static_cast<int>(r) == leader ? " (the leader)" : ""));
    } else if (status[r] != 0) {
      corrupt.push_back(absl::StrCat(r));
    }
  }
  if (!nonfinite.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression '", spec_, "': non-finite gradient (NaN or Inf) in ",
        absl::StrJoin(nonfinite, ", "),
        "; every rank rejects this step and keeps its error-feedback memory"));
  }
  return absl::InternalError(absl::StrCat("compression '", spec_,
                                          "': corrupt sparse indices received on rank(s) ",
                                          absl::StrJoin(corrupt, ", ")));
}

absl::Status SparseBucket::SumValues(transport::Communicator& comm) {
  const int n = comm.size();
  const size_t count = values_.size();
  if (n <= 2 || count * sizeof(float) < kBandwidthOptimalMinBytes) {
    return comm.AllReduce(values_.data(), values_.data(), count, DataType::kFloat32,
                          ReduceOp::kSum);
  }
  // Not comm.AllReduce: below its ring threshold (256 KiB, where a sparsifier's values
  // usually are) it runs recursive doubling, whose every rank sends log2(n) times the values
  // (3x at 8 ranks); a reduce-scatter then an all-gather send 2(n-1)/n times them at any size.
  split_counts_.resize(n);
  split_bytes_.resize(n);
  const std::vector<transport::Span1D> shares = transport::PartitionEven(count, n);
  for (int r = 0; r < n; ++r) {
    split_counts_[r] = shares[r].count;
    split_bytes_[r] = shares[r].count * sizeof(float);
  }
  piece_.resize(split_counts_[comm.rank()]);
  BRAID_RETURN_IF_ERROR(comm.ReduceScatter(values_.data(), piece_.data(), split_counts_,
                                           DataType::kFloat32, ReduceOp::kSum));
  return comm.AllGather(piece_.data(), split_bytes_[comm.rank()], values_.data(),
                        split_bytes_);
}

absl::Status SparseBucket::ReduceAtIndices(absl::Span<const TensorView> tensors,
                                           absl::Span<const uint64_t> indices, int64_t status,
                                           transport::Communicator& comm, StepContext& ctx) {
  const int n = comm.size();
  const size_t k = indices.size();
  values_.assign(k + static_cast<size_t>(n), 0.0f);
  if (status == 0) Gather(tensors, indices, values_.data());
  // Exact in float32: small integers, and every other rank adds zero.
  values_[k + comm.rank()] = static_cast<float>(status);
  BRAID_RETURN_IF_ERROR(SumValues(comm));
  status_.assign(n, 0);
  bool failed = false;
  for (int r = 0; r < n; ++r) {
    status_[r] = static_cast<int64_t>(values_[k + r]);
    failed |= status_[r] != 0;
  }
  if (failed) return StatusError(tensors, status_);
  UpdateMemoryAndClear(tensors, indices);
  const float divisor = ctx.op == ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
  Scatter(tensors, indices, values_.data(), divisor, /*add=*/false);
  CountPayload(indices, sizeof(float), ctx);
  return absl::OkStatus();
}

}  // namespace braid::compression
