#include "runtime/registration.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "runtime/config_proto.h"

namespace braid {
namespace {

std::string HostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

transport::UcxOptions UcxOptionsFromConfig(const RuntimeConfig& config, int rank, int size) {
  transport::UcxOptions uo;
  uo.rank = rank;
  uo.size = size;
  uo.timeout = config.timeout;
  uo.connect_timeout = std::max(config.timeout, absl::Seconds(30));
  uo.peer_error_handling = config.ucx_peer_error_handling;
  return uo;
}

std::function<uint32_t(int, int)> KeyedDataPlaneTags(const std::string& job_secret) {
  auto key = std::make_shared<const std::string>(DataPlaneTagKey(job_secret));
  return [key](int source, int destination) { return KeyedPairTag(*key, source, destination); };
}

absl::StatusOr<Joined> JoinJob(const RuntimeConfig& config, const LaunchInfo& launch,
                               CoordinatorClient& client, DataPlane& data_plane) {
  auto opened = data_plane.Open(launch);
  if (!opened.ok()) return opened.status();
  const transport::PeerAddress& self = *opened;

  proto::RegisterRequest reg;
  reg.set_rank(launch.rank);
  reg.set_size(launch.size);
  reg.set_local_rank(launch.local_rank);
  reg.set_local_size(launch.local_size);
  reg.set_host(self.host.empty() ? HostName() : self.host);
  reg.set_pid(getpid());
  if (launch.worker >= 0) reg.set_worker(launch.worker);
  reg.set_transport_address(self.address);
  *reg.mutable_settings() = ToProto(config.job);
  auto registered = client.Register(reg, RegistrationTimeout(config));
  if (!registered.ok()) return registered.status();

  std::vector<transport::PeerAddress> peers;
  peers.reserve(registered->peers_size());
  for (const proto::PeerInfo& p : registered->peers()) {
    if (p.rank() != static_cast<int>(peers.size())) {
      return absl::InternalError(absl::StrCat("the coordinator listed peer ", p.rank(),
                                              " at position ", peers.size()));
    }
    peers.push_back({p.host(), p.pid(), p.transport_address()});
  }
  Joined joined;
  joined.registration = *std::move(registered);
  auto channels = data_plane.Connect(joined.registration.rank(), std::move(peers));
  if (!channels.ok()) return channels.status();
  joined.channels = *std::move(channels);
  return joined;
}

}  // namespace braid
