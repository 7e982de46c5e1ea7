#include "compression/stage.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
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

void CompressionStage::Plan(CompressionMethod& m, absl::Span<const BucketTensor> tensors) {
  plans_.assign(tensors.size(), TensorPlan{});
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorPlan& p = plans_[i];
    if (m.is_none()) {
      p.work_dtype = tensors[i].dtype;
      p.separate_input = true;
      continue;
    }
    auto step = m.steps_.find(tensors[i].name);
    p.step = step == m.steps_.end() ? 0 : step->second;
    p.warm_up = p.step < m.spec_.start_step;
    const bool native = !p.warm_up && m.compressor_->TakesNatively(tensors[i].dtype);
    p.work_dtype = native ? tensors[i].dtype : DataType::kFloat32;
    p.separate_input = p.warm_up || m.compressor_->ReadsSeparateInput();
  }
}

absl::Status CompressionStage::Reduce(const CompressionMethod& method,
                                      absl::Span<const BucketTensor> tensors, ReduceOp op,
                                      transport::Communicator& comm, const PackFn& pack,
                                      absl::Span<TensorBytes> bytes) {
  absl::MutexLock lock(&state_mu_);
  // The stage owns every method; callers hold them const so only the stage changes them.
  CompressionMethod& m = const_cast<CompressionMethod&>(method);
  if (!bytes.empty() && bytes.size() != tensors.size()) {
    return absl::InternalError(absl::StrCat("compression '", m.spec(), "': ", bytes.size(),
                                            " byte counts for ", tensors.size(), " tensors"));
  }
  if (m.compressor_ == nullptr) {
    auto created = CreateCompressor(m.spec_);
    if (!created.ok()) return created.status();
    m.compressor_ = *std::move(created);
  }
  Plan(m, tensors);
  auto views = pack(plans_);
  if (!views.ok()) return views.status();
  if (views->size() != tensors.size()) {
    return absl::InternalError(absl::StrCat("compression '", m.spec(), "': ", views->size(),
                                            " views packed for ", tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < views->size(); ++i) {
    if ((*views)[i].dtype != plans_[i].work_dtype || (*views)[i].count != tensors[i].count) {
      return absl::InternalError(absl::StrCat(
          "compression '", m.spec(), "': tensor '", tensors[i].name, "' was packed as ",
          (*views)[i].count, " x ", DataTypeName((*views)[i].dtype), ", planned ",
          tensors[i].count, " x ", DataTypeName(plans_[i].work_dtype)));
    }
  }
  if (bytes.empty()) {
    bytes_scratch_.assign(tensors.size(), TensorBytes{});
    bytes = absl::MakeSpan(bytes_scratch_);
  }
  // Warm-up tensors first, then the compressed ones: each part is one Reduce call.
  for (const bool warm_up : {true, false}) {
    part_.clear();
    part_index_.clear();
    for (size_t i = 0; i < views->size(); ++i) {
      if (plans_[i].warm_up != warm_up) continue;
      part_.push_back((*views)[i]);
      if (!plans_[i].separate_input) part_.back().input = nullptr;
      part_index_.push_back(i);
    }
    if (part_.empty()) continue;
    Compressor& c = warm_up ? *plain_ : *m.compressor_;
    absl::Status s = ReducePart(c, warm_up, m.spec_.start_step, part_, op, comm, bytes);
    if (!s.ok()) return s;
    if (m.is_none()) continue;
    for (size_t i : part_index_) {
      auto it = m.steps_.find(tensors[i].name);
      if (it == m.steps_.end()) it = m.steps_.emplace(std::string(tensors[i].name), 0).first;
      ++it->second;
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
  return Reduce(method, tensors, op, comm,
                [views](absl::Span<const TensorPlan>) -> absl::StatusOr<absl::Span<const TensorView>> {
                  return views;
                },
                bytes);
}

namespace {
constexpr char kStateMagic[8] = {'B', 'R', 'D', 'C', 'M', 'P', 'S', 'T'};
constexpr uint32_t kStateVersion = 1;
}  // namespace

int CompressionStage::ForgetTensors(absl::Span<const std::string> names) {
  absl::MutexLock lock(&state_mu_);
  absl::MutexLock methods_lock(&methods_mu_);
  int forgotten = 0;
  for (auto& [spec, m] : methods_) {
    for (const std::string& name : names) {
      auto it = m->steps_.find(name);
      if (it == m->steps_.end()) continue;
      m->steps_.erase(it);
      if (m->compressor_ != nullptr) m->compressor_->Reset(name);
      ++forgotten;
    }
  }
  return forgotten;
}

std::string CompressionStage::SaveState(int rank, int world_size) const {
  absl::MutexLock lock(&state_mu_);
  absl::MutexLock methods_lock(&methods_mu_);
  std::vector<const CompressionMethod*> saved;
  for (const auto& [spec, m] : methods_) {
    if (!m->is_none() && m->compressor_ != nullptr) saved.push_back(m.get());
  }
  std::string out;
  StateWriter w(&out);
  w.Bytes(kStateMagic, sizeof kStateMagic);
  w.U32(kStateVersion);
  w.U32(static_cast<uint32_t>(rank));
  w.U32(static_cast<uint32_t>(world_size));
  w.U32(static_cast<uint32_t>(saved.size()));
  for (const CompressionMethod* m : saved) {
    w.String(m->spec());
    w.U32(static_cast<uint32_t>(m->steps_.size()));
    for (const auto& [name, n] : m->steps_) {
      w.String(name);
      w.I64(n);
    }
    std::string blob;
    // The compressors' SaveState cannot fail today; a failure would be a bug worth a crash
    // rather than a checkpoint silently missing a method.
    absl::Status s = m->compressor_->SaveState(&blob);
    CHECK(s.ok()) << "compression '" << m->spec() << "': SaveState: " << s;
    w.String(blob);
  }
  return out;
}

absl::Status CompressionStage::LoadState(absl::string_view state, int rank, int world_size) {
  StateReader in(state, "compression state");
  char magic[sizeof kStateMagic];
  in.Bytes(magic, sizeof magic);
  in.Check(std::memcmp(magic, kStateMagic, sizeof magic) == 0,
           "does not start with \"BRDCMPST\" (not a braid compression state)");
  const uint32_t version = in.U32();
  in.Check(version == kStateVersion,
           absl::StrCat("version ", version, ", this braid reads version ", kStateVersion));
  const int saved_rank = static_cast<int>(in.U32());
  const int saved_size = static_cast<int>(in.U32());
  const uint32_t count = in.U32();
  struct Loaded {
    CompressionSpec spec;
    std::unique_ptr<Compressor> compressor;
    std::vector<std::pair<std::string, int64_t>> steps;
  };
  std::map<std::string, Loaded> loaded;
  for (uint32_t i = 0; i < count && in.status().ok(); ++i) {
    const std::string spec_text = in.String();
    std::vector<std::pair<std::string, int64_t>> steps(in.U32());
    for (auto& [name, n] : steps) {
      if (!in.status().ok()) break;
      name = in.String();
      n = in.I64();
      in.Check(n >= 0, absl::StrCat("tensor '", name, "': negative step count ", n));
    }
    const std::string blob = in.String();
    if (!in.status().ok()) break;
    auto spec = ParseCompressionSpec(spec_text, options_.registry);
    if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat("compression state: ", spec.status().message()));
    if (spec->canonical == "none" || loaded.count(spec->canonical)) {
      in.Check(false, absl::StrCat("method '", spec_text, "' is 'none' or appears twice"));
      break;
    }
    auto compressor = CreateCompressor(*spec);
    if (!compressor.ok()) return compressor.status();
    BRAID_RETURN_IF_ERROR((*compressor)->LoadState(blob));
    const std::string canonical = spec->canonical;
    loaded.emplace(canonical, Loaded{*std::move(spec), *std::move(compressor), std::move(steps)});
  }
  in.Check(in.done(), "bytes left over after the last method");
  if (!in.status().ok()) return in.status();
  if (saved_rank != rank || saved_size != world_size) {
    LOG(WARNING) << "compression state saved by rank " << saved_rank << " of " << saved_size
                 << " is loaded on rank " << rank << " of " << world_size
                 << ": error-feedback residuals are that rank's";
  }
  absl::MutexLock lock(&state_mu_);
  absl::MutexLock methods_lock(&methods_mu_);
  for (auto& [spec, l] : loaded) {
    CompressionMethod* m = FindOrAddLocked(std::move(l.spec));
    m->compressor_ = std::move(l.compressor);
    m->steps_.clear();
    for (const auto& [name, n] : l.steps) m->steps_[name] = n;
  }
  return absl::OkStatus();
}

}  // namespace braid::compression
