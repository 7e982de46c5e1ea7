#include "compression/stage.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/state_io.h"
#include "glog/logging.h"

namespace braid::compression {
namespace {

uint64_t ReferenceTransport(uint64_t bytes, int n) {
  return n <= 1 ? 0 : 2 * bytes * static_cast<uint64_t>(n - 1) / static_cast<uint64_t>(n);
}

// Counters of one reduction sent as is (no compression, or a warm-up step).
ByteStats Plain(uint64_t bytes, uint64_t transport_bytes, int n) {
  ByteStats b;
  b.reductions = 1;
  b.uncompressed_bytes = b.payload_bytes = bytes;
  b.transport_bytes = transport_bytes;
  b.reference_transport_bytes = ReferenceTransport(bytes, n);
  return b;
}

}  // namespace

void ByteStats::Add(const ByteStats& o) {
  reductions += o.reductions;
  uncompressed_bytes += o.uncompressed_bytes;
  payload_bytes += o.payload_bytes;
  transport_bytes += o.transport_bytes;
  reference_transport_bytes += o.reference_transport_bytes;
}

double ByteStats::compression_ratio() const {
  return payload_bytes == 0 ? 0.0
                            : static_cast<double>(uncompressed_bytes) /
                                  static_cast<double>(payload_bytes);
}

absl::StatusOr<std::string> CompressionStage::Canonicalize(absl::string_view spec) const {
  auto parsed = ParseCompressionSpec(spec, options_.registry);
  if (!parsed.ok()) return parsed.status();
  return parsed->canonical;
}

absl::StatusOr<CompressionStage::Method*> CompressionStage::GetMethod(const std::string& spec) {
  auto it = methods_.find(spec);
  if (it != methods_.end()) return &it->second;
  auto parsed = ParseCompressionSpec(spec, options_.registry);
  if (!parsed.ok()) return parsed.status();
  auto compressor = CreateCompressor(*parsed);
  if (!compressor.ok()) return compressor.status();
  Method m{*std::move(parsed), *std::move(compressor)};
  return &methods_.emplace(spec, std::move(m)).first->second;
}

absl::Status CompressionStage::Reduce(const std::string& spec,
                                      absl::Span<const TensorView> tensors,
                                      size_t element_bytes, ReduceOp op,
                                      transport::Communicator& comm) {
  absl::MutexLock state_lock(&state_mu_);
  auto method = GetMethod(spec);
  if (!method.ok()) return method.status();
  Method& m = **method;
  const int n = comm.size();

  // Split the bucket: tensors in warm-up go plain. Steps are counted identically on every
  // rank (same tensors, same order), so every rank splits the bucket the same way.
  std::vector<TensorView> compressed;
  std::vector<int64_t*> counters;
  for (const TensorView& t : tensors) {
    int64_t& step = steps_[{spec, std::string(t.name)}];
    if (step < m.spec.start_step) {
      const uint64_t before = comm.stats().bytes_sent;
      absl::Status s = comm.AllReduce(t.data, t.data, t.count, DataType::kFloat32, op);
      if (!s.ok()) return s;
      ++step;
      Record(t.name, spec, Plain(t.count * element_bytes, comm.stats().bytes_sent - before, n));
      continue;
    }
    compressed.push_back(t);
    counters.push_back(&step);
  }
  if (compressed.empty()) return absl::OkStatus();

  payload_.assign(compressed.size(), 0);
  step_values_.clear();
  for (int64_t* c : counters) step_values_.push_back(*c - m.spec.start_step);
  StepContext ctx;
  ctx.op = op;
  ctx.seed = options_.seed;
  ctx.steps = step_values_;
  ctx.payload_bytes = absl::MakeSpan(payload_);
  const uint64_t before = comm.stats().bytes_sent;
  absl::Status s = m.compressor->Reduce(compressed, comm, ctx);
  if (!s.ok()) return s;
  const uint64_t sent = comm.stats().bytes_sent - before;
  uint64_t total_payload = 0;
  for (uint64_t p : payload_) total_payload += p;
  for (size_t i = 0; i < compressed.size(); ++i) {
    ++*counters[i];
    ByteStats b;
    b.reductions = 1;
    b.uncompressed_bytes = compressed[i].count * element_bytes;
    b.payload_bytes = payload_[i];
    // The bucket's bytes on the wire, apportioned by payload share.
    b.transport_bytes =
        total_payload == 0 ? 0 : static_cast<uint64_t>(static_cast<double>(sent) * payload_[i] / total_payload + 0.5);
    b.reference_transport_bytes = ReferenceTransport(b.uncompressed_bytes, n);
    Record(compressed[i].name, spec, b);
  }
  return absl::OkStatus();
}

void CompressionStage::RecordUncompressed(absl::string_view name, uint64_t bytes,
                                          uint64_t transport_bytes, int world_size) {
  Record(name, "none", Plain(bytes, transport_bytes, world_size));
}

void CompressionStage::Record(absl::string_view name, const std::string& method,
                              const ByteStats& b) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = stats_.try_emplace({std::string(name), method});
  it->second.Add(b);
  MethodCompressionStats& m = totals_[method];
  if (inserted) {
    m.method = method;
    ++m.tensors;
  }
  m.bytes.Add(b);
}

CompressionReport CompressionStage::Report() const {
  CompressionReport r;
  absl::MutexLock lock(&mu_);
  r.tensors.reserve(stats_.size());
  for (const auto& [key, b] : stats_) r.tensors.push_back({key.first, key.second, b});
  for (const auto& [method, m] : totals_) r.methods.push_back(m);
  return r;
}

std::vector<MethodCompressionStats> CompressionStage::MethodTotals() const {
  std::vector<MethodCompressionStats> out;
  absl::MutexLock lock(&mu_);
  out.reserve(totals_.size());
  for (const auto& [method, m] : totals_) out.push_back(m);
  return out;
}

namespace {
constexpr char kStateMagic[8] = {'B', 'R', 'D', 'C', 'M', 'P', 'S', 'T'};
constexpr uint32_t kStateVersion = 1;
}  // namespace

std::string CompressionStage::SaveState(int rank, int world_size) const {
  absl::MutexLock lock(&state_mu_);
  std::string out;
  StateWriter w(&out);
  w.Bytes(kStateMagic, sizeof kStateMagic);
  w.U32(kStateVersion);
  w.U32(static_cast<uint32_t>(rank));
  w.U32(static_cast<uint32_t>(world_size));
  w.U32(static_cast<uint32_t>(methods_.size()));
  for (const auto& [spec, m] : methods_) {
    w.String(spec);
    std::vector<std::pair<std::string, int64_t>> steps;
    for (auto it = steps_.lower_bound({spec, ""}); it != steps_.end() && it->first.first == spec;
         ++it) {
      steps.emplace_back(it->first.second, it->second);
    }
    w.U32(static_cast<uint32_t>(steps.size()));
    for (const auto& [name, n] : steps) {
      w.String(name);
      w.I64(n);
    }
    std::string blob;
    // The compressors' SaveState cannot fail today; a failure would be a bug worth a crash
    // rather than a checkpoint silently missing a method.
    absl::Status s = m.compressor->SaveState(&blob);
    CHECK(s.ok()) << "compression '" << spec << "': SaveState: " << s;
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
    Method method;
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
    loaded.emplace(canonical,
                   Loaded{Method{*std::move(spec), *std::move(compressor)}, std::move(steps)});
  }
  in.Check(in.done(), "bytes left over after the last method");
  if (!in.status().ok()) return in.status();
  if (saved_rank != rank || saved_size != world_size) {
    LOG(WARNING) << "compression state saved by rank " << saved_rank << " of " << saved_size
                 << " is loaded on rank " << rank << " of " << world_size
                 << ": error-feedback residuals are that rank's";
  }
  absl::MutexLock lock(&state_mu_);
  for (auto& [spec, l] : loaded) {
    for (auto it = steps_.lower_bound({spec, ""}); it != steps_.end() && it->first.first == spec;) {
      it = steps_.erase(it);
    }
    for (const auto& [name, n] : l.steps) steps_[{spec, name}] = n;
    methods_.insert_or_assign(spec, std::move(l.method));
  }
  return absl::OkStatus();
}

}  // namespace braid::compression
