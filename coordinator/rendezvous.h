// Rank assignment: pure logic of the Register rendezvous, unit-tested without gRPC.
#ifndef BRAID_COORDINATOR_RENDEZVOUS_H_
#define BRAID_COORDINATOR_RENDEZVOUS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

// Given every rank's RegisterRequest in registration order, returns one RegisterResponse per
// request (same order). Ranks asked for explicitly are kept; the rest get the free ranks in
// registration order. Local rank / size come from the requests when every request gives
// them, else from the host: ranks on one host are numbered in rank order.
// InvalidArgument names duplicate or out-of-range ranks.
absl::StatusOr<std::vector<proto::RegisterResponse>> AssignRanks(
    const std::vector<proto::RegisterRequest>& requests, int world_size);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_RENDEZVOUS_H_
