// The negotiation table: the coordinator's pure logic, with no gRPC in it (unit-tested with
// plain messages). A tensor is ready when every rank of its process set has asked for it;
// its requests are then validated against each other and it is appended to one global
// order that every rank receives identically. Mismatches become one ERROR response, sent to
// every rank, naming the tensor and what each rank sent.
//
// Note [Failure reports]
// What one rank cannot do, the others must hear of at once, or they wait for it forever. A
// tensor fails on every rank, with one message naming the tensor, the rank and the cause,
// when (1) a rank reports that its call failed locally (a FailureReport: bad arguments, a
// compression error), (2) a rank's request is malformed (ValidateRequest: sizes that
// overflow, a name or spec over its limit, unknown enum values), or (3) it is still not
// negotiated after the job's negotiation timeout (ranks submitted different names, or one
// never calls the collective; a rank that has joined counts as having submitted every
// tensor, and a JOIN request itself never expires: Note [Join]). The error goes to the ranks
// that submitted the tensor (they hold its handle) as a reply to each alone, not in the
// common order: an ERROR runs no collective. A rank that had neither submitted nor reported
// that instance when it failed is the hard case: it may be slow (its next submission of the
// name is the failed instance) or it may have skipped the call (its next submission is the
// next step's), and names alone cannot tell the two apart. Either guess can pair one rank's
// step k with another's step k+1 without an error, so braid does not guess: Note
// [Resynchronization].
//
// Note [Resynchronization]
// The rule: an error never changes which step a rank's data is reduced with.
// - A one-sided failure (some rank had neither submitted nor reported the failed instance)
//   poisons the name: every later submission of it, from every rank, fails at once with
//   FailedPrecondition naming the earlier error, until the ranks resynchronize.
// - The ranks resynchronize with a barrier: when a barrier completes, every poisoned name is
//   clean again. A barrier is an epoch boundary for pairing: a rank sends nothing it
//   enqueued after a barrier until that barrier completed (Note [Barrier order] in
//   runtime/loop.cc), and every rank has passed it, so what the coordinator still holds when
//   a barrier completes was submitted before it by some ranks and will never be submitted by
//   the others: it fails at once on the ranks that submitted it (InvalidArgument naming the
//   ranks on each side and the barrier) instead of pairing with a later step.
// - The negotiation deadline is different: a tensor that waited it out means the ranks are
//   out of step (each waits in a call the others never make, or one skipped a call), and
//   which of their later calls pair can no longer be known from any one name: rank 1 may
//   have called 'h' where rank 0 called 'g', so after 'h' fails, rank 1's next 'g' is its
//   next step's. So the deadline desynchronizes the ranks of the expired tensors' sets (the
//   whole job, for a tensor of the whole job's set): every pending tensor of a set holding
//   one of them fails with it, and every later submission of such a set's names fails until
//   they pass a barrier together (the whole job's, or a process set's that holds them all:
//   Note [Process sets] in control/process_sets.h); sets without them go on. Under the
//   fast path the response cache is flushed (every id evicted, in the common order) so that
//   no rank agrees a cached tensor without the coordinator meanwhile; the errors reach the
//   ranks after the flush (a rank applies its own errors in the order it received them with
//   the common lists, Note [Fast path] in runtime/fast_path.h).
// - Barriers themselves are never poisoned (they carry no data, and a poisoned barrier could
//   never resynchronize), and never cached, so every barrier reaches the coordinator, with the
//   fast path on too. Poisons are per name, so they are bounded by the job's names.
//
// Note [Join]
// join() for uneven inputs, with Horovod's semantics. A rank that ran out of data sends a
// JOIN request. From then on it counts as ready for every tensor: a tensor is ready once
// every rank that has not joined submitted it, and its response lists the joined ranks that
// did not submit it (Response.joined_ranks) with each tensor's shape (Response.shapes), so
// they can build a buffer of the negotiated shape and dtype. For an all-reduce they
// contribute the op's identity: zeros for sum and average (an average still divides by the
// whole world size, as Horovod and DDP's divide_by_initial_world_size do), the dtype's
// largest value for min, its lowest for max, one for product. A barrier takes them too. The
// other collectives (all-gather, broadcast, reduce-scatter, all-to-all) fail with
// FailedPrecondition naming the joined ranks, as Horovod refuses them: they have no
// identity to contribute. A joined rank therefore never makes a tensor wait (it is never a
// missing rank of a pending tensor, so never a stall), and its own JOIN request is not a
// pending tensor either: it waits as long as the others train. Once every rank has joined,
// one JOIN response (last_joined_rank: the rank that joined last) goes to all, and the next
// round starts with no rank joined.
#ifndef BRAID_COORDINATOR_NEGOTIATION_H_
#define BRAID_COORDINATOR_NEGOTIATION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "control/compression_groups.h"
#include "control/process_sets.h"
#include "coordinator/validation.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

class NegotiationTable {
 public:
  // Ready all-reduces of one kind are fused into buckets of at most
  // `fusion_threshold_bytes` (0 disables fusion; see fusion.h).
  // Note [Response cache]: with cache_capacity > 0, every agreed request of a collective
  // whose requests are identical on every rank (all-reduce, broadcast, reduce-scatter,
  // barrier) gets a small id, sent back in Response.cache_ids; ranks then send the id
  // instead of the full request. The least recently negotiated entry is evicted beyond
  // the capacity, and the eviction travels in the same ResponseList stream, so every rank's
  // cache holds the same entries. Ids are never reused: an id a rank sent before it saw the
  // eviction still resolves, because evicted entries are kept as retired (their request
  // only). Each rank reports the sequence number of the last ResponseList it applied
  // (RequestList.applied_sequence), and a rank's requests travel in order after it, so once
  // every rank still in the job has applied the list that carried an eviction, no request
  // can name that id any more and the retired entry is dropped (ReleaseRetired): memory stays
  // bounded by the capacity however often tensors change shape. A rank that never reports
  // keeps them (a request can be sent several evictions late: a step's requests go out in
  // batches).
  NegotiationTable(int world_size, int64_t fusion_threshold_bytes = 0, int cache_capacity = 0);
  // Note [Settings changes]: the threshold of the buckets fused from now on.
  void set_fusion_threshold(int64_t bytes) { fusion_threshold_ = bytes; }

  // Records `rank`'s requests and failure reports (Note [Failure reports]) and returns the
  // responses that became ready because of them, in the order every rank must execute them.
  // A rank asking twice for a name still in negotiation gets an ERROR response
  // (AlreadyExists) addressed to the whole world. Replies to single ranks wait in
  // TakeReplies().
  std::vector<proto::Response> Submit(int rank, const proto::RequestList& list,
                                      absl::Time now = absl::Now());

  // Fails every tensor some ranks submitted more than `timeout` ago (Note [Failure
  // reports]): DeadlineExceeded naming the ranks that did and did not submit it; if one did,
  // the job is out of step (Note [Resynchronization]): every other pending tensor fails too,
  // the response cache is flushed (TakeEvictions) and later submissions fail until a
  // barrier. A pending barrier never fails while anything else is pending (those calls are
  // what keeps ranks from it): its deadline starts again. Returns the messages (for the
  // log); the errors wait in TakeReplies().
  std::vector<std::string> ExpireOlderThan(absl::Duration timeout, absl::Time now);

  // ERROR responses for single ranks, by rank, since the last call: to send to each alone.
  std::map<int, std::vector<proto::Response>> TakeReplies();

  // Names some ranks submitted and others did not, with the ranks each is waiting for and
  // how long it has waited.
  struct Pending {
    std::string name;
    std::vector<int> ready_ranks;
    std::vector<int> missing_ranks;
    absl::Duration waiting;
  };
  // Only those waiting at least `min_waiting` (the stall inspector asks for the old ones).
  std::vector<Pending> PendingTensors(absl::Time now = absl::Now(),
                                      absl::Duration min_waiting = absl::ZeroDuration()) const;

  // Fails every pending tensor still missing one of `gone` (ranks that left the job): one
  // ERROR response each (FailedPrecondition), to send to every rank. Without it such a
  // tensor would wait forever.
  std::vector<proto::Response> FailTensorsWaitingFor(const std::set<int>& gone);

  // Ranks that have joined the whole world's set (Note [Join]) and are waiting for the
  // others, in rank order.
  std::vector<int> joined_ranks() const;

  // Note [Process sets] (control/process_sets.h): the job's sets, and per set the responses
  // of its collectives and its tensors pending.
  const ProcessSetTable& process_sets() const { return sets_; }
  struct SetCounts {
    int64_t negotiated = 0;
    int64_t pending = 0;
  };
  std::map<int32_t, SetCounts> process_set_counts() const;

  // Cache ids evicted since the last call; the server sends them in the ResponseList whose
  // sequence number is `sequence`.
  std::vector<int32_t> TakeEvictions(int64_t sequence = 0);
  // Drops the retired entries whose eviction travelled in a list numbered <= `applied`
  // (every rank still in the job has applied it).
  void ReleaseRetired(int64_t applied);
  size_t retired_entries() const { return retired_.size(); }
  // Names poisoned until the next barrier (Note [Resynchronization]).
  size_t poisoned_names() const { return poisoned_.size(); }
  bool out_of_step() const { return !out_of_step_ranks_.empty(); }

  // Whether responses carry report_age_us (default true). The coordinator turns it off until
  // a rank asks for them (RequestList.report_ages): N numbers per tensor.
  void set_report_ages(bool on) { report_ages_ = on; }

  int world_size() const { return world_size_; }
  int64_t tensors_negotiated() const { return negotiated_; }
  int64_t bytes_negotiated() const { return bytes_negotiated_; }
  // Per group of all-reduces, compression method ("none" for uncompressed) and plan pattern
  // (Note [Compression groups] in control/compression_groups.h): tensors and bytes negotiated.
  const control::CompressionGroups<std::pair<int64_t, int64_t>>& by_compression() const {
    return by_compression_;
  }

 private:
  // Requests are shared, not copied: a response-cache hit on N ranks is N pointers to the
  // cache's one request (and N equal pointers agree without comparing a field).
  using RequestPtr = coordinator::RequestPtr;
  // One tensor in negotiation. Indexed by rank: with N ranks and T tensors a step makes N·T
  // submissions, so each must cost O(1), not a tree insert and a copy.
  struct Entry {
    std::vector<RequestPtr> by_rank;   // null: that rank has not submitted it
    std::vector<absl::Time> arrived;
    int submitted = 0;
    absl::Time first_seen;
    int32_t set = 0;  // its process set (Note [Process sets])
    // The ranks that must submit it: the set's (null: the whole world), or own_members for a
    // change negotiated among the new set's members only (Request.members_only).
    const std::vector<int>* members = nullptr;
    std::vector<int> own_members;
  };
  // A name whose later submissions fail until the next barrier (Note [Resynchronization]).
  struct Poison {
    absl::StatusCode code;  // of the failure that poisoned it
    std::string cause;      // its message
  };
  proto::Response Validate(const std::string& name, const Entry& e) const;
  // The request of the lowest rank that submitted `e` (some rank did: it is in the table).
  static const RequestPtr& FirstOf(const Entry& e);
  // Response.report_age_us of `e`.
  void AddReportAges(const Entry& e, absl::Time now, proto::Response* resp);
  // Every rank of `e`'s set either submitted `e` or has joined the set (Note [Join]).
  bool Ready(const Entry& e) const;
  // The ranks that must submit `e`, in order.
  const std::vector<int>& MembersOf(const Entry& e) const;
  // Whether `rank` has joined `set` (Note [Join]).
  bool JoinedSet(int32_t set, int rank) const;
  // The ranks that joined `e`'s set and did not submit `e`.
  std::vector<int> JoinedWithout(const Entry& e) const;
  // A change of the process sets every rank of its scope asked for (Note [Process sets]).
  proto::Response RespondChange(const std::string& name, const Entry& e);
  // RespondChange's removal of set `target` (`want`: the call, for messages).
  proto::Response RemoveSet(const std::string& name, const std::string& want, int32_t target,
                            proto::Response resp);
  // Checks `rank`'s request against the sets: an error reply to it alone when its set does
  // not exist or does not hold it; the members that must submit it otherwise.
  bool CheckSet(int rank, const proto::Request& req, const std::vector<int>** members);
  // Validates the ready tensor `name`, books it, appends its response and erases it.
  void Respond(const std::string& name, absl::Time now, std::vector<proto::Response>* ready);
  void SubmitJoin(int rank, const proto::Request& req, absl::Time now,
                  std::vector<proto::Response>* ready);

  std::vector<proto::Response> Fuse(std::vector<proto::Response> ready);
  void SubmitOne(int rank, RequestPtr req, absl::Time now,
                 std::vector<proto::Response>* ready);
  // Fails `name` on every rank with `error` (Note [Failure reports]): replies to the ranks
  // that submitted it; when a rank other than `reporter` (and the joined ones) had not
  // submitted it, the name is poisoned if `may_poison` and it is not a barrier (Note
  // [Resynchronization]).
  void FailEverywhere(const std::string& name, proto::Response error, int reporter,
                      bool may_poison = true);
  // True when `name` is poisoned; with `reply`, `rank`'s submission is answered with the
  // poison's error.
  bool Poisoned(int rank, const std::string& name, bool reply);
  // A barrier completed on every rank: poisons go, and what is still pending fails on the
  // ranks that submitted it (Note [Resynchronization]).
  void Resynchronize(const std::string& barrier, const std::vector<int>& members);
  // Resynchronize's part for names: the poisons of names whose set lies within `members`,
  // and the out-of-step state when its ranks do (Note [Process sets]).
  void ResynchronizeNames(const std::vector<int>& members);
  // The ranks of the process set whose tensor `name` is (its "ps<id>/" prefix; the world's
  // when none, or when the set is gone).
  const std::vector<int>& MembersOfName(const std::string& name) const;
  // What the out-of-step ranks' calls do until they resynchronize, for messages.
  std::string OutOfStepScope() const;
  // Whether some of `members` are out of step.
  bool OutOfStep(const std::vector<int>& members) const;
  // Whether `ranks` all lie within `members` (ascending).
  static bool Covers(const std::vector<int>& members, const std::vector<int>& ranks);
  // Whether pending tensor `p`'s ranks meet `ranks`.
  static bool Touches(const std::set<int>& ranks, const Pending& p);
  // The negotiation deadline failed a tensor with `cause`: the job is out of step.
  void Desynchronize(const std::string& cause, const std::set<int>& ranks);
  bool IsBarrier(const std::string& name) const;  // a pending barrier
  // Id of `agreed` in the cache (inserted or refreshed), or 0 when it is not cacheable.
  int32_t CacheInsert(const RequestPtr& agreed);

  struct CacheEntry {
    RequestPtr request;
    std::string bytes;  // request->SerializeAsString()
    uint64_t last_use = 0;
  };
  int cache_capacity_;
  int32_t next_cache_id_ = 1;
  uint64_t use_clock_ = 0;
  std::map<int32_t, CacheEntry> cache_;             // live entries
  std::map<std::string, int32_t> cache_by_name_;
  struct Retired {
    RequestPtr request;
    int64_t sequence = 0;  // of the list that carried its eviction (0: not sent yet)
  };
  std::map<int32_t, Retired> retired_;              // evicted, still resolvable
  std::vector<int32_t> evictions_;
  std::map<std::string, Poison> poisoned_;
  // Note [Resynchronization]: the ranks out of step (every name of a set holding one of them
  // is poisoned until they pass a barrier together) and the first cause.
  std::set<int> out_of_step_ranks_;
  std::string out_of_step_;
  std::map<int, std::vector<proto::Response>> replies_;

  int world_size_;
  bool report_ages_ = true;
  int64_t fusion_threshold_;
  int64_t next_bucket_id_ = 0;
  std::map<std::string, Entry> table_;
  // Note [Join]: per process set, rank -> the name of its JOIN request, while not every
  // rank of the set has joined.
  std::map<int32_t, std::map<int, std::string>> joined_;
  ProcessSetTable sets_;
  std::map<int32_t, int64_t> negotiated_by_set_;
  std::map<int32_t, int> last_joined_;  // per process set
  int64_t negotiated_ = 0;
  int64_t bytes_negotiated_ = 0;
  control::CompressionGroups<std::pair<int64_t, int64_t>> by_compression_;
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_NEGOTIATION_H_
