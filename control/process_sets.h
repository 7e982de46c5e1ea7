// The job's process sets: which ranks each set has, shared by the coordinator (which decides
// every change) and each rank's runtime (which mirrors it). Pure: no threads, no I/O.
//
// Note [Process sets]
// A process set is a subset of the job's ranks that runs collectives among itself, as
// Horovod's (`init(process_sets=...)`, `add_process_set`, `remove_process_set`) and
// torch.distributed's `new_group`. Set 0 is the whole world and always exists.
// - Changes are collectives too (Collective::kProcessSetAdd / kProcessSetRemove): every rank
//   asks for the same change in the same order (the k-th change of each rank pairs with the
//   others' k-th; a rank asking for a different one fails the change on every rank, naming
//   the ranks and what each asked for). The coordinator decides the id (the lowest free one:
//   ids of removed sets are reused, as Horovod's) and every rank applies the change at the
//   same point of the common order. torch's new_group is entered by the new group's members
//   only: its change is negotiated among them (Request.members_only), and returns an
//   existing set with the same ranks instead of refusing it.
// - A set's tensors are known everywhere by QualifiedName ("ps<id>/<name>"), so negotiation,
//   the response cache, the fast path, poisons and compression state are per set, and two
//   disjoint sets may use the same names (two data-parallel groups training one model each).
//   Under the fast path a set's cached tensor is agreed when every member voted it ready
//   (Note [Fast path] in runtime/fast_path.h); the votes themselves are the whole job's.
// - A tensor of set s is ready when every member of s submitted it (or joined s: join is per
//   set). Every rank receives every response, in one common order; a rank runs those of the
//   sets it belongs to and skips the others. Sets that share no rank so never wait on each
//   other; sets that share ranks run their collectives in the common order on each of them,
//   so no two ranks wait on each other in a cycle.
// - The data plane: each set has its own data and control communicators over the job's one
//   point-to-point layer (the same UCX endpoints), whose tags carry the set's id (Note
//   [Tag layout], transport/tag.h); hence at most kMaxProcessSets sets besides the world at
//   once. Set ranks are the members' positions in ascending order; a broadcast's root is a
//   rank of the job (a member), as Horovod's.
// - Removing a set fails its collectives still pending, on every member, naming the set.
#ifndef BRAID_CONTROL_PROCESS_SETS_H_
#define BRAID_CONTROL_PROCESS_SETS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace braid {

// Sets besides the world's that may exist at once (the tag bits of Note [Tag layout]).
inline constexpr int32_t kMaxProcessSets = 31;

class ProcessSetTable {
 public:
  explicit ProcessSetTable(int world_size);

  // The ranks of set `id`, ascending; null when there is no such set (0: the world).
  const std::vector<int>* Find(int32_t id) const;
  // The id of the set with exactly `ranks` (0 for the whole world), -1 when none.
  int32_t IdOf(const std::vector<int>& ranks) const;
  // Adds `ranks` (CheckRanks) under the lowest free id. AlreadyExists naming the set that
  // has the same ranks; FailedPrecondition beyond kMaxProcessSets sets.
  absl::StatusOr<int32_t> Add(const std::vector<int>& ranks);
  // Adds `ranks` under `id` (a mirror applying the coordinator's decision).
  absl::Status AddAs(int32_t id, const std::vector<int>& ranks);
  // NotFound for a set that does not exist; InvalidArgument for set 0.
  absl::Status Remove(int32_t id);
  // The sets besides the world's, by id.
  const std::map<int32_t, std::vector<int>>& sets() const { return sets_; }
  int world_size() const { return static_cast<int>(world_.size()); }

  // InvalidArgument unless `ranks` is non-empty, ascending, without repeats and within the
  // world.
  absl::Status CheckRanks(const std::vector<int>& ranks) const;

 private:
  std::vector<int> world_;
  std::map<int32_t, std::vector<int>> sets_;
};

// `rank`'s position in `ranks` (its rank in the set); -1 when it is not a member.
int SetRank(const std::vector<int>& ranks, int rank);
// The name the job knows set `id`'s tensor `name` by (Note [Process sets]).
std::string QualifiedName(int32_t id, const std::string& name);
// "[0, 2, 3]".
std::string RanksText(const std::vector<int>& ranks);

}  // namespace braid

#endif  // BRAID_CONTROL_PROCESS_SETS_H_
