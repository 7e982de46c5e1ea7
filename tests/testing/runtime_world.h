// Several ranks of braid::Runtime in one process, each with its parts injected (Note
// [Injected parts], runtime/runtime.h): the in-process coordinator of
// coordinator/local_coordinator.h and the in-process communicators of
// transport/local_communicator.h. Every rank runs the real runtime (queue, negotiation,
// fusion, the all-reduce pipeline, handles) on its own threads; only gRPC and UCX are absent.
// Header-only.
#ifndef BRAID_TESTS_TESTING_RUNTIME_WORLD_H_
#define BRAID_TESTS_TESTING_RUNTIME_WORLD_H_

#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/local_coordinator.h"
#include "runtime/config.h"
#include "runtime/data_plane.h"
#include "runtime/deps.h"
#include "runtime/runtime.h"
#include "transport/channels.h"
#include "transport/local_communicator.h"

namespace braid::testing {

// The data plane of one rank of an in-process world: Connect hands over the channels (data
// and control, transport/channels.h) of the rank the coordinator assigned.
class LocalDataPlane final : public DataPlane {
 public:
  using World = std::vector<transport::Channels>;
  explicit LocalDataPlane(std::shared_ptr<World> world) : world_(std::move(world)) {}

  absl::StatusOr<transport::PeerAddress> Open(const LaunchInfo& launch) override {
    return transport::PeerAddress{"localhost", getpid(), absl::StrCat("local:", launch.rank)};
  }
  absl::StatusOr<transport::Channels> Connect(
      int rank, std::vector<transport::PeerAddress> peers) override {
    if (rank < 0 || rank >= static_cast<int>(world_->size()) || (*world_)[rank].data == nullptr ||
        peers.size() != world_->size()) {
      return absl::InvalidArgumentError(absl::StrCat("no in-process communicator for rank ",
                                                     rank, " of ", peers.size()));
    }
    return std::move((*world_)[rank]);
  }

 private:
  std::shared_ptr<World> world_;
};

struct RuntimeWorldOptions {
  int size = 2;
  // Settings the coordinator imposes on the job (Note [Job settings]), e.g.
  // fusion_threshold_bytes; unset ones take the ranks' values or the defaults.
  proto::JobSettings settings;
  // The coordinator's autotuner (under settings.autotune(): Note [Autotuning]).
  coordinator::AutotuneOptions autotune;
  // Each rank's collective timeout (BRAID_TIMEOUT_S) and its communicator's.
  absl::Duration timeout = absl::Seconds(30);
  // Per-rank changes to the configuration before Init (compression default, cycle time...).
  std::function<void(int rank, RuntimeConfig* config)> configure;
  // Replaces a rank's in-process data channel before Init hands it over (a test's stand-in
  // that delegates to it and misbehaves on cue); unset: every rank gets its own.
  std::function<std::unique_ptr<transport::Communicator>(
      int rank, std::unique_ptr<transport::Communicator> comm)>
      wrap_communicator;
  // A rank's devices (Note [Devices], device/device.h); unset: the build's default.
  std::function<std::shared_ptr<const device::DeviceRegistry>(int rank)> devices;
  // A rank's NCCL (Note [GPU data planes], runtime/device_planes.h: the NCCL test double,
  // tests/testing/fake_nccl.h); unset: the build's.
  std::function<NcclProvider(int rank)> nccl;
};

// Options for a world of `size` ranks, everything else default.
inline RuntimeWorldOptions WorldOf(int size) {
  RuntimeWorldOptions o;
  o.size = size;
  return o;
}

class RuntimeWorld {
 public:
  explicit RuntimeWorld(RuntimeWorldOptions o = {}) : o_(std::move(o)) {
    coordinator::ServiceOptions so;
    so.world_size = o_.size;
    so.settings = o_.settings;
    so.autotune = o_.autotune;
    so.register_timeout = absl::Seconds(30);
    coordinator_ = std::make_unique<coordinator::LocalCoordinator>(so);
    for (int r = 0; r < o_.size; ++r) runtimes_.push_back(std::make_unique<Runtime>());
  }
  ~RuntimeWorld() {
    Shutdown();
    runtimes_.clear();
    coordinator_.reset();
  }

  int size() const { return o_.size; }
  Runtime& operator[](int rank) { return *runtimes_[rank]; }
  coordinator::LocalCoordinator& coordinator() { return *coordinator_; }

  // Inits every rank at once (registration waits for the whole world): each rank's status.
  // May be called again after Shutdown (a new job, with a new world of communicators).
  std::vector<absl::Status> Init() {
    transport::CollectiveOptions co;
    co.timeout = o_.timeout;
    auto world = std::make_shared<LocalDataPlane::World>(
        transport::CreateLocalChannels(o_.size, co));
    if (o_.wrap_communicator) {
      for (int r = 0; r < o_.size; ++r) {
        (*world)[r].data = o_.wrap_communicator(r, std::move((*world)[r].data));
      }
    }
    std::vector<absl::Status> out(o_.size);
    Run([&](int rank, Runtime& rt) {
      RuntimeConfig config;
      config.launch.rank = rank;
      config.launch.size = o_.size;
      config.timeout = o_.timeout;
      if (o_.configure) o_.configure(rank, &config);
      RuntimeDeps deps;
      deps.coordinator = [this](const CoordinatorClientSetup& setup)
          -> absl::StatusOr<std::unique_ptr<CoordinatorClient>> {
        coordinator::LocalClientOptions lo;
        lo.fill_heartbeat = setup.fill_heartbeat;
        return coordinator_->NewClient(lo);
      };
      deps.data_plane = std::make_unique<LocalDataPlane>(world);
      if (o_.devices) deps.devices = o_.devices(rank);
      if (o_.nccl) deps.nccl = o_.nccl(rank);
      out[rank] = rt.Init(config, std::move(deps));
    });
    return out;
  }
  // True when every rank's Init succeeded.
  bool InitOk() {
    for (const absl::Status& s : Init()) {
      if (!s.ok()) return false;
    }
    return true;
  }

  // fn(rank, runtime) on one thread per rank; returns when every one has.
  void Run(const std::function<void(int rank, Runtime& rt)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < o_.size; ++r) threads.emplace_back([&, r] { fn(r, *runtimes_[r]); });
    for (std::thread& t : threads) t.join();
  }

  std::vector<absl::Status> Shutdown() {
    std::vector<absl::Status> out(o_.size);
    Run([&](int rank, Runtime& rt) { out[rank] = rt.Shutdown(); });
    return out;
  }

 private:
  RuntimeWorldOptions o_;
  std::unique_ptr<coordinator::LocalCoordinator> coordinator_;
  std::vector<std::unique_ptr<Runtime>> runtimes_;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_RUNTIME_WORLD_H_
