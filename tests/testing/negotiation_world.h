// The coordinator's negotiation table with what each rank of a job receives from it, for unit
// tests of the coordinator's logic (no gRPC, no processes): every response in the common
// order goes to every rank; with `replies`, the replies to single ranks (Note [Failure
// reports] in coordinator/negotiation.h) go to theirs too. Header-only.
#ifndef BRAID_TESTS_TESTING_NEGOTIATION_WORLD_H_
#define BRAID_TESTS_TESTING_NEGOTIATION_WORLD_H_

#include <utility>
#include <vector>

#include "coordinator/negotiation.h"
#include "proto/braid.pb.h"

namespace braid::testing {

struct NegotiationWorld {
  explicit NegotiationWorld(int n, bool replies = false)
      : table(n), inbox(n), deliver_replies(replies) {}
  // Rank `rank` sends `reqs` in one RequestList.
  void Send(int rank, std::vector<proto::Request> reqs) {
    proto::RequestList l;
    l.set_rank(rank);
    for (auto& r : reqs) *l.add_requests() = std::move(r);
    for (const proto::Response& resp : table.Submit(rank, l)) {
      for (auto& box : inbox) box.push_back(resp);
    }
    if (deliver_replies) TakeReplies();
  }
  // Each of `ranks` sends `req`.
  void SendAll(const std::vector<int>& ranks, const proto::Request& req) {
    for (int r : ranks) Send(r, {req});
  }
  // The table's replies to single ranks, into their inboxes.
  void TakeReplies() {
    for (auto& [r, replies] : table.TakeReplies()) {
      for (auto& resp : replies) inbox[r].push_back(resp);
    }
  }
  coordinator::NegotiationTable table;
  std::vector<std::vector<proto::Response>> inbox;
  bool deliver_replies;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_NEGOTIATION_WORLD_H_
