#include "coordinator/negotiation.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/limits.h"
#include "control/fusion.h"

namespace braid::coordinator {
NegotiationTable::NegotiationTable(int world_size, int64_t fusion_threshold_bytes,
                                   int cache_capacity)
    : cache_capacity_(cache_capacity),
      world_size_(world_size),
      fusion_threshold_(fusion_threshold_bytes),
      sets_(world_size) {}

std::vector<int32_t> NegotiationTable::TakeEvictions(int64_t sequence) {
  std::vector<int32_t> out;
  out.swap(evictions_);
  for (int32_t id : out) {
    if (auto it = retired_.find(id); it != retired_.end()) it->second.sequence = sequence;
  }
  return out;
}

void NegotiationTable::ReleaseRetired(int64_t applied) {
  for (auto it = retired_.begin(); it != retired_.end();) {
    const int64_t seq = it->second.sequence;
    it = seq > 0 && seq <= applied ? retired_.erase(it) : std::next(it);
  }
}

std::map<int, std::vector<proto::Response>> NegotiationTable::TakeReplies() {
  std::map<int, std::vector<proto::Response>> out;
  out.swap(replies_);
  return out;
}

int32_t NegotiationTable::CacheInsert(const RequestPtr& agreed) {
  const proto::Collective c = agreed->collective();
  // Barriers are never cached: each must reach the coordinator (Note [Resynchronization]).
  if (cache_capacity_ <= 0 ||
      (c != proto::ALLREDUCE && c != proto::BROADCAST && c != proto::REDUCESCATTER)) {
    return 0;
  }
  std::string bytes;
  ++use_clock_;
  if (auto it = cache_by_name_.find(agreed->name()); it != cache_by_name_.end()) {
    CacheEntry& e = cache_[it->second];
    // The cache's own request (every rank sent its id): no need to serialize to compare.
    if (e.request != agreed) bytes = agreed->SerializeAsString();
    if (e.request == agreed || e.bytes == bytes) {
      e.last_use = use_clock_;
      return it->second;
    }
    // Changed metadata under a cached name: the old entry goes, a new one is made.
    retired_[it->second] = Retired{e.request, 0};
    evictions_.push_back(it->second);
    cache_.erase(it->second);
    cache_by_name_.erase(it);
  }
  if (static_cast<int>(cache_.size()) >= cache_capacity_) {
    auto lru = std::min_element(cache_.begin(), cache_.end(), [](const auto& a, const auto& b) {
      return a.second.last_use < b.second.last_use;
    });
    retired_[lru->first] = Retired{lru->second.request, 0};
    evictions_.push_back(lru->first);
    cache_by_name_.erase(lru->second.request->name());
    cache_.erase(lru);
  }
  if (bytes.empty()) bytes = agreed->SerializeAsString();
  const int32_t id = next_cache_id_++;
  cache_[id] = CacheEntry{agreed, std::move(bytes), use_clock_};
  cache_by_name_[agreed->name()] = id;
  return id;
}

std::vector<proto::Response> NegotiationTable::Fuse(std::vector<proto::Response> ready) {
  std::vector<control::FusionItem> items;
  for (const proto::Response& r : ready) {
    control::FusionItem item;
    if (r.type() == proto::Response::OK && r.collective() == proto::ALLREDUCE) {
      // Tensors fuse only with others that the same joined ranks fill in (Note [Join]).
      item.key = absl::StrCat(r.collective(), "/", r.dtype(), "/", r.reduce_op(), "/",
                              r.process_set_id(), "/", r.compression(), "/",
                              absl::StrJoin(r.joined_ranks(), ","), "/",
                              FusionDeviceKey(r));
      int v = static_cast<int>(r.dtype());
      item.bytes = r.tensor_sizes(0) *
                   static_cast<int64_t>(IsValidDataType(v) ? DataTypeSize(static_cast<DataType>(v)) : 1);
    }
    items.push_back(std::move(item));
  }
  std::vector<proto::Response> out;
  for (const std::vector<int>& bucket : control::PlanBuckets(items, fusion_threshold_)) {
    proto::Response merged = std::move(ready[bucket[0]]);
    for (size_t k = 1; k < bucket.size(); ++k) {
      const proto::Response& r = ready[bucket[k]];
      merged.add_names(r.names(0));
      merged.add_tensor_sizes(r.tensor_sizes(0));
      for (int64_t age : r.report_age_us()) merged.add_report_age_us(age);
      merged.add_cache_ids(r.cache_ids_size() > 0 ? r.cache_ids(0) : 0);
      for (const proto::TensorShape& shape : r.shapes()) *merged.add_shapes() = shape;
    }
    merged.set_bucket_id(next_bucket_id_++);
    out.push_back(std::move(merged));
  }
  return out;
}
proto::Response NegotiationTable::Validate(const std::string& name, const Entry& e) const {
  // Every rank submitted it, or has joined (Note [Join]: a joined rank's entry is null and
  // is left out of every comparison).
  return ValidateTensor(name, *FirstOf(e), e.by_rank, e.members);
}

std::vector<proto::Response> NegotiationTable::Submit(int rank, const proto::RequestList& list,
                                                      absl::Time now) {
  std::vector<proto::Response> ready;
  // Failure reports first: a rank reports a name only while no instance of it is in flight
  // there, so a report in this list concerns an instance enqueued before any request of the
  // same name in it (a refused step k, then step k+1).
  for (const proto::FailureReport& f : list.failures()) {
    if (f.in_collective()) continue;  // the job is aborted instead (Job::OnRequests)
    // Poisoned: its later submissions fail anyway, and the reporter's own handle has failed.
    if (Poisoned(rank, f.name(), /*reply=*/false)) continue;
    const std::string cause = Truncated(f.message(), kMaxErrorMessageBytes);
    absl::StatusCode code = static_cast<absl::StatusCode>(f.error_code());
    if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
    FailEverywhere(f.name(),
                   ErrorResponse(f.name(), code,
                         absl::StrCat("tensor '", Truncated(f.name(), kMaxNameBytes),
                                      "' failed on rank ", rank, ": ", cause)),
                   rank);
  }
  for (int32_t id : list.cached_ids()) {
    RequestPtr req;
    if (auto it = cache_.find(id); it != cache_.end()) req = it->second.request;
    if (auto it = retired_.find(id); req == nullptr && it != retired_.end()) req = it->second.request;
    if (req == nullptr) {
      ready.push_back(ErrorResponse(absl::StrCat("cache id ", id), absl::StatusCode::kInternal,
                            absl::StrCat("rank ", rank, " sent response-cache id ", id,
                                         ", which the coordinator no longer knows")));
      continue;
    }
    // Shared: SubmitOne may evict this very cache entry (changed metadata) while using it.
    SubmitOne(rank, std::move(req), now, &ready);
  }
  for (const proto::Request& req : list.requests()) {
    SubmitOne(rank, std::make_shared<const proto::Request>(req), now, &ready);
  }
  return Fuse(std::move(ready));
}

bool NegotiationTable::Poisoned(int rank, const std::string& name, bool reply) {
  auto p = poisoned_.find(name);
  const bool out = !out_of_step_ranks_.empty() && OutOfStep(MembersOfName(name));
  if (p == poisoned_.end() && !out) return false;
  if (!reply) return true;
  const std::string head =
      absl::StrCat("tensor '", Truncated(name, kMaxNameBytes), "' was not run on rank ", rank);
  replies_[rank].push_back(ErrorResponse(
      name, absl::StatusCode::kFailedPrecondition,
      p != poisoned_.end()
          ? absl::StrCat(head,
                         ": an earlier instance of it failed before every rank had submitted it (",
                         p->second.cause,
                         "), so braid cannot tell which step of the other ranks this call "
                         "pairs with; every call of it fails on every rank until all ranks call "
                         "barrier()")
          : absl::StrCat(head, ": the ranks are out of step since a collective waited out the "
                               "negotiation deadline (",
                         out_of_step_, "); ", OutOfStepScope())));
  return true;
}

void NegotiationTable::FailEverywhere(const std::string& name, proto::Response error,
                                      int reporter, bool may_poison) {
  std::set<int> submitted;
  std::vector<int> members = *sets_.Find(0);
  int32_t set = 0;
  if (auto it = table_.find(name); it != table_.end()) {
    may_poison = may_poison && FirstOf(it->second)->collective() != proto::BARRIER;
    for (int r = 0; r < world_size_; ++r) {
      if (it->second.by_rank[r] != nullptr) submitted.insert(r);
    }
    members = MembersOf(it->second);
    set = it->second.set;
    table_.erase(it);
  }
  for (int r : submitted) replies_[r].push_back(error);
  // A name over the limit is refused wherever it is sent: nothing to poison.
  if (!may_poison || name.size() > kMaxNameBytes) return;
  for (int r : members) {
    // A joined rank (Note [Join]) submits no instance of it in this round.
    if (r != reporter && submitted.count(r) == 0 && !JoinedSet(set, r)) {
      poisoned_[name] = Poison{static_cast<absl::StatusCode>(error.error_code()),
                               error.error_message()};
      return;
    }
  }
}

void NegotiationTable::Desynchronize(const std::string& cause, const std::set<int>& ranks) {
  if (out_of_step_.empty()) out_of_step_ = cause;
  out_of_step_ranks_.insert(ranks.begin(), ranks.end());
  // Flush the response cache: under the fast path nothing may be agreed without the
  // coordinator until the barrier. Evicted ids still resolve (retired), as for the LRU.
  for (auto& [id, entry] : cache_) {
    retired_[id] = Retired{entry.request, 0};
    evictions_.push_back(id);
  }
  cache_.clear();
  cache_by_name_.clear();
}

void NegotiationTable::Resynchronize(const std::string& barrier,
                                     const std::vector<int>& members) {
  ResynchronizeNames(members);
  std::vector<Pending> stale = PendingTensors(absl::InfiniteFuture());
  for (const Pending& p : stale) {
    if (!Covers(members, p.ready_ranks) || !Covers(members, p.missing_ranks)) continue;
    FailEverywhere(
        p.name,
        ErrorResponse(p.name, absl::StatusCode::kInvalidArgument,
                      absl::StrCat("tensor '", Truncated(p.name, kMaxNameBytes),
                                   "' was submitted by ", Ranks(p.ready_ranks), " but not by ",
                                   Ranks(p.missing_ranks), " before barrier '",
                                   Truncated(barrier, kMaxNameBytes), "', which every rank",
                                   members.size() == sets_.Find(0)->size()
                                       ? ""
                                       : " of its process set",
                                   " has passed: it can never pair (a rank "
                                   "skipped it or called it under another name)")),
        /*reporter=*/-1, /*may_poison=*/false);  // the others' next calls follow the barrier
  }
}

bool NegotiationTable::IsBarrier(const std::string& name) const {
  auto it = table_.find(name);
  return it != table_.end() && FirstOf(it->second)->collective() == proto::BARRIER;
}

std::vector<std::string> NegotiationTable::ExpireOlderThan(absl::Duration timeout,
                                                           absl::Time now) {
  std::vector<std::string> messages;
  std::vector<Pending> pending = PendingTensors(now);
  std::string first;  // the oldest expired tensor's message
  bool others = false;  // a tensor other than a barrier is pending
  for (const Pending& p : pending) {
    others = others || !IsBarrier(p.name);
    if (p.waiting < timeout) continue;
    messages.push_back(absl::StrCat(
        "tensor '", p.name, "' was not negotiated within ", absl::FormatDuration(timeout),
        " (BRAID_NEGOTIATION_TIMEOUT_S): submitted by ", Ranks(p.ready_ranks), " but not by ",
        Ranks(p.missing_ranks),
        " (ranks calling collectives under different names, or a rank that never calls it)"));
    if (first.empty()) first = messages.back();
  }
  if (first.empty()) return messages;
  // Out of step (Note [Resynchronization]): the ranks of the expired tensors' sets; the
  // flush goes before any error.
  std::set<int> affected;
  for (const Pending& p : pending) {
    if (p.waiting < timeout) continue;
    affected.insert(p.ready_ranks.begin(), p.ready_ranks.end());
    affected.insert(p.missing_ranks.begin(), p.missing_ranks.end());
  }
  Desynchronize(first, affected);
  size_t m = 0;
  for (const Pending& p : pending) {
    const bool expired = p.waiting >= timeout;
    const std::string msg = expired ? messages[m++] : "";
    if (!expired && !Touches(affected, p)) continue;  // a set none of those ranks is in
    if (IsBarrier(p.name)) {
      // A barrier is how the ranks resynchronize: while other calls keep some ranks from
      // it, they fail now and the barrier waits on for them; alone, it expires.
      if (!expired) continue;
      if (others) {
        table_.at(p.name).first_seen = now;
        continue;
      }
    }
    FailEverywhere(
        p.name,
        expired ? ErrorResponse(p.name, absl::StatusCode::kDeadlineExceeded, msg)
                : ErrorResponse(p.name, absl::StatusCode::kFailedPrecondition,
                                absl::StrCat("tensor '", p.name, "' (submitted by ",
                                             Ranks(p.ready_ranks), " but not yet by ",
                                             Ranks(p.missing_ranks),
                                             ") fails with the job's negotiation deadline: ",
                                             first, "; ", OutOfStepScope())),
        /*reporter=*/-1, /*may_poison=*/false);
  }
  return messages;
}

void NegotiationTable::SubmitOne(int rank, RequestPtr req, absl::Time now,
                                 std::vector<proto::Response>* ready) {
  // Note [Resynchronization]: poisoned until the next barrier; barriers never are.
  if (req->collective() != proto::BARRIER && Poisoned(rank, req->name(), /*reply=*/true)) return;
  if (absl::Status bad = ValidateRequest(rank, *req); !bad.ok()) {
    // The sender holds a handle for it: it is answered like the ranks that submitted before.
    replies_[rank].push_back(ErrorResponse(req->name(), bad.code(), std::string(bad.message())));
    FailEverywhere(req->name(), ErrorResponse(req->name(), bad.code(), std::string(bad.message())),
                   rank, /*may_poison=*/req->collective() != proto::BARRIER);
    return;
  }
  const std::vector<int>* members = nullptr;
  if (!CheckSet(rank, *req, &members)) return;
  if (req->collective() == proto::JOIN) return SubmitJoin(rank, *req, now, ready);
  auto [it, inserted] = table_.try_emplace(req->name());
  Entry& e = it->second;
  if (inserted) {
    e.by_rank.resize(world_size_);
    e.arrived.resize(world_size_);
    e.first_seen = now;
    e.set = req->process_set_id();
    e.members = members;
    if (req->collective() == proto::PROCESS_SET_ADD && req->members_only()) {
      e.own_members.assign(req->process_set_ranks().begin(), req->process_set_ranks().end());
      e.members = &e.own_members;  // the entry stays put in table_ (a node-based map)
    }
  }
  if (rank < 0 || rank >= world_size_ || e.by_rank[rank] != nullptr) {
    ready->push_back(ErrorResponse(req->name(), absl::StatusCode::kAlreadyExists,
                           absl::StrCat("tensor '", req->name(), "': rank ", rank,
                                        " submitted it twice before it was negotiated")));
    table_.erase(it);
    return;
  }
  e.arrived[rank] = now;
  e.by_rank[rank] = std::move(req);
  ++e.submitted;
  if (Ready(e)) Respond(it->first, now, ready);
}

const NegotiationTable::RequestPtr& NegotiationTable::FirstOf(const Entry& e) {
  for (const RequestPtr& r : e.by_rank) {
    if (r != nullptr) return r;
  }
  return e.by_rank[0];  // unreachable: an entry exists because some rank submitted it
}

void NegotiationTable::AddReportAges(const Entry& e, absl::Time now, proto::Response* resp) {
  // Per rank, in rank order; a joined rank (or one outside the set) that never submitted it
  // reports 0.
  for (int r = 0; r < world_size_; ++r) {
    resp->add_report_age_us(
        e.by_rank[r] != nullptr ? absl::ToInt64Microseconds(now - e.arrived[r]) : 0);
  }
}

void NegotiationTable::Respond(const std::string& name_ref, absl::Time now,
                               std::vector<proto::Response>* ready) {
  const std::string name = name_ref;  // the table's key: erased below
  const Entry& e = table_.at(name);
  const RequestPtr first_ptr = FirstOf(e);
  const proto::Request& first = *first_ptr;
  const bool change = first.collective() == proto::PROCESS_SET_ADD ||
                      first.collective() == proto::PROCESS_SET_REMOVE;
  ready->push_back(change ? RespondChange(name, e) : Validate(name, e));
  if (change) {
    ++negotiated_;
    table_.erase(name);
    return;
  }
  proto::Response& resp = ready->back();
  if (e.set != 0) ++negotiated_by_set_[e.set];
  // Note [Join]: the joined ranks that did not submit it take part with the op's identity.
  const std::vector<int> fill = JoinedWithout(e);
  if (!fill.empty() && resp.type() == proto::Response::OK) {
    if (first.collective() == proto::ALLREDUCE || first.collective() == proto::BARRIER) {
      for (int rank : fill) resp.add_joined_ranks(rank);
      *resp.add_shapes()->mutable_dims() = first.shape();
    } else {
      resp = ErrorResponse(name, absl::StatusCode::kFailedPrecondition,
                   absl::StrCat("tensor '", name, "': ", CollectiveName(first.collective()),
                                " is not supported while rank", fill.size() > 1 ? "s " : " ",
                                absl::StrJoin(fill, ", "), fill.size() > 1 ? " have" : " has",
                                " joined (join() for uneven inputs covers allreduce and barrier "
                                "only: a joined rank has no data to contribute)"));
    }
  }
  if (report_ages_) AddReportAges(e, now, &resp);
  ++negotiated_;
  if (resp.type() == proto::Response::OK) {
    if (IsValidDataType(first.dtype())) {
      const int64_t bytes = resp.tensor_sizes(0) *
                            static_cast<int64_t>(DataTypeSize(static_cast<DataType>(first.dtype())));
      bytes_negotiated_ += bytes;
      // Per compression method: all-reduces only, the one collective that compresses and
      // the one the ranks' ledgers book (CompressionStat in proto/braid.proto), so that
      // "none"'s bytes_before and bytes_after count the same tensors.
      if (first.collective() == proto::ALLREDUCE) {
        auto& [tensors, total] =
            by_compression_
                .At(first.compression().empty() ? "none" : first.compression(),
                    first.compression_pattern())
                .second;
        ++tensors;
        total += bytes;
      }
    }
    // A response a joined rank takes part in is not cached: the joined rank holds no request
    // to cache, and every rank's cache must stay the same (Note [Fast path] in the runtime).
    resp.add_cache_ids(fill.empty() ? CacheInsert(first_ptr) : 0);
  }
  const bool resync = resp.type() == proto::Response::OK && first.collective() == proto::BARRIER;
  const std::vector<int> members = MembersOf(e);
  table_.erase(name);
  if (resync) Resynchronize(name, members);
}

std::vector<int> NegotiationTable::joined_ranks() const {
  std::vector<int> out;
  if (auto it = joined_.find(0); it != joined_.end()) {
    for (const auto& [rank, name] : it->second) out.push_back(rank);
  }
  return out;
}

std::vector<proto::Response> NegotiationTable::FailTensorsWaitingFor(const std::set<int>& gone) {
  std::vector<proto::Response> out;
  if (gone.empty()) return out;  // the common case, on every RequestList: no table walk
  // Note [Join]: the joined ranks wait for every rank to join, which a rank gone before it
  // joined never will.
  for (auto j = joined_.begin(); j != joined_.end();) {
    const std::vector<int>* members = sets_.Find(j->first);
    std::vector<int> never;
    for (int r : gone) {
      if (members != nullptr && SetRank(*members, r) >= 0 && !j->second.count(r)) {
        never.push_back(r);
      }
    }
    if (never.empty()) {
      ++j;
      continue;
    }
    std::set<std::string> names;
    for (const auto& [rank, name] : j->second) names.insert(name);
    for (const std::string& name : names) {
      out.push_back(ErrorResponse(name, absl::StatusCode::kFailedPrecondition,
                          absl::StrCat("join '", name, "' can never complete: rank",
                                       never.size() > 1 ? "s " : " ", absl::StrJoin(never, ", "),
                                       " shut down without joining")));
    }
    j = joined_.erase(j);
  }
  for (auto it = table_.begin(); it != table_.end();) {
    std::vector<int> missing;
    const std::vector<int>& members = MembersOf(it->second);
    for (int r : gone) {
      if (SetRank(members, r) >= 0 && it->second.by_rank[r] == nullptr) missing.push_back(r);
    }
    if (missing.empty()) {
      ++it;
      continue;
    }
    out.push_back(ErrorResponse(it->first, absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("tensor '", it->first, "' can never complete: rank",
                                     missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
                                     " already shut down")));
    it = table_.erase(it);
  }
  return out;
}

std::vector<NegotiationTable::Pending> NegotiationTable::PendingTensors(
    absl::Time now, absl::Duration min_waiting) const {
  std::vector<Pending> out;
  for (const auto& [name, e] : table_) {
    if (now - e.first_seen < min_waiting) continue;
    Pending p{name, {}, {}, now - e.first_seen};
    for (int r : MembersOf(e)) {
      // A joined rank is ready for every tensor of its set (Note [Join]).
      (e.by_rank[r] != nullptr || JoinedSet(e.set, r) ? p.ready_ranks : p.missing_ranks)
          .push_back(r);
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace braid::coordinator
