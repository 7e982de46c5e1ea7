// Job::FillStatus: what braidctl status shows of one job.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/compression_groups.h"
#include "coordinator/job.h"

namespace braid::coordinator {

std::string Job::JobState() const {
  std::string state = phase_ == proto::JOB_FORMING   ? "forming"
                      : phase_ == proto::JOB_RUNNING ? "running"
                                                     : "ended";
  if (abort_.ok()) return state;
  return absl::StrCat(phase_ == proto::JOB_ENDED ? "ended, " : "", "aborted: ", abort_.message());
}

std::map<std::string, proto::MethodNegotiated> Job::FastPathByMethod() const {
  std::map<std::string, proto::MethodNegotiated> out;
  for (const Rank& r : ranks_) {
    for (const proto::MethodNegotiated& m : r.fast_path) {
      proto::MethodNegotiated& best = out[m.method()];
      if (m.tensors() > best.tensors()) best = m;
    }
  }
  return out;
}

std::map<std::pair<std::string, std::string>, proto::MethodNegotiated> Job::FastPathByGroup()
    const {
  std::map<std::pair<std::string, std::string>, proto::MethodNegotiated> out;
  for (const Rank& r : ranks_) {
    for (const proto::MethodNegotiated& m : r.fast_path_groups) {
      proto::MethodNegotiated& best = out[{m.method(), m.pattern()}];
      if (m.tensors() > best.tensors()) best = m;
    }
  }
  return out;
}

namespace {

using StatGroups = control::CompressionGroups<proto::CompressionStat>;

// Adds one rank's reported counters (MethodBytes, per group) to `groups`; the rank counts
// once among a row's ranks_reporting, even where two of its groups fold into one row.
void AddRankReport(const std::vector<proto::MethodBytes>& report, StatGroups* groups) {
  std::set<const proto::CompressionStat*> reported;
  for (const proto::MethodBytes& m : report) {
    proto::CompressionStat& c = groups->At(m.method(), m.pattern()).second;
    c.set_reductions(c.reductions() + m.reductions());
    c.set_uncompressed_bytes(c.uncompressed_bytes() + m.uncompressed_bytes());
    c.set_payload_bytes(c.payload_bytes() + m.payload_bytes());
    c.set_transport_bytes(c.transport_bytes() + m.transport_bytes());
    c.set_reference_transport_bytes(c.reference_transport_bytes() +
                                    m.reference_transport_bytes());
    if (reported.insert(&c).second) c.set_ranks_reporting(c.ranks_reporting() + 1);
  }
}

// The row of `method` and `pattern`, its counts summed: bytes_after and the ratio.
proto::CompressionStat Row(const std::string& method, const std::string& pattern,
                           proto::CompressionStat c) {
  c.set_method(method);
  c.set_pattern(pattern);
  if (c.ranks_reporting() > 0) {
    c.set_bytes_after(c.payload_bytes() / c.ranks_reporting());
    c.set_ratio(c.payload_bytes() == 0 ? 0.0
                                       : static_cast<double>(c.uncompressed_bytes()) /
                                             static_cast<double>(c.payload_bytes()));
  } else {
    // No rank reported yet (or a client that does not report): only "none" is known from
    // negotiation alone, its payload being the tensor itself.
    c.set_bytes_after(method == "none" ? c.bytes_before() : 0);
    c.set_ratio(method == "none" ? 1.0 : 0.0);
  }
  return c;
}

}  // namespace

// One row per group of tensors (method, plan pattern: Note [Compression groups]), by method
// then pattern: what was negotiated (one rank's share) merged with what the ranks reported
// (summed over them), in one table bounded as the ranks' own (the ranks in order first, then
// negotiation, then the fast path). See CompressionStat in proto/braid.proto.
std::vector<proto::CompressionStat> Job::CompressionStats() const {
  // The ranks' byte rows first, so that they keep the bound's named rows: the coordinator's
  // own counts add rows the ranks do not have (`auto`'s tensors, under the spec `auto`, whose
  // bytes the ranks book under the chosen method), which fold before the bytes do.
  StatGroups groups;
  for (const Rank& r : ranks_) AddRankReport(r.compression, &groups);
  if (table_) {
    table_->by_compression().ForEach([&groups](const std::string& method,
                                               const std::string& pattern,
                                               const std::pair<int64_t, int64_t>& counts) {
      proto::CompressionStat& c = groups.At(method, pattern).second;
      c.set_tensors(c.tensors() + counts.first);
      c.set_bytes_before(c.bytes_before() + counts.second);
    });
  }
  for (const auto& [group, m] : FastPathByGroup()) {
    proto::CompressionStat& c = groups.At(group.first, group.second).second;
    c.set_tensors(c.tensors() + m.tensors());
    c.set_bytes_before(c.bytes_before() + m.bytes());
  }
  std::vector<proto::CompressionStat> out;
  out.reserve(groups.size());
  groups.ForEach([&out](const std::string& method, const std::string& pattern,
                        const proto::CompressionStat& c) {
    out.push_back(Row(method, pattern, c));
  });
  return out;
}

void Job::FillProcessSets(proto::StatusResponse* resp) const {
  // Note [Process sets] (control/process_sets.h): every set but the world's, by id, with what
  // was negotiated in it: by the coordinator, and by the ranks' fast path as their heartbeats
  // report it (every rank counts the same agreed work: the largest report).
  const std::map<int32_t, NegotiationTable::SetCounts> counts = table_->process_set_counts();
  for (const auto& [id, ranks] : table_->process_sets().sets()) {
    proto::ProcessSetStatus* ps = resp->add_process_sets();
    ps->set_id(id);
    for (int r : ranks) ps->add_ranks(r);
    int64_t fast = 0;
    for (const Rank& r : ranks_) {
      if (auto f = r.fast_path_sets.find(id); f != r.fast_path_sets.end()) {
        fast = std::max(fast, f->second);
      }
    }
    ps->set_tensors_negotiated(fast);
    if (auto it = counts.find(id); it != counts.end()) {
      ps->set_tensors_negotiated(it->second.negotiated + fast);
      ps->set_tensors_pending(it->second.pending);
    }
  }
}

void Job::FillStatus(absl::Time now, proto::StatusResponse* resp) const {
  resp->set_job_id(id());
  resp->set_phase(phase_);
  resp->set_job_state(JobState());
  if (!abort_.ok()) resp->set_abort_message(std::string(abort_.message()));
  resp->set_size(world_size_);
  resp->set_register_rpcs(register_rpcs_);
  resp->set_kv_rpcs(kv_rpcs_);
  resp->set_cycles(cycles_);
  // Work the ranks agreed among themselves (BRAID_FAST_PATH) counts as if negotiated here.
  int64_t fast_buckets = 0, fast_tensors = 0, fast_bytes = 0;
  for (const Rank& r : ranks_) fast_buckets = std::max(fast_buckets, r.fast_path_buckets);
  for (const auto& [method, m] : FastPathByMethod()) {
    fast_tensors += m.tensors();
    fast_bytes += m.bytes();
  }
  resp->set_responses_sent(responses_sent_ + fast_buckets);
  resp->set_job_elapsed_ms(first_registration_ == absl::InfinitePast()
                               ? 0
                               : absl::ToInt64Milliseconds(now - first_registration_));
  if (phase_ != proto::JOB_FORMING && table_) *resp->mutable_settings() = settings_;
  FillSettingsChange(resp);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    proto::RankStatus* s = resp->add_ranks();
    s->set_rank(static_cast<int>(r));
    s->set_host(ranks_[r].host);
    s->set_pid(ranks_[r].pid);
    s->set_state(std::string(RankStateName(ranks_[r].state)));
    s->set_last_seen_ms_ago(ranks_[r].last_seen == absl::InfinitePast()
                                ? -1
                                : absl::ToInt64Milliseconds(now - ranks_[r].last_seen));
  }
  // While the job forms, the ranks that registered so far (a rank of -1 has not been
  // assigned one yet: the coordinator assigns them in registration order when it forms).
  for (const Pending& p : pending_) {
    proto::RankStatus* s = resp->add_ranks();
    s->set_rank(p.request.rank());
    s->set_host(p.request.host());
    s->set_pid(p.request.pid());
    s->set_state(std::string(RankStateName(RankState::kRegistered)));
    s->set_last_seen_ms_ago(
        absl::ToInt64Milliseconds(now - (p.deadline - opts_.register_timeout)));
  }
  for (proto::CompressionStat& c : CompressionStats()) *resp->add_compression() = std::move(c);
  if (!table_) return;
  resp->set_tensors_negotiated(table_->tensors_negotiated() + fast_tensors);
  resp->set_bytes_negotiated(table_->bytes_negotiated() + fast_bytes);
  FillProcessSets(resp);
  const absl::Duration check = absl::Milliseconds(settings_.stall_check_ms());
  auto pending = table_->PendingTensors(now);
  resp->set_tensors_pending(static_cast<int64_t>(pending.size()));
  for (const auto& p : pending) {
    proto::PendingTensor* t = resp->add_pending();
    t->set_name(p.name);
    for (int r : p.ready_ranks) t->add_ready_ranks(r);
    for (int r : p.missing_ranks) t->add_missing_ranks(r);
    t->set_waiting_ms(absl::ToInt64Milliseconds(p.waiting));
    t->set_stalled(p.waiting >= check);
  }
}

}  // namespace braid::coordinator
