// The negotiation table's process sets (Note [Process sets] in control/process_sets.h): who
// must submit a tensor, joins (per set: Note [Join]), and the changes of the sets themselves.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "coordinator/negotiation.h"

namespace braid::coordinator {

const std::vector<int>& NegotiationTable::MembersOf(const Entry& e) const {
  return e.members != nullptr ? *e.members : *sets_.Find(0);
}

bool NegotiationTable::JoinedSet(int32_t set, int rank) const {
  auto it = joined_.find(set);
  return it != joined_.end() && it->second.count(rank) != 0;
}

bool NegotiationTable::Ready(const Entry& e) const {
  int count = e.submitted;
  const proto::Collective c = FirstOf(e)->collective();
  // A joined rank takes part in its set's all-reduces and barriers, never in a change of
  // the sets (Note [Process sets]).
  if (auto it = joined_.find(e.set);
      it != joined_.end() && c != proto::PROCESS_SET_ADD && c != proto::PROCESS_SET_REMOVE) {
    for (const auto& [rank, name] : it->second) count += e.by_rank[rank] != nullptr ? 0 : 1;
  }
  return count >= static_cast<int>(MembersOf(e).size());
}

bool NegotiationTable::CheckSet(int rank, const proto::Request& req,
                                const std::vector<int>** members) {
  const proto::Collective c = req.collective();
  auto refuse = [&](const std::string& why) {
    replies_[rank].push_back(ErrorResponse(
        req.name(), absl::StatusCode::kInvalidArgument,
        absl::StrCat(CollectiveName(c), " '", Truncated(req.name(), kMaxNameBytes), "' on rank ",
                     rank, ": ", why)));
    return false;
  };
  if (c == proto::PROCESS_SET_ADD || c == proto::PROCESS_SET_REMOVE) {
    if (req.process_set_id() != 0) return refuse("the process sets change in set 0 only");
  }
  if (c == proto::PROCESS_SET_ADD) {
    std::vector<int> ranks(req.process_set_ranks().begin(), req.process_set_ranks().end());
    if (absl::Status s = sets_.CheckRanks(ranks); !s.ok()) return refuse(std::string(s.message()));
    if (req.members_only() && SetRank(ranks, rank) < 0) {
      return refuse(absl::StrCat("the rank is not in the new set ", RanksText(ranks)));
    }
  }
  const std::vector<int>* m = sets_.Find(req.process_set_id());
  if (m == nullptr) {
    return refuse(absl::StrCat("process set ", req.process_set_id(),
                               " does not exist (never added, or removed)"));
  }
  if (req.process_set_id() != 0 && SetRank(*m, rank) < 0) {
    return refuse(absl::StrCat("rank ", rank, " is not in process set ", req.process_set_id(),
                               " (ranks ", absl::StrJoin(*m, ", "), ")"));
  }
  *members = req.process_set_id() == 0 ? nullptr : m;
  return true;
}

proto::Response NegotiationTable::RespondChange(const std::string& name, const Entry& e) {
  auto ranks_of = [](const proto::Request& r) {
    return std::vector<int>(r.process_set_ranks().begin(), r.process_set_ranks().end());
  };
  auto text = [&](const proto::Request& r) {
    return r.collective() == proto::PROCESS_SET_ADD
               ? absl::StrCat("add_process_set(", RanksText(ranks_of(r)), ")")
               : r.collective() == proto::PROCESS_SET_REMOVE
                     ? absl::StrCat("remove_process_set(", r.target_process_set_id(), ")")
                     : CollectiveName(r.collective());
  };
  const proto::Request& first = *FirstOf(e);
  std::map<int, std::string> asked;
  bool same = true;
  const std::string want = text(first);
  for (int r : MembersOf(e)) {
    if (e.by_rank[r] == nullptr) continue;
    asked[r] = text(*e.by_rank[r]);
    same = same && asked[r] == want;
  }
  if (!same) {
    return ErrorResponse(name, absl::StatusCode::kInvalidArgument,
                         absl::StrCat(MismatchMessage(name, "the process set change", asked),
                                      " (every rank must add and remove the same process sets "
                                      "in the same order)"));
  }
  proto::Response resp;
  resp.set_type(proto::Response::OK);
  resp.add_names(name);
  resp.set_collective(first.collective());
  if (first.collective() == proto::PROCESS_SET_ADD) {
    const std::vector<int> ranks = ranks_of(first);
    int32_t id = first.members_only() ? sets_.IdOf(ranks) : -1;
    if (id < 0) {
      absl::StatusOr<int32_t> added = sets_.Add(ranks);
      if (!added.ok()) {
        return ErrorResponse(name, added.status().code(),
                             absl::StrCat(want, ": ", added.status().message()));
      }
      id = *added;
    }
    resp.set_target_process_set_id(id);
    for (int r : ranks) resp.add_process_set_ranks(r);
    return resp;
  }
  return RemoveSet(name, want, first.target_process_set_id(), std::move(resp));
}


proto::Response NegotiationTable::RemoveSet(const std::string& name, const std::string& want,
                                           int32_t target, proto::Response resp) {
  const std::vector<int>* members = target == 0 ? nullptr : sets_.Find(target);
  if (members == nullptr) {
    return ErrorResponse(
        name, absl::StatusCode::kInvalidArgument,
        absl::StrCat(want, ": ",
                     target == 0 ? "process set 0 (the whole world) cannot be removed"
                                 : absl::StrCat("process set ", target, " does not exist")));
  }
  const std::string set_text = absl::StrCat("process set ", target, " ", RanksText(*members));
  for (int r : *members) resp.add_process_set_ranks(r);
  // Its collectives still pending fail on the members that submitted them; the others'
  // later calls fail at once on the set (it no longer exists).
  std::vector<std::string> pending;
  for (const auto& [n, entry] : table_) {
    if (entry.set == target) pending.push_back(n);
  }
  for (const std::string& n : pending) {
    FailEverywhere(n,
                   ErrorResponse(n, absl::StatusCode::kFailedPrecondition,
                                 absl::StrCat("tensor '", Truncated(n, kMaxNameBytes),
                                              "' was pending in ", set_text, " when ", want,
                                              " removed the set")),
                   /*reporter=*/-1, /*may_poison=*/false);
  }
  if (auto it = joined_.find(target); it != joined_.end()) {
    for (const auto& [r, join_name] : it->second) {
      replies_[r].push_back(ErrorResponse(
          join_name, absl::StatusCode::kFailedPrecondition,
          absl::StrCat("join '", join_name, "' was pending in ", set_text, " when ", want,
                       " removed the set")));
    }
    joined_.erase(it);
  }
  (void)sets_.Remove(target);
  resp.set_target_process_set_id(target);
  return resp;
}

std::map<int32_t, NegotiationTable::SetCounts> NegotiationTable::process_set_counts() const {
  std::map<int32_t, SetCounts> out;
  for (const auto& [id, ranks] : sets_.sets()) {
    auto it = negotiated_by_set_.find(id);
    out[id].negotiated = it == negotiated_by_set_.end() ? 0 : it->second;
  }
  for (const auto& [name, e] : table_) {
    if (auto it = out.find(e.set); it != out.end()) ++it->second.pending;
  }
  return out;
}

void NegotiationTable::SubmitJoin(int rank, const proto::Request& req, absl::Time now,
                                  std::vector<proto::Response>* ready) {
  const int32_t set = req.process_set_id();
  std::map<int, std::string>& joined = joined_[set];
  if (joined.count(rank)) {
    ready->push_back(ErrorResponse(req.name(), absl::StatusCode::kAlreadyExists,
                           absl::StrCat("join '", req.name(), "': rank ", rank,
                                        " joined twice before every rank had joined")));
    return;
  }
  joined[rank] = req.name();
  last_joined_[set] = rank;
  // Tensors of the set that were waiting only for this rank are ready now, in the table's
  // (name) order: every rank receives the same list.
  std::vector<std::string> now_ready;
  for (const auto& [name, e] : table_) {
    if (e.set == set && Ready(e)) now_ready.push_back(name);
  }
  for (const std::string& name : now_ready) {
    // A barrier among them fails the stale others (Note [Resynchronization]).
    if (table_.count(name) != 0) Respond(name, now, ready);
  }
  auto it = joined_.find(set);  // Respond may have changed joined_ (not this set's entry)
  if (static_cast<int>(it->second.size()) < static_cast<int>(sets_.Find(set)->size())) return;
  std::map<int, std::string> names;
  names.swap(it->second);
  joined_.erase(it);
  proto::Response resp;
  const std::string& agreed = names.begin()->second;
  if (std::all_of(names.begin(), names.end(), [&](const auto& kv) { return kv.second == agreed; })) {
    resp.set_type(proto::Response::OK);
    resp.add_names(agreed);
    resp.set_collective(proto::JOIN);
    resp.set_last_joined_rank(last_joined_[set]);
  } else {
    resp = ErrorResponse(agreed, absl::StatusCode::kInvalidArgument,
                 MismatchMessage(agreed, "join name", names));
    for (const auto& [r, n] : names) {
      if (n != agreed) resp.add_names(n);
    }
  }
  resp.set_process_set_id(set);  // only the set's members run it
  ready->push_back(std::move(resp));
}

std::vector<int> NegotiationTable::JoinedWithout(const Entry& e) const {
  std::vector<int> out;
  if (auto it = joined_.find(e.set); it != joined_.end()) {
    for (const auto& [rank, join_name] : it->second) {
      if (e.by_rank[rank] == nullptr) out.push_back(rank);
    }
  }
  return out;
}

const std::vector<int>& NegotiationTable::MembersOfName(const std::string& name) const {
  if (absl::StartsWith(name, "ps")) {
    const size_t slash = name.find('/');
    int32_t id = 0;
    if (slash != std::string::npos && absl::SimpleAtoi(name.substr(2, slash - 2), &id) &&
        id > 0 && QualifiedName(id, name.substr(slash + 1)) == name) {
      if (const std::vector<int>* m = sets_.Find(id); m != nullptr) return *m;
    }
  }
  return *sets_.Find(0);
}

bool NegotiationTable::OutOfStep(const std::vector<int>& members) const {
  for (int r : members) {
    if (out_of_step_ranks_.count(r) != 0) return true;
  }
  return false;
}

bool NegotiationTable::Covers(const std::vector<int>& members, const std::vector<int>& ranks) {
  for (int r : ranks) {
    if (!std::binary_search(members.begin(), members.end(), r)) return false;
  }
  return true;
}

bool NegotiationTable::Touches(const std::set<int>& ranks, const Pending& p) {
  for (const std::vector<int>* v : {&p.ready_ranks, &p.missing_ranks}) {
    for (int r : *v) {
      if (ranks.count(r) != 0) return true;
    }
  }
  return false;
}

std::string NegotiationTable::OutOfStepScope() const {
  if (out_of_step_ranks_.size() == sets_.Find(0)->size()) {
    return "every collective fails on every rank until all ranks call barrier()";
  }
  return absl::StrCat("every collective of a set holding ",
                      Ranks(std::vector<int>(out_of_step_ranks_.begin(), out_of_step_ranks_.end())),
                      " (the whole job's included) fails until they call barrier() together, in "
                      "the whole job or in a process set that holds them; other sets go on");
}

void NegotiationTable::ResynchronizeNames(const std::vector<int>& members) {
  for (auto it = poisoned_.begin(); it != poisoned_.end();) {
    it = Covers(members, MembersOfName(it->first)) ? poisoned_.erase(it) : std::next(it);
  }
  const std::vector<int> out(out_of_step_ranks_.begin(), out_of_step_ranks_.end());
  if (Covers(members, out)) {
    out_of_step_ranks_.clear();
    out_of_step_.clear();
  }
}

}  // namespace braid::coordinator
