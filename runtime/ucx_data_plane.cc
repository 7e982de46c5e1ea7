#include "absl/status/status.h"
#include "runtime/data_plane.h"
#include "runtime/registration.h"

namespace braid {
namespace {

class UcxDataPlane final : public DataPlane {
 public:
  explicit UcxDataPlane(const RuntimeConfig& config) : config_(config) {}

  absl::StatusOr<transport::PeerAddress> Open(const LaunchInfo& launch) override {
    auto worker = transport::OpenUcxWorker(UcxOptionsFromConfig(config_, launch.rank, launch.size));
    if (!worker.ok()) return worker.status();
    worker_ = *std::move(worker);
    return worker_->self();
  }

  absl::StatusOr<std::unique_ptr<transport::Communicator>> Connect(
      int /*rank: ConnectUcx finds this worker in the list*/,
      std::vector<transport::PeerAddress> peers) override {
    if (worker_ == nullptr) return absl::FailedPreconditionError("UCX: Connect before Open");
    return transport::ConnectUcx(std::move(worker_), std::move(peers));
  }

 private:
  const RuntimeConfig config_;
  std::unique_ptr<transport::UcxWorker> worker_;
};

}  // namespace

std::unique_ptr<DataPlane> MakeUcxDataPlane(const RuntimeConfig& config) {
  return std::make_unique<UcxDataPlane>(config);
}

}  // namespace braid
