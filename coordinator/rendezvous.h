// The Register rendezvous's pure logic: rank assignment and the job's settings, unit-tested
// without gRPC.
#ifndef BRAID_COORDINATOR_RENDEZVOUS_H_
#define BRAID_COORDINATOR_RENDEZVOUS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

// Given every rank's RegisterRequest in registration order, returns one RegisterResponse per
// request (same order). Ranks asked for explicitly are kept; the rest get the free ranks in
// registration order. Local rank / size come from the requests when every request gives
// them, else from the host: ranks on one host are numbered in rank order. Every response
// carries every rank's PeerInfo (host, pid, data-plane address) in rank order.
// InvalidArgument names duplicate or out-of-range ranks.
absl::StatusOr<std::vector<proto::RegisterResponse>> AssignRanks(
    const std::vector<proto::RegisterRequest>& requests, int world_size);

// Note [Job settings]
// The fusion threshold, the response cache's capacity, the stall check and shutdown, the
// heartbeat timeout and the negotiation timeout must be the same for the whole job, so the coordinator decides each once,
// when the whole world has registered:
//   1. the coordinator's own value when it was given one (braidrun's flags and environment,
//      braid-coordinator's flags and environment);
//   2. else the value the ranks set (BRAID_* in their environment), which must agree; a rank
//      that left the variable unset takes the job's value;
//   3. else the default (docs/configuration.md, the table of variables).
// A rank that set a different value is never silently overridden: the registration fails on
// every rank with InvalidArgument naming the variable and who set what. RegisterResponse
// returns the decision to every rank (the ranks' heartbeat interval follows the job's
// heartbeat timeout), and braidctl status shows it.
absl::StatusOr<proto::JobSettings> ResolveJobSettings(
    const proto::JobSettings& coordinator, const std::vector<proto::RegisterRequest>& requests,
    const std::vector<proto::RegisterResponse>& assigned);

// BRAID_FAST_PATH when no rank and not the coordinator set it: on. A cached tensor is agreed
// by the ranks' vote over the data plane, 15-25 us end to end for a small all-reduce on one
// host against 250-350 us through the coordinator (BENCHMARKS.md); the fault soak runs with
// it on and off. BRAID_FAST_PATH=0 sends every request to the coordinator.
inline constexpr int64_t kDefaultFastPath = 1;

// The defaults, every field present.
proto::JobSettings DefaultJobSettings();

// AssignRanks, then ResolveJobSettings into every response.
absl::StatusOr<std::vector<proto::RegisterResponse>> FormJob(
    const std::vector<proto::RegisterRequest>& requests, int world_size,
    const proto::JobSettings& coordinator);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_RENDEZVOUS_H_
