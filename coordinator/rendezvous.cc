#include "coordinator/rendezvous.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace braid::coordinator {

absl::StatusOr<std::vector<proto::RegisterResponse>> AssignRanks(
    const std::vector<proto::RegisterRequest>& requests, int world_size) {
  const int n = static_cast<int>(requests.size());
  if (n != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " ranks registered for a world of size ", world_size));
  }
  std::vector<int> rank_of(n, -1);
  std::map<int, int> taken;  // rank -> request index
  for (int i = 0; i < n; ++i) {
    int r = requests[i].rank();
    if (r < 0) continue;
    if (r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " (pid ", requests[i].pid(),
                                                     " on ", requests[i].host(),
                                                     ") is outside a world of size ",
                                                     world_size));
    }
    if (auto it = taken.find(r); it != taken.end()) {
      const auto& other = requests[it->second];
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " claimed twice: by pid ", other.pid(), " on ", other.host(), " and by pid ",
          requests[i].pid(), " on ", requests[i].host()));
    }
    taken[r] = i;
    rank_of[i] = r;
  }
  int next_free = 0;
  for (int i = 0; i < n; ++i) {
    if (rank_of[i] >= 0) continue;
    while (taken.count(next_free)) ++next_free;
    rank_of[i] = next_free;
    taken[next_free] = i;
  }

  std::vector<int> index_of_rank(n);
  for (int i = 0; i < n; ++i) index_of_rank[rank_of[i]] = i;
  bool all_local_given = true;
  for (const auto& r : requests) all_local_given = all_local_given && r.local_rank() >= 0 && r.local_size() > 0;
  std::vector<int> local_rank(n), local_size(n);
  if (all_local_given) {
    for (int i = 0; i < n; ++i) {
      local_rank[i] = requests[i].local_rank();
      local_size[i] = requests[i].local_size();
    }
  } else {
    std::map<std::string, int> count;
    for (int r = 0; r < n; ++r) {
      int i = index_of_rank[r];
      local_rank[i] = count[requests[i].host()]++;
    }
    for (int i = 0; i < n; ++i) local_size[i] = count[requests[i].host()];
  }

  std::vector<proto::RegisterResponse> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].set_rank(rank_of[i]);
    out[i].set_size(world_size);
    out[i].set_local_rank(local_rank[i]);
    out[i].set_local_size(local_size[i]);
    for (int r = 0; r < n; ++r) {
      const auto& q = requests[index_of_rank[r]];
      proto::PeerInfo* p = out[i].add_peers();
      p->set_rank(r);
      p->set_host(q.host());
      p->set_pid(q.pid());
      p->set_transport_address(q.transport_address());
    }
  }
  return out;
}

}  // namespace braid::coordinator
