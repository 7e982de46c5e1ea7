// The compression state of a rank for training checkpoints: saved (compression_state),
// restored by every rank together (LoadCompressionState: Note [Restoring compression state],
// compression/state_summary.h) and forgotten per tensor (ForgetCompressionState).
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/state_io.h"
#include "glog/logging.h"
#include "runtime/runtime_impl.h"

namespace braid {
namespace {

// The all-gather of the ranks' reports. A reserved name, like join's: a name of braid's own
// that no user collective is expected to take.
constexpr char kLoadReportName[] = "braid.load_compression_state";

}  // namespace

absl::StatusOr<std::string> Runtime::Impl::compression_state() const {
  BRAID_RETURN_IF_ERROR(CheckNoCompressionInFlight("compression_state()"));
  return stage_->SaveState(rank_, size_);
}

// Collective, so that no rank applies a state the others do not match: every rank joins
// the all-gather whatever became of its own state (a refusal travels in its report), and
// every rank reaches the verdict of CheckLoadAgreement on the same reports.
absl::Status Runtime::Impl::LoadCompressionState(absl::string_view state,
                                                 const absl::Status& refused) {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  compression::LoadReport mine;
  std::unique_ptr<compression::ParsedState> parsed;
  mine.refused = refused.ok() ? CheckNoCompressionInFlight("load_compression_state()") : refused;
  if (mine.refused.ok()) {
    auto p = stage_->ParseState(state);
    if (p.ok()) {
      parsed = *std::move(p);
    } else {
      mine.refused = p.status();
    }
  }
  if (parsed != nullptr) {
    mine.saved_rank = parsed->saved_rank;
    mine.saved_world_size = parsed->saved_world_size;
    mine.summary = stage_->Summarize(parsed.get());
  }
  BRAID_ASSIGN_OR_RETURN(std::vector<compression::LoadReport> all, GatherLoadReports(mine));
  BRAID_RETURN_IF_ERROR(compression::CheckLoadAgreement(all, size_));
  if (parsed->saved_rank != rank_) {  // the ranks' states permuted: the sum is unchanged
    LOG(WARNING) << "compression state saved by rank " << parsed->saved_rank
                 << " is loaded on rank " << rank_
                 << ": its error-feedback residuals are that rank's";
  }
  stage_->ApplyState(std::move(parsed));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<compression::LoadReport>> Runtime::Impl::GatherLoadReports(
    const compression::LoadReport& mine) {
  // Each rank's block: u64 length, then its report, so the gathered bytes split without
  // knowing every rank's length beforehand.
  std::string block;
  compression::StateWriter w(&block);
  w.String(compression::EncodeLoadReport(mine));
  CollectiveRequest r;
  r.name = kLoadReportName;
  r.collective = Collective::kAllGather;
  r.dtype = DataType::kUInt8;
  r.shape = {static_cast<int64_t>(block.size())};
  r.input = block.data();
  auto handle = Enqueue(std::move(r));
  absl::Status s = handle.ok() ? (*handle)->Wait() : handle.status();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("load_compression_state: comparing the ranks' "
                                               "states failed, none was loaded: ", s.message()));
  }
  const std::vector<char>& out = (*handle)->output();
  compression::StateReader in(absl::string_view(out.data(), out.size()),
                              "load_compression_state: the ranks' reports");
  std::vector<compression::LoadReport> all;
  for (int rank = 0; rank < size_ && in.status().ok(); ++rank) {
    auto report = compression::DecodeLoadReport(in.String());
    if (!report.ok()) {
      return absl::InternalError(absl::StrCat("rank ", rank, "'s ", report.status().message()));
    }
    all.push_back(*std::move(report));
  }
  in.Check(in.done(), "bytes left over");
  if (!in.status().ok()) return absl::InternalError(in.status().message());
  return all;
}

absl::StatusOr<int> Runtime::Impl::ForgetCompressionState(absl::Span<const std::string> names) {
  const absl::flat_hash_set<std::string> forgetting(names.begin(), names.end());
  BRAID_RETURN_IF_ERROR(controller_.CheckNoneInFlight(
      [&](const TensorEntry& e) { return forgetting.contains(e.req.name); },
      [&](const std::string& name) {
        return absl::StrCat("forgetting the compression state of '", name, "' on rank ", rank_,
                            " while its all-reduce is in flight: synchronize it first");
      }));
  return stage_->ForgetTensors(names);
}

}  // namespace braid
