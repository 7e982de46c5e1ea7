#include "coordinator/rendezvous.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/limits.h"
#include "common/status_macros.h"

namespace braid::coordinator {

namespace {

// Each request's rank: the one it claimed (once, inside the world), else the lowest free.
absl::StatusOr<std::vector<int>> RanksOf(const std::vector<proto::RegisterRequest>& requests,
                                         int world_size) {
  const int n = static_cast<int>(requests.size());
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
  return rank_of;
}

// Each request's (local rank, local size): as the launcher gave them when every request has
// them, else counted per host in rank order.
void LocalRanksOf(const std::vector<proto::RegisterRequest>& requests,
                  const std::vector<int>& index_of_rank, std::vector<int>* local_rank,
                  std::vector<int>* local_size) {
  const int n = static_cast<int>(requests.size());
  bool all_local_given = true;
  for (const auto& r : requests) {
    all_local_given = all_local_given && r.local_rank() >= 0 && r.local_size() > 0;
  }
  local_rank->assign(n, 0);
  local_size->assign(n, 0);
  if (all_local_given) {
    for (int i = 0; i < n; ++i) {
      (*local_rank)[i] = requests[i].local_rank();
      (*local_size)[i] = requests[i].local_size();
    }
    return;
  }
  std::map<std::string, int> count;
  for (int r = 0; r < n; ++r) {
    int i = index_of_rank[r];
    (*local_rank)[i] = count[requests[i].host()]++;
  }
  for (int i = 0; i < n; ++i) (*local_size)[i] = count[requests[i].host()];
}

}  // namespace

absl::StatusOr<std::vector<proto::RegisterResponse>> AssignRanks(
    const std::vector<proto::RegisterRequest>& requests, int world_size) {
  const int n = static_cast<int>(requests.size());
  if (n != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " ranks registered for a world of size ", world_size));
  }
  auto ranks = RanksOf(requests, world_size);
  if (!ranks.ok()) return ranks.status();
  const std::vector<int>& rank_of = *ranks;
  std::vector<int> index_of_rank(n);
  for (int i = 0; i < n; ++i) index_of_rank[rank_of[i]] = i;
  std::vector<int> local_rank, local_size;
  LocalRanksOf(requests, index_of_rank, &local_rank, &local_size);
  const bool homogeneous =
      std::all_of(local_size.begin(), local_size.end(), [&](int s) { return s == local_size[0]; });
  std::vector<proto::RegisterResponse> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].set_rank(rank_of[i]);
    out[i].set_size(world_size);
    out[i].set_local_rank(local_rank[i]);
    out[i].set_local_size(local_size[i]);
    out[i].set_homogeneous(homogeneous);
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

namespace {

// One job-wide setting: the variable that sets it and how to read and show its proto field.
struct SettingField {
  const char* variable;
  bool (proto::JobSettings::*has)() const;
  int64_t (*get)(const proto::JobSettings&);
  void (*set)(proto::JobSettings*, int64_t);
  bool milliseconds;  // shown in seconds, like its variable
  // The values' names, by value, where the variable takes names (null: a number).
  const char* const* names = nullptr;
  int64_t name_count = 0;
};

constexpr const char* kGpuDataPlanes[] = {"auto", "nccl", "host"};

const SettingField kSettingFields[] = {
    {"BRAID_FUSION_THRESHOLD", &proto::JobSettings::has_fusion_threshold_bytes,
     [](const proto::JobSettings& s) { return s.fusion_threshold_bytes(); },
     [](proto::JobSettings* s, int64_t v) { s->set_fusion_threshold_bytes(v); }, false},
    {"BRAID_CACHE_CAPACITY", &proto::JobSettings::has_cache_capacity,
     [](const proto::JobSettings& s) { return static_cast<int64_t>(s.cache_capacity()); },
     [](proto::JobSettings* s, int64_t v) { s->set_cache_capacity(static_cast<int32_t>(v)); },
     false},
    {"BRAID_STALL_CHECK_S", &proto::JobSettings::has_stall_check_ms,
     [](const proto::JobSettings& s) { return s.stall_check_ms(); },
     [](proto::JobSettings* s, int64_t v) { s->set_stall_check_ms(v); }, true},
    {"BRAID_STALL_SHUTDOWN_S", &proto::JobSettings::has_stall_shutdown_ms,
     [](const proto::JobSettings& s) { return s.stall_shutdown_ms(); },
     [](proto::JobSettings* s, int64_t v) { s->set_stall_shutdown_ms(v); }, true},
    {"BRAID_HEARTBEAT_TIMEOUT_S", &proto::JobSettings::has_heartbeat_timeout_ms,
     [](const proto::JobSettings& s) { return s.heartbeat_timeout_ms(); },
     [](proto::JobSettings* s, int64_t v) { s->set_heartbeat_timeout_ms(v); }, true},
    {"BRAID_NEGOTIATION_TIMEOUT_S", &proto::JobSettings::has_negotiation_timeout_ms,
     [](const proto::JobSettings& s) { return s.negotiation_timeout_ms(); },
     [](proto::JobSettings* s, int64_t v) { s->set_negotiation_timeout_ms(v); }, true},
    {"BRAID_FAST_PATH", &proto::JobSettings::has_fast_path,
     [](const proto::JobSettings& s) { return s.fast_path(); },
     [](proto::JobSettings* s, int64_t v) { s->set_fast_path(v); }, false},
    {"BRAID_GPU_DATA_PLANE", &proto::JobSettings::has_gpu_data_plane,
     [](const proto::JobSettings& s) { return s.gpu_data_plane(); },
     [](proto::JobSettings* s, int64_t v) { s->set_gpu_data_plane(v); }, false,
     kGpuDataPlanes, 3},
    {"BRAID_RING_CHUNK_BYTES", &proto::JobSettings::has_ring_chunk_bytes,
     [](const proto::JobSettings& s) { return s.ring_chunk_bytes(); },
     [](proto::JobSettings* s, int64_t v) { s->set_ring_chunk_bytes(v); }, false},
    {"BRAID_RING_WINDOW", &proto::JobSettings::has_ring_window,
     [](const proto::JobSettings& s) { return s.ring_window(); },
     [](proto::JobSettings* s, int64_t v) { s->set_ring_window(v); }, false},
    {"BRAID_AUTOTUNE", &proto::JobSettings::has_autotune,
     [](const proto::JobSettings& s) { return s.autotune(); },
     [](proto::JobSettings* s, int64_t v) { s->set_autotune(v); }, false},
};

// A value as its variable spells it: bytes and entries as integers, durations in seconds
// ("1.5", "60").
std::string Show(const SettingField& f, int64_t v) {
  if (v >= 0 && v < f.name_count) return f.names[v];
  if (!f.milliseconds) return absl::StrCat(v);
  std::string frac = absl::StrFormat("%03d", v % 1000);
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return absl::StrCat(v / 1000, frac.empty() ? "" : ".", frac);
}

// The ranks' own parsing refuses these (runtime/config.cc); a client of another version, or
// not braid's, would reach the data plane with them.
absl::Status CheckRanges(const proto::JobSettings& s) {
  if (s.ring_window() < 1 || s.ring_window() > kMaxRingWindow ||
      (s.ring_chunk_bytes() != 0 &&
       (s.ring_chunk_bytes() < kMinRingChunkBytes || s.ring_chunk_bytes() > kMaxRingChunkBytes)) ||
      s.autotune() < 0 || s.autotune() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BRAID_RING_WINDOW = ", s.ring_window(), ", BRAID_RING_CHUNK_BYTES = ",
        s.ring_chunk_bytes(), ", BRAID_AUTOTUNE = ", s.autotune(),
        ": out of range (window 1 to ", kMaxRingWindow, ", chunk 0 or ", kMinRingChunkBytes,
        " to ", kMaxRingChunkBytes, " bytes, autotune 0 or 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

proto::JobSettings DefaultJobSettings() {
  proto::JobSettings s;
  s.set_fusion_threshold_bytes(int64_t{64} << 20);
  s.set_cache_capacity(1024);
  s.set_stall_check_ms(60 * 1000);
  s.set_stall_shutdown_ms(0);
  s.set_heartbeat_timeout_ms(10 * 1000);
  // Long: a checkpoint or an evaluation on one rank while the others wait is normal.
  s.set_negotiation_timeout_ms(1800 * 1000);
  s.set_fast_path(kDefaultFastPath);
  s.set_gpu_data_plane(0);  // auto
  s.set_ring_chunk_bytes(0);  // by topology
  s.set_ring_window(4);
  s.set_autotune(0);
  return s;
}

absl::StatusOr<proto::JobSettings> ResolveJobSettings(
    const proto::JobSettings& coordinator, const std::vector<proto::RegisterRequest>& requests,
    const std::vector<proto::RegisterResponse>& assigned) {
  proto::JobSettings out = DefaultJobSettings();
  for (const SettingField& f : kSettingFields) {
    std::map<int, int64_t> by_rank;  // ranks that set the variable
    for (size_t i = 0; i < requests.size(); ++i) {
      if ((requests[i].settings().*f.has)()) by_rank[assigned[i].rank()] = f.get(requests[i].settings());
    }
    std::optional<int64_t> decided;
    if ((coordinator.*f.has)()) decided = f.get(coordinator);
    else if (!by_rank.empty()) decided = by_rank.begin()->second;
    if (!decided) continue;
    if (f.name_count > 0 && (*decided < 0 || *decided >= f.name_count)) {
      // A client of another version, or not braid's: its number names no value.
      return absl::InvalidArgumentError(absl::StrCat(
          f.variable, " = ", *decided,
          (coordinator.*f.has)() ? " at the coordinator"
                                 : absl::StrCat(" on rank ", by_rank.begin()->first),
          " names no value (", f.name_count, " values: ",
          absl::StrJoin(f.names, f.names + f.name_count, ", "), ")"));
    }
    // Group the ranks that disagree with the decision by their value.
    std::map<int64_t, std::vector<int>> others;
    for (const auto& [rank, v] : by_rank) {
      if (v != *decided) others[v].push_back(rank);
    }
    if (!others.empty()) {
      std::vector<std::string> parts;
      if ((coordinator.*f.has)()) {
        parts.push_back(absl::StrCat(Show(f, *decided), " at the coordinator"));
      } else {
        std::vector<int> agree;
        for (const auto& [rank, v] : by_rank) {
          if (v == *decided) agree.push_back(rank);
        }
        parts.push_back(absl::StrCat(Show(f, *decided), " on rank", agree.size() > 1 ? "s " : " ",
                                     absl::StrJoin(agree, ", ")));
      }
      for (const auto& [v, ranks] : others) {
        parts.push_back(absl::StrCat(Show(f, v), " on rank", ranks.size() > 1 ? "s " : " ",
                                     absl::StrJoin(ranks, ", ")));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          f.variable, " must be the same for the whole job, got ", absl::StrJoin(parts, "; ")));
    }
    f.set(&out, *decided);
  }
  BRAID_RETURN_IF_ERROR(CheckRanges(out));
  return out;
}

absl::StatusOr<std::vector<proto::RegisterResponse>> FormJob(
    const std::vector<proto::RegisterRequest>& requests, int world_size,
    const proto::JobSettings& coordinator) {
  auto assigned = AssignRanks(requests, world_size);
  if (!assigned.ok()) return assigned.status();
  auto settings = ResolveJobSettings(coordinator, requests, *assigned);
  if (!settings.ok()) return settings.status();
  for (proto::RegisterResponse& r : *assigned) *r.mutable_settings() = *settings;
  return assigned;
}

}  // namespace braid::coordinator
