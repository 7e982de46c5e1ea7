#include "control/process_sets.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid {

ProcessSetTable::ProcessSetTable(int world_size) : world_(std::max(world_size, 0)) {
  std::iota(world_.begin(), world_.end(), 0);
}

const std::vector<int>* ProcessSetTable::Find(int32_t id) const {
  if (id == 0) return &world_;
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : &it->second;
}

int32_t ProcessSetTable::IdOf(const std::vector<int>& ranks) const {
  if (ranks == world_) return 0;
  for (const auto& [id, members] : sets_) {
    if (members == ranks) return id;
  }
  return -1;
}

absl::Status ProcessSetTable::CheckRanks(const std::vector<int>& ranks) const {
  if (ranks.empty()) return absl::InvalidArgumentError("a process set needs at least one rank");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size()) {
      return absl::InvalidArgumentError(absl::StrCat("process set ", RanksText(ranks), ": rank ",
                                                     ranks[i], " is not a rank of a world of size ",
                                                     world_size()));
    }
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process set ", RanksText(ranks), ": ranks must be ascending and distinct"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> ProcessSetTable::Add(const std::vector<int>& ranks) {
  if (absl::Status s = CheckRanks(ranks); !s.ok()) return s;
  if (int32_t id = IdOf(ranks); id >= 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "process set ", RanksText(ranks), " already exists as process set ", id,
        id == 0 ? " (the whole world, global_process_set)" : ""));
  }
  int32_t id = 1;
  for (const auto& [used, members] : sets_) {
    if (used != id) break;
    ++id;
  }
  if (id > kMaxProcessSets) {
    return absl::FailedPreconditionError(absl::StrCat(
        "process set ", RanksText(ranks), ": ", kMaxProcessSets,
        " process sets already exist, the most braid keeps at once; remove one first"));
  }
  sets_[id] = ranks;
  return id;
}

absl::Status ProcessSetTable::AddAs(int32_t id, const std::vector<int>& ranks) {
  if (absl::Status s = CheckRanks(ranks); !s.ok()) return s;
  if (id <= 0 || id > kMaxProcessSets || sets_.count(id) != 0) {
    return absl::InternalError(absl::StrCat("process set ", id, " cannot be added here"));
  }
  sets_[id] = ranks;
  return absl::OkStatus();
}

absl::Status ProcessSetTable::Remove(int32_t id) {
  if (id == 0) {
    return absl::InvalidArgumentError("process set 0 (the whole world) cannot be removed");
  }
  if (sets_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("process set ", id, " does not exist"));
  }
  return absl::OkStatus();
}

int SetRank(const std::vector<int>& ranks, int rank) {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
  return it != ranks.end() && *it == rank ? static_cast<int>(it - ranks.begin()) : -1;
}

std::string QualifiedName(int32_t id, const std::string& name) {
  return id == 0 ? name : absl::StrCat("ps", id, "/", name);
}

std::string RanksText(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace braid
