// The response cache's fast path: pure parts (no threads, no data plane), unit-tested alone.
//
// Note [Fast path]
// With BRAID_FAST_PATH=1 (a job setting), a tensor whose request is identical to one the
// coordinator already agreed and cached (Note [Response cache], coordinator/negotiation.h)
// is not sent to the coordinator again. Instead the ranks agree among themselves, over the
// data plane, in rounds (after Horovod's response cache and its bit-vector all-reduce):
//   1. Each rank sends, in one all-gather, a vote: for every cache slot (cache ids in
//      increasing order) a "cached and ready" bit and an "invalidate" bit, and a header
//      (Vote) saying how many coordinator messages it has received and applied.
//   2. Every rank computes the same agreement from the same votes: the slots ready on every
//      rank (bitwise AND) run, in cache-id order, fused by the fusion planner of the
//      coordinator (control/fusion.h) with the job's threshold; the slots any rank
//      invalidated (bitwise OR) leave every rank's cache, and a rank holding such a tensor
//      sends its full request to the coordinator instead.
//   3. Coordinator messages (first-time, changed and mismatched tensors, errors) run only at
//      rounds too: those every rank has received (the smallest count in the votes), in the
//      order the coordinator sent them, after the round's cached buckets. Their cache
//      insertions and evictions apply at that point on every rank, so every rank's cache is
//      the same at every round (the header carries a digest that checks it).
// A process set's tensor (Note [Process sets] in control/process_sets.h) is cached on every
// rank alike: a rank outside the set holds a slot made from the coordinator's response
// (FastPathCache::InsertOutside), never marks it ready, and its slot is agreed when every
// member of the set marked it, so a set's steps, too, skip the coordinator.
// While any rank has joined (join() for uneven inputs, Note [Join] in
// coordinator/negotiation.h), no slot is agreed: a joined rank never marks one ready, and
// only the coordinator knows to let it take part with the op's identity. Every rank then
// sends what it holds to the coordinator (the vote's `joined` flag), until the join completes.
// A rank invalidates a slot when its tensor changed (a new shape under a cached name), and
// when its own cached tensor has waited longer than the fallback delay for another rank:
// the tensor then waits at the coordinator, whose stall inspector names the missing ranks
// and whose negotiation deadline fails it (Note [Failure reports] in negotiation.h). A rank
// that refuses a cached tensor locally (Note [Local failures] in runtime/enqueue.cc)
// invalidates its slot with its failure report, so its peers ask the coordinator at once and
// get the failure. Errors the coordinator sends to one rank alone (sequence 0) run no
// collective: they are not counted as coordinator messages (the other ranks never receive
// them) and fail their handles at the rank's next round.
// Why an all-gather and not an all-reduce: the communicator reduces numbers (sum, min, max),
// not bits; gathering the votes (16 bytes per 64 cached tensors per rank) lets each rank
// compute AND, OR and the minimum itself and check every rank's header.
#ifndef BRAID_RUNTIME_FAST_PATH_H_
#define BRAID_RUNTIME_FAST_PATH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/braid.pb.h"

namespace braid {

// This rank's copy of the coordinator's response cache, changed only at agreed points.
class FastPathCache {
 public:
  struct Slot {
    std::string name;
    std::string bytes;      // the proto::Request, serialized (what the rank compares)
    proto::Request request;  // the same, parsed
    std::string devices;     // its response's FusionDeviceKey (control/bucket.h)
  };
  // Adds (or replaces) slot `id` for `bytes`, the serialized request of `name`, which the
  // coordinator answered with `r`. An older slot under the same name goes.
  void Insert(int32_t id, const std::string& name, const std::string& bytes,
              const proto::Response& r);
  // Adds slot `id` for name i of `r`, the coordinator's response of a process set's tensor
  // this rank is not in (Note [Process sets] in control/process_sets.h): it holds no request
  // of it, so the slot's request is made from the response (what planning and voting read:
  // collective, dtype, op, set, compression and size) and matches no Lookup here.
  void InsertOutside(int32_t id, const proto::Response& r, int i);
  // Removes slot `id`; returns its name ("" when absent).
  std::string Evict(int32_t id);
  // The id cached for `name` (0: none).
  int32_t IdOf(const std::string& name) const;
  // The slot's id when `name` is cached with exactly these request bytes, else 0.
  int32_t Lookup(const std::string& name, const std::string& bytes) const;
  const Slot* Find(int32_t id) const;
  // Index of `id` among the cached ids in increasing order; -1 when absent.
  int Position(int32_t id) const;
  int32_t IdAt(int position) const { return ids_[position]; }
  size_t size() const { return slots_.size(); }
  // Order-independent digest of the cached ids (equal caches, equal digests).
  uint64_t digest() const { return digest_; }
  void Clear();

 private:
  void InsertSlot(int32_t id, const std::string& name, const std::string& bytes,
                  proto::Request request, const proto::Response& r);
  std::map<int32_t, Slot> slots_;
  std::map<std::string, int32_t> by_name_;
  std::vector<int32_t> ids_;  // slots_'s keys, in order
  uint64_t digest_ = 0;
};

// One rank's vote in a round.
struct Vote {
  uint64_t applied = 0;   // coordinator messages applied (equal on every rank)
  uint64_t received = 0;  // coordinator messages received
  uint64_t cache_size = 0;
  uint64_t digest = 0;
  bool joined = false;               // this rank has a join() in flight
  std::vector<uint64_t> ready;       // bit p: slot at position p is cached and ready here
  std::vector<uint64_t> invalidate;  // bit p: slot at position p must leave every cache
};
// 64-bit words for `cache_size` slots.
size_t VoteWords(size_t cache_size);
// Header (5 words), then ready, then invalidate (VoteWords each).
std::vector<uint64_t> EncodeVote(const Vote& vote);
void SetBit(std::vector<uint64_t>* bits, int position);

// What every rank concludes from the same votes.
struct Agreement {
  uint64_t received = 0;            // coordinator messages every rank has received
  std::vector<int32_t> ready;       // cache ids ready on every rank and not invalidated
  std::vector<int32_t> invalidate;  // cache ids some rank invalidated
  bool joined = false;              // some rank has joined: nothing is ready (Note [Fast path])
};
// `gathered` holds every rank's EncodeVote, back to back in rank order. Internal when the
// ranks' caches differ (a bug: they change only at agreed points), naming the ranks.
// A slot of a process set (Note [Process sets] in control/process_sets.h) is ready when it is
// on every member of the set, whose ranks `set_ranks` gives (nullopt: the set is gone).
using ProcessSetRanks = std::function<std::optional<std::vector<int>>(int32_t)>;
absl::StatusOr<Agreement> Agree(absl::Span<const uint64_t> gathered, int world_size,
                                const FastPathCache& cache, uint64_t applied,
                                const ProcessSetRanks& set_ranks = nullptr);

// Groups agreed cache ids (in increasing order) into buckets the way the coordinator fuses
// ready tensors: all-reduces of one collective, dtype, reduce op, process set and
// compression up to `fusion_threshold_bytes` (0: no fusion); every other collective alone.
std::vector<std::vector<int32_t>> PlanFastBuckets(const std::vector<int32_t>& ids,
                                                  const FastPathCache& cache,
                                                  int64_t fusion_threshold_bytes);

// Elements and bytes of a request's tensor, as the coordinator counts them.
int64_t RequestBytes(const proto::Request& r);

}  // namespace braid

#endif  // BRAID_RUNTIME_FAST_PATH_H_
