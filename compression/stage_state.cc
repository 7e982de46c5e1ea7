// CompressionStage's checkpoints (stage.h: SaveState's format) and the summaries the ranks
// compare before they apply a restored state (Note [Restoring compression state],
// state_summary.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/stage.h"
#include "compression/state_io.h"
#include "glog/logging.h"

namespace braid::compression {
namespace {

constexpr char kStateMagic[8] = {'B', 'R', 'D', 'C', 'M', 'P', 'S', 'T'};
constexpr uint32_t kStateVersion = 2;
// The least a method takes in the format: an empty spec, no tensors, an empty state.
constexpr size_t kMinMethodBytes = 8 + 4 + 8;

// Appends the summary of one method's tensors: the union of the stage's records and the
// tensors its compressor describes (a record without compressor state is a tensor still in
// its warm-up; the reverse only comes from a crafted state, and is compared all the same).
void AppendSummary(const std::string& spec, const Compressor& compressor,
                   const TensorRecords& records, StateSummary* out) {
  std::vector<SharedStateField> described;
  compressor.DescribeSharedState(&described);
  std::map<std::string, TensorSummary> by_tensor;
  for (const auto& [name, record] : records) {
    TensorSummary& t = by_tensor[name];
    t.steps = record.steps;
    t.shape = record.shape;
  }
  for (SharedStateField& f : described) {
    by_tensor[f.tensor].fields.push_back({std::move(f.field), f.value, f.hashed});
  }
  for (auto& [name, t] : by_tensor) {
    t.method = spec;
    t.tensor = name;
    std::sort(t.fields.begin(), t.fields.end(),
              [](const SummaryField& a, const SummaryField& b) { return a.name < b.name; });
    out->push_back(std::move(t));
  }
}

// One method's tensor records (format version 1: without shapes).
TensorRecords ReadRecords(StateReader& in, uint32_t version, const std::string& spec) {
  TensorRecords records;
  const uint32_t count =
      in.Count(absl::StrCat("tensor count of '", spec, "'"), version == 1 ? 16 : 20);
  for (uint32_t i = 0; i < count && in.status().ok(); ++i) {
    std::string name = in.String(absl::StrCat("tensor name in '", spec, "'"));
    TensorRecord r;
    r.steps = in.I64();
    const std::string what = absl::StrCat("tensor '", name, "' of '", spec, "'");
    in.Check(r.steps >= 0, absl::StrCat(what, ": negative step count ", r.steps));
    if (version > 1) {
      r.shape.resize(in.Count(absl::StrCat(what, ": dimension count"), 8));
      for (int64_t& d : r.shape) {
        d = in.I64();
        in.Check(d >= 0, absl::StrCat(what, ": negative dimension ", d));
      }
    }
    in.Check(records.count(name) == 0, absl::StrCat(what, " appears twice"));
    if (in.status().ok()) records.emplace(std::move(name), std::move(r));
  }
  return records;
}

}  // namespace

absl::StatusOr<std::string> CompressionStage::SaveState(int rank, int world_size) const {
  absl::MutexLock lock(&state_mu_);
  absl::MutexLock methods_lock(&methods_mu_);
  std::vector<const CompressionMethod*> saved;
  StateSummary summary;
  for (const auto& [spec, m] : methods_) {
    if (m->is_none() || m->compressor_ == nullptr) continue;
    saved.push_back(m.get());
    AppendSummary(m->spec(), *m->compressor_, m->tensors_, &summary);
  }
  std::string out;
  StateWriter w(&out);
  w.Bytes(kStateMagic, sizeof kStateMagic);
  w.U32(kStateVersion);
  w.U32(static_cast<uint32_t>(rank));
  w.U32(static_cast<uint32_t>(world_size));
  w.U64(SummaryDigest(summary));
  w.U32(static_cast<uint32_t>(saved.size()));
  for (const CompressionMethod* m : saved) {
    w.String(m->spec());
    w.U32(static_cast<uint32_t>(m->tensors_.size()));
    for (const auto& [name, record] : m->tensors_) {
      w.String(name);
      w.I64(record.steps);
      w.U32(static_cast<uint32_t>(record.shape.size()));
      for (int64_t d : record.shape) w.I64(d);
    }
    std::string blob;
    // Fails only copying state from a device to the host: then no checkpoint at all, never
    // one silently missing a method.
    absl::Status s = m->compressor_->SaveState(&blob);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("compression '", m->spec(),
                                                 "': saving its state: ", s.message()));
    }
    w.String(blob);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ParsedState>> CompressionStage::ParseState(
    absl::string_view state) const {
  StateReader in(state, "compression state");
  char magic[sizeof kStateMagic];
  in.Bytes(magic, sizeof magic);
  in.Check(std::memcmp(magic, kStateMagic, sizeof magic) == 0,
           "does not start with \"BRDCMPST\" (not a braid compression state)");
  const uint32_t version = in.U32();
  in.Check(version == 1 || version == kStateVersion,
           absl::StrCat("version ", version, ", this braid reads versions 1 to ", kStateVersion));
  auto parsed = std::make_unique<ParsedState>();
  parsed->saved_rank = static_cast<int32_t>(in.U32());
  parsed->saved_world_size = static_cast<int32_t>(in.U32());
  // The ranks compare who saved what (CheckLoadAgreement): a rank outside its world is no
  // state any rank saved.
  in.Check(parsed->saved_world_size >= 1 && parsed->saved_rank >= 0 &&
               parsed->saved_rank < parsed->saved_world_size,
           absl::StrCat("saved by rank ", parsed->saved_rank, " of a world of ",
                        parsed->saved_world_size, ", which has no such rank"));
  const uint64_t digest = version > 1 ? in.U64() : 0;
  const uint32_t count = in.Count("method count", kMinMethodBytes);
  for (uint32_t i = 0; i < count && in.status().ok(); ++i) {
    const std::string spec_text = in.String("method spec");
    TensorRecords records = ReadRecords(in, version, spec_text);
    const std::string blob = in.String(absl::StrCat("state of '", spec_text, "'"));
    if (!in.status().ok()) break;
    auto spec = ParseCompressionSpec(spec_text, options_.registry);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("compression state: ", spec.status().message()));
    }
    if (!in.Check(spec->canonical != "none" && parsed->methods.count(spec->canonical) == 0,
                  absl::StrCat("method '", spec_text, "' is 'none' or appears twice"))) {
      break;
    }
    auto compressor = CreateCompressor(*spec);
    if (!compressor.ok()) return compressor.status();
    absl::Status s = (*compressor)->LoadState(blob);
    if (!s.ok()) return s;
    const std::string canonical = spec->canonical;
    parsed->methods.emplace(canonical, ParsedState::Method{*std::move(spec),
                                                           *std::move(compressor),
                                                           std::move(records)});
  }
  in.Check(in.done(), "bytes left over after the last method");
  if (!in.status().ok()) return in.status();
  if (version > 1) {
    StateSummary summary;
    for (const auto& [spec, m] : parsed->methods) {
      AppendSummary(spec, *m.compressor, m.tensors, &summary);
    }
    const uint64_t actual = SummaryDigest(summary);
    if (actual != digest) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "compression state: its digest does not match its contents (saved %016x, computed "
          "%016x): the state was altered or damaged",
          digest, actual));
    }
  }
  return parsed;
}

StateSummary CompressionStage::Summarize(const ParsedState* pending) const {
  absl::MutexLock lock(&state_mu_);
  absl::MutexLock methods_lock(&methods_mu_);
  std::map<std::string, std::pair<const Compressor*, const TensorRecords*>> view;
  for (const auto& [spec, m] : methods_) {
    if (!m->is_none() && m->compressor_ != nullptr) {
      view[spec] = {m->compressor_.get(), &m->tensors_};
    }
  }
  if (pending != nullptr) {
    for (const auto& [spec, m] : pending->methods) view[spec] = {m.compressor.get(), &m.tensors};
  }
  StateSummary out;
  for (const auto& [spec, v] : view) AppendSummary(spec, *v.first, *v.second, &out);
  return out;
}

void CompressionStage::ApplyState(std::unique_ptr<ParsedState> state) {
  absl::MutexLock lock(&state_mu_);
  absl::MutexLock methods_lock(&methods_mu_);
  loaded_specs_.clear();
  for (auto& [spec, loaded] : state->methods) {
    CompressionMethod* m = FindOrAddLocked(std::move(loaded.spec));
    m->compressor_ = std::move(loaded.compressor);
    m->tensors_ = std::move(loaded.tensors);
    for (const auto& [name, record] : m->tensors_) loaded_specs_[name].push_back(m->spec());
  }
}

absl::Status CompressionStage::LoadState(absl::string_view state, int rank, int world_size) {
  auto parsed = ParseState(state);
  if (!parsed.ok()) return parsed.status();
  const int saved_size = (*parsed)->saved_world_size, saved_rank = (*parsed)->saved_rank;
  if (saved_size != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression state: saved by a job of ", saved_size, saved_size == 1 ? " rank" : " ranks",
        ", but this job has ", world_size, " (a state does not carry over to another world size)"));
  }
  if (saved_rank != rank) {
    LOG(WARNING) << "compression state saved by rank " << saved_rank << " of " << saved_size
                 << " is loaded on rank " << rank << ": error-feedback residuals are that rank's";
  }
  ApplyState(*std::move(parsed));
  return absl::OkStatus();
}

}  // namespace braid::compression
