// A rank's half of the rendezvous: one Register RPC that carries this rank's data-plane
// address and returns every peer's.
//
// Note [Peers at registration]: each rank opens its UCX worker first, so its address is
// known before any peer is, and sends it (with its host and pid) in its RegisterRequest. The
// coordinator answers once the whole world has registered, with every rank's address in
// RegisterResponse.peers, so each rank makes one round trip before connecting (through the
// key-value store it made 2N more, one after the other: a set, a get per rank to wait for
// every address, and a get per peer to read it).
#ifndef BRAID_RUNTIME_REGISTRATION_H_
#define BRAID_RUNTIME_REGISTRATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/braid.pb.h"
#include "runtime/config.h"
#include "control/coordinator_client.h"
#include "runtime/data_plane.h"
#include "transport/communicator.h"
#include "transport/ucx_communicator.h"

namespace braid {

struct Joined {
  // This rank's place (rank, size, local rank and size) and the job's settings.
  proto::RegisterResponse registration;
  transport::Channels channels;  // data and control, connected to every peer
};

// Opens this rank's data-plane endpoint, registers through `client` (launch info, host, pid,
// the endpoint's address, the job settings `config` set; the client presents the job secret)
// and connects to the peers the coordinator returned. Errors: the data plane's (UCX:
// Internal; InvalidArgument when the peers do not include this rank's worker), those of
// Register (PermissionDenied, InvalidArgument, DeadlineExceeded, Unavailable, ...).
absl::StatusOr<Joined> JoinJob(const RuntimeConfig& config, const LaunchInfo& launch,
                               CoordinatorClient& client, DataPlane& data_plane);

// The pair fields of a job's data-plane tags (UcxOptions::pair_tag, Note [Tag layout] in
// transport/tag.h), keyed by its secret (KeyedPairTag in common/secret.h): a sender that does
// not know the secret cannot produce a tag a rank will match.
std::function<uint32_t(int source, int destination)> KeyedDataPlaneTags(
    const std::string& job_secret);

// The data plane's options, from the configuration alone (rank / size may be unknown: -1 / 0).
transport::UcxOptions UcxOptionsFromConfig(const RuntimeConfig& config, int rank, int size);

}  // namespace braid

#endif  // BRAID_RUNTIME_REGISTRATION_H_
