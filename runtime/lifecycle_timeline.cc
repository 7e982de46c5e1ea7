// The runtime's timeline (timeline.h) across its lifecycle: opened at init
// (BRAID_TIMELINE), started and stopped while the job runs (start_timeline/stop_timeline).
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/runtime_impl.h"

namespace braid {

absl::Status Runtime::Impl::OpenTimeline(const std::string& path) {
  std::shared_ptr<Timeline> opened;
  if (!path.empty()) {
    // Rank 0 writes the path itself, rank r writes PATH.rank<r>.
    TimelineOptions options;
    options.max_bytes = timeline_max_bytes_;
    BRAID_ASSIGN_OR_RETURN(
        opened, Timeline::Open(rank_ == 0 ? path : absl::StrCat(path, ".rank", rank_), rank_,
                               options));
  }
  std::shared_ptr<Timeline> old;
  {
    absl::MutexLock lock(&timeline_mu_);
    old = std::exchange(timeline_, std::move(opened));
  }
  // What was recorded before the swap is in the file when this returns (stop_timeline, then
  // read the file): its writer thread may not have run yet. `old` closes (valid JSON) when
  // its last user is done; a bucket that began before the swap still ends in it.
  if (old) old->Flush();
  return absl::OkStatus();
}

std::shared_ptr<Timeline> Runtime::Impl::timeline() const {
  absl::MutexLock lock(&timeline_mu_);
  return timeline_;
}

absl::Status Runtime::Impl::StartTimeline(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("start_timeline needs a file path");
  absl::MutexLock lifecycle(&lifecycle_mu_);
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  return OpenTimeline(path);
}

absl::Status Runtime::Impl::StopTimeline() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  return OpenTimeline("");
}

absl::Status Runtime::StartTimeline(const std::string& path) {
  return impl_->StartTimeline(path);
}
absl::Status Runtime::StopTimeline() { return impl_->StopTimeline(); }

}  // namespace braid
