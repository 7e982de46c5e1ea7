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

#include <memory>

#include "absl/status/statusor.h"
#include "proto/braid.pb.h"
#include "runtime/config.h"
#include "runtime/coordinator_client.h"
#include "runtime/data_plane.h"
#include "transport/communicator.h"
#include "transport/ucx_communicator.h"

namespace braid {

struct Joined {
  // This rank's place (rank, size, local rank and size) and the job's settings.
  proto::RegisterResponse registration;
  std::unique_ptr<transport::Communicator> comm;  // connected to every peer
};

// Opens this rank's data-plane endpoint, registers through `client` (launch info, host, pid,
// job secret, the endpoint's address, the job settings `config` set) and connects to the
// peers the coordinator returned. Errors: the data plane's (UCX: Internal; InvalidArgument
// when the peers do not include this rank's worker), those of Register (InvalidArgument,
// DeadlineExceeded, Unavailable, ...).
absl::StatusOr<Joined> JoinJob(const RuntimeConfig& config, const LaunchInfo& launch,
                               CoordinatorClient& client, DataPlane& data_plane);

// The data plane's options, from the configuration alone (rank / size may be unknown: -1 / 0).
transport::UcxOptions UcxOptionsFromConfig(const RuntimeConfig& config, int rank, int size);

}  // namespace braid

#endif  // BRAID_RUNTIME_REGISTRATION_H_
