#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/data_plane.h"
#include "runtime/registration.h"

namespace braid {
namespace {

class UcxDataPlane final : public DataPlane {
 public:
  UcxDataPlane(const RuntimeConfig& config, const std::string& job_secret)
      : config_(config), job_secret_(job_secret) {}

  absl::StatusOr<transport::PeerAddress> Open(const LaunchInfo& launch) override {
    transport::UcxOptions uo = UcxOptionsFromConfig(config_, launch.rank, launch.size);
    // Note [Who may join]: the data plane accepts only messages whose tags the job's secret
    // keyed (transport/tag.h, Note [Tag layout]).
    uo.pair_tag = KeyedDataPlaneTags(job_secret_);
    auto worker = transport::OpenUcxWorker(uo);
    if (!worker.ok()) return worker.status();
    worker_ = *std::move(worker);
    return worker_->self();
  }

  absl::StatusOr<transport::Channels> Connect(
      int /*rank: ConnectUcx finds this worker in the list*/,
      std::vector<transport::PeerAddress> peers) override {
    if (worker_ == nullptr) return absl::FailedPreconditionError("UCX: Connect before Open");
    auto channels = transport::ConnectUcxChannels(std::move(worker_), std::move(peers));
    if (!channels.ok()) return channels.status();
    // No rank leaves Init before every rank has connected to it: a rank that returned and
    // shut down at once would remove the shared memory a slower peer is still attaching to
    // (UCX: "shmat ... Invalid argument", the slower peer's Init failing). The barrier's
    // messages travel every endpoint, so each is connected when it completes.
    absl::Status s = channels->control->Barrier();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("UCX: the ranks' first barrier after connecting: ",
                                                 s.message()));
    }
    return channels;
  }

 private:
  const RuntimeConfig config_;
  const std::string job_secret_;
  std::unique_ptr<transport::UcxWorker> worker_;
};

}  // namespace

std::unique_ptr<DataPlane> MakeUcxDataPlane(const RuntimeConfig& config,
                                            const std::string& job_secret) {
  return std::make_unique<UcxDataPlane>(config, job_secret);
}

}  // namespace braid
