#include "compression/stage.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compression/methods.h"
#include "compression/state_io.h"
#include "glog/logging.h"

namespace braid::compression {

CompressionStage::CompressionStage(const StageOptions& options) : options_(options) {
  absl::MutexLock lock(&methods_mu_);
  none_ = FindOrAddLocked(*ParseCompressionSpec("none", options_.registry));
  none_->compressor_ = MakeNoneCompressor();
  plain_ = MakeNoneCompressor();
}

CompressionStage::~CompressionStage() = default;

absl::StatusOr<std::string> CompressionStage::Canonicalize(absl::string_view spec) const {
  auto parsed = ParseCompressionSpec(spec, options_.registry);
  if (!parsed.ok()) return parsed.status();
  return parsed->canonical;
}

CompressionMethod* CompressionStage::FindOrAddLocked(CompressionSpec spec) {
  auto it = methods_.find(spec.canonical);
  if (it != methods_.end()) return it->second.get();
  const std::string canonical = spec.canonical;
  auto method = std::unique_ptr<CompressionMethod>(new CompressionMethod(std::move(spec)));
  return methods_.emplace(canonical, std::move(method)).first->second.get();
}

absl::StatusOr<const CompressionMethod*> CompressionStage::Resolve(absl::string_view spec) {
  absl::MutexLock lock(&methods_mu_);
  auto it = by_text_.find(spec);
  if (it != by_text_.end()) return it->second;
  auto parsed = ParseCompressionSpec(spec, options_.registry);
  if (!parsed.ok()) return parsed.status();
  CompressionMethod* m = FindOrAddLocked(*std::move(parsed));
  by_text_.emplace(std::string(spec), m);
  return m;
}

PlannedBucket::PlannedBucket(PlannedBucket&& other) noexcept
    : stage_(other.stage_), method_(other.method_), tensors_(other.tensors_),
      plans_(other.plans_), device_(other.device_) {
  other.stage_ = nullptr;  // the lock moves with it
}

// The lock was taken by CompressionStage::Plan on this thread (Note [Bucket reduction]).
PlannedBucket::~PlannedBucket() {
  if (stage_ != nullptr) stage_->state_mu_.Unlock();
}

void CompressionStage::PlanLocked(CompressionMethod& m, absl::Span<const BucketTensor> tensors) {
  plans_.assign(tensors.size(), TensorPlan{});
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorPlan& p = plans_[i];
    if (!loaded_specs_.empty()) WarnIfLoadedForAnother(m, tensors[i].name);
    if (m.is_none()) {
      p.work_dtype = tensors[i].dtype;
      p.separate_input = true;
      p.separate_output = m.compressor_->WritesSeparateOutput();
      continue;
    }
    auto record = m.tensors_.find(tensors[i].name);
    p.step = record == m.tensors_.end() ? 0 : record->second.steps;
    p.warm_up = p.step < m.spec_.start_step;
    const bool native = !p.warm_up && m.compressor_->TakesNatively(tensors[i].dtype);
    p.work_dtype = native ? tensors[i].dtype : DataType::kFloat32;
    p.separate_input = p.warm_up || m.compressor_->ReadsSeparateInput();
    p.separate_output = p.warm_up ? plain_->WritesSeparateOutput()
                                  : m.compressor_->WritesSeparateOutput();
  }
}

// A tensor's first bucket after a load: a state loaded for another spec (another method, or
// options that change the arithmetic, e.g. fp4's chunk) is not this method's, and the tensor
// starts from a fresh one; said once, since nothing else would show it.
void CompressionStage::WarnIfLoadedForAnother(const CompressionMethod& m,
                                              absl::string_view name) {
  auto it = loaded_specs_.find(name);
  if (it == loaded_specs_.end()) return;
  if (std::find(it->second.begin(), it->second.end(), m.spec()) == it->second.end()) {
    LOG(WARNING) << "tensor '" << name << "': its compression state was loaded for '"
                 << absl::StrJoin(it->second, "', '") << "', but it now runs under '"
                 << m.spec() << "', which starts from a fresh state (the loaded one stays "
                 << "unused)";
  }
  loaded_specs_.erase(it);
}

absl::StatusOr<PlannedBucket> CompressionStage::Plan(const CompressionMethod& method,
                                                     absl::Span<const BucketTensor> tensors,
                                                     device::Device* device) {
  state_mu_.Lock();  // released by the PlannedBucket, or below on an error
  // The stage owns every method; callers hold them const so only the stage changes them.
  CompressionMethod& m = const_cast<CompressionMethod&>(method);
  if (m.compressor_ == nullptr) {
    auto created = CreateCompressor(m.spec_);
    if (!created.ok()) {
      state_mu_.Unlock();
      return created.status();
    }
    m.compressor_ = *std::move(created);
  }
  PlanLocked(m, tensors);
  PlannedBucket planned(this, &m, tensors, plans_);
  if (device != nullptr) planned.device_ = device;
  return planned;
}

absl::Status CompressionStage::CheckPacked(const PlannedBucket& bucket,
                                           absl::Span<const TensorView> views,
                                           absl::Span<TensorBytes> bytes) const {
  const CompressionMethod& m = *bucket.method_;
  const absl::Span<const BucketTensor> tensors = bucket.tensors_;
  if (!bytes.empty() && bytes.size() != tensors.size()) {
    return absl::InternalError(absl::StrCat("compression '", m.spec(), "': ", bytes.size(),
                                            " byte counts for ", tensors.size(), " tensors"));
  }
  if (views.size() != tensors.size()) {
    return absl::InternalError(absl::StrCat("compression '", m.spec(), "': ", views.size(),
                                            " views packed for ", tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].dtype != plans_[i].work_dtype || views[i].count != tensors[i].count) {
      return absl::InternalError(absl::StrCat(
          "compression '", m.spec(), "': tensor '", tensors[i].name, "' was packed as ",
          views[i].count, " x ", DataTypeName(views[i].dtype), ", planned ",
          tensors[i].count, " x ", DataTypeName(plans_[i].work_dtype)));
    }
    // A gathered view whose compressor would write its result to `data` would lose it.
    if (views[i].output != nullptr &&
        (!plans_[i].separate_output || views[i].input == nullptr)) {
      return absl::InternalError(absl::StrCat(
          "compression '", m.spec(), "': tensor '", tensors[i].name,
          "' was laid out gathered (TensorView::output), which its plan does not allow"));
    }
  }
  return absl::OkStatus();
}

absl::Status CompressionStage::Reduce(PlannedBucket bucket, absl::Span<const TensorView> views,
                                      ReduceOp op, transport::Communicator& comm,
                                      absl::Span<TensorBytes> bytes) {
  const PlannedBucket held = std::move(bucket);  // the lock, released as it goes
  if (held.stage_ != this) {
    return absl::InternalError("compression: a bucket was reduced by a stage that did not "
                               "plan it, or twice");
  }
  BRAID_RETURN_IF_ERROR(CheckPacked(held, views, bytes));
  // The compressors' arithmetic is host code; none only calls the data plane's collectives,
  // which the plane for the bucket's memory carries.
  if (!held.method_->is_none() && !held.device_->host_accessible()) {
    const absl::Status s = absl::FailedPreconditionError(absl::StrCat(
        "compression '", held.method_->spec(), "': the bucket is in ",
        DeviceName(held.device_->ref()), " memory, which braid's compressors cannot read yet"));
    comm.Abort(s);  // the peers are in the bucket's collectives
    return s;
  }
  device_ = held.device_;
  if (bytes.empty()) {
    bytes_scratch_.assign(views.size(), TensorBytes{});
    bytes = absl::MakeSpan(bytes_scratch_);
  }
  return ReduceLocked(*held.method_, held.tensors_, views, op, comm, bytes);
}

absl::Status CompressionStage::ReduceLocked(CompressionMethod& m,
                                            absl::Span<const BucketTensor> tensors,
                                            absl::Span<const TensorView> views, ReduceOp op,
                                            transport::Communicator& comm,
                                            absl::Span<TensorBytes> bytes) {
  // Warm-up tensors first, then the compressed ones: each part is one Reduce call.
  for (const bool warm_up : {true, false}) {
    part_.clear();
    part_index_.clear();
    for (size_t i = 0; i < views.size(); ++i) {
      if (plans_[i].warm_up != warm_up) continue;
      part_.push_back(views[i]);
      if (!plans_[i].separate_input) part_.back().input = nullptr;
      part_index_.push_back(i);
    }
    if (part_.empty()) continue;
    Compressor& c = warm_up ? *plain_ : *m.compressor_;
    absl::Status s = ReducePart(c, warm_up, m.spec_.start_step, part_, op, comm, bytes);
    if (!s.ok()) return s;
    if (m.is_none()) continue;
    for (size_t i : part_index_) {
      auto it = m.tensors_.find(tensors[i].name);
      if (it == m.tensors_.end()) {
        it = m.tensors_.emplace(std::string(tensors[i].name), TensorRecord{}).first;
      }
      ++it->second.steps;
      it->second.shape.assign(tensors[i].shape.begin(), tensors[i].shape.end());
    }
  }
  return absl::OkStatus();
}

absl::Status CompressionStage::ReducePart(Compressor& compressor, bool warm_up,
                                          int64_t start_step,
                                          absl::Span<const TensorView> views, ReduceOp op,
                                          transport::Communicator& comm,
                                          absl::Span<TensorBytes> bytes) {
  payload_.assign(views.size(), 0);
  step_values_.clear();
  for (size_t i : part_index_) step_values_.push_back(plans_[i].step - start_step);
  StepContext ctx;
  ctx.op = op;
  ctx.seed = options_.seed;
  ctx.steps = step_values_;
  ctx.payload_bytes = absl::MakeSpan(payload_);
  ctx.device = device_;
  const uint64_t before = comm.stats().bytes_sent;
  absl::Status s = compressor.Reduce(views, comm, ctx);
  if (!s.ok()) return s;
  const uint64_t sent = comm.stats().bytes_sent - before;
  uint64_t total_payload = 0;
  for (uint64_t p : payload_) total_payload += p;
  for (size_t k = 0; k < views.size(); ++k) {
    TensorBytes& b = bytes[part_index_[k]];
    b.warm_up = warm_up;
    b.payload_bytes = payload_[k];
    // The part's bytes on the wire, apportioned by payload share.
    b.transport_bytes = total_payload == 0 ? 0
                                           : static_cast<uint64_t>(
                                                 static_cast<double>(sent) * payload_[k] /
                                                     total_payload + 0.5);
  }
  return absl::OkStatus();
}

absl::Status CompressionStage::Reduce(const CompressionMethod& method,
                                      absl::Span<const TensorView> views, ReduceOp op,
                                      transport::Communicator& comm,
                                      absl::Span<TensorBytes> bytes) {
  std::vector<BucketTensor> tensors;
  tensors.reserve(views.size());
  for (const TensorView& v : views) tensors.push_back({v.name, v.shape, v.dtype, v.count});
  BRAID_ASSIGN_OR_RETURN(PlannedBucket planned, Plan(method, tensors));
  return Reduce(std::move(planned), views, op, comm, bytes);
}

int CompressionStage::ForgetTensors(absl::Span<const std::string> names) {
  absl::MutexLock lock(&state_mu_);
  absl::MutexLock methods_lock(&methods_mu_);
  int forgotten = 0;
  for (auto& [spec, m] : methods_) {
    for (const std::string& name : names) {
      auto it = m->tensors_.find(name);
      if (it == m->tensors_.end()) continue;
      m->tensors_.erase(it);
      if (m->compressor_ != nullptr) m->compressor_->Reset(name);
      ++forgotten;
    }
  }
  return forgotten;
}

}  // namespace braid::compression
