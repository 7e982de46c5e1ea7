// Job::Inspect and its parts: what the monitor checks of a job periodically (registration
// and negotiation deadlines, liveness, stalls, the job's end).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "coordinator/job.h"
#include "coordinator/rendezvous.h"
#include "glog/logging.h"

namespace braid::coordinator {

void Job::Inspect(absl::Time now, Completions* out) {
  // Once one registration has waited its register timeout the world cannot form with it:
  // every registration waiting fails with the same message, naming the missing ranks.
  const bool expired = std::any_of(pending_.begin(), pending_.end(),
                                   [&](const Pending& p) { return now >= p.deadline; });
  if (expired) {
    FailRegistrations(absl::DeadlineExceededError(MissingRegistrations()), out);
    return;
  }
  if (phase_ != proto::JOB_RUNNING) return;
  InspectLiveness(now);
  InspectStalls(now);
  InspectNegotiationDeadline(now);
  MaybeEnd(now);
}

std::string Job::MissingRegistrations() const {
  // Who came, and which ranks did not: the ranks AssignRanks would give the registrations
  // without a rank of their own are the lowest free ones, in registration order; each is
  // named with the rank it was given ("assigned"), not as a bare pid.
  std::set<int> claimed;
  for (const Pending& p : pending_) {
    if (p.request.rank() >= 0) claimed.insert(p.request.rank());
  }
  std::vector<int> free;
  for (int r = 0; r < world_size_; ++r) {
    if (!claimed.count(r)) free.push_back(r);
  }
  size_t next_free = 0;
  std::vector<std::string> came;
  for (const Pending& p : pending_) {
    const proto::RegisterRequest& r = p.request;
    if (r.rank() >= 0) {
      came.push_back(Registrant(r));
    } else if (next_free < free.size()) {
      came.push_back(absl::StrCat("rank ", free[next_free++], " (assigned; ", Registrant(r), ")"));
    } else {
      came.push_back(absl::StrCat("unassigned (", Registrant(r), ")"));
    }
  }
  std::vector<int> missing(free.begin() + std::min(next_free, free.size()), free.end());
  // Named one by one up to a point: a world of thousands would make an unreadable message.
  constexpr size_t kNamed = 32;
  std::string missing_list = absl::StrJoin(
      missing.begin(), missing.begin() + std::min(missing.size(), kNamed), ", ");
  if (missing.size() > kNamed) {
    absl::StrAppend(&missing_list, " and ", missing.size() - kNamed, " more");
  }
  if (came.size() > kNamed) {
    const size_t more = came.size() - kNamed;
    came.resize(kNamed);
    came.push_back(absl::StrCat("and ", more, " more"));
  }
  return absl::StrCat("only ", pending_.size(), " of ", world_size_,
                      " ranks registered within ", absl::FormatDuration(opts_.register_timeout),
                      ": missing rank", missing.size() == 1 ? " " : "s ", missing_list,
                      "; registered: ", absl::StrJoin(came, ", "));
}

// Note [Failure reports] in negotiation.h: a tensor not negotiated within the job's
// negotiation timeout fails on the ranks that submitted it, naming those that did not.
void Job::InspectNegotiationDeadline(absl::Time now) {
  if (!abort_.ok() || settings_.negotiation_timeout_ms() <= 0) return;
  for (const std::string& msg : table_->ExpireOlderThan(
           absl::Milliseconds(settings_.negotiation_timeout_ms()), now)) {
    LOG(WARNING) << "coordinator: " << msg;
  }
  // The job is out of step: the response cache's flush goes to every rank before any error
  // (Note [Resynchronization] in negotiation.h).
  proto::ResponseList flush;
  flush.set_sequence(sequence_ + 1);
  for (int32_t id : table_->TakeEvictions(flush.sequence())) flush.add_evicted_cache_ids(id);
  if (flush.evicted_cache_ids_size() > 0) {
    ++sequence_;
    Broadcast(std::move(flush));
  }
  SendReplies();
}

void Job::InspectLiveness(absl::Time now) {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (r.state == RankState::kNegotiating && now - r.last_seen >= heartbeat_timeout()) {
      const absl::Duration silent = absl::Trunc(now - r.last_seen, absl::Milliseconds(10));
      Lose(static_cast<int>(i),
           absl::StrCat("rank ", i, " (pid ", r.pid, " on ", r.host, ") was lost: silent for ",
                        absl::FormatDuration(silent), " (BRAID_HEARTBEAT_TIMEOUT_S)"));
    } else if (r.state == RankState::kRegistered && now - formed_at_ >= heartbeat_timeout()) {
      Lose(static_cast<int>(i),
           absl::StrCat("rank ", i, " (pid ", r.pid, " on ", r.host,
                        ") was lost: it registered but did not open its negotiation stream within ",
                        absl::FormatDuration(heartbeat_timeout()), " (BRAID_HEARTBEAT_TIMEOUT_S)"));
    }
  }
}

// Note [Stall inspector]: a tensor that some ranks submitted and others did not for the stall
// check is logged once, naming the ranks on each side (the usual cause: ranks took different
// code paths). With a positive stall shutdown the job is aborted after that long, so every
// rank's pending and later operations fail with DeadlineExceeded instead of hanging.
void Job::InspectStalls(absl::Time now) {
  if (!abort_.ok()) return;
  const absl::Duration check = absl::Milliseconds(settings_.stall_check_ms());
  const absl::Duration shutdown = absl::Milliseconds(settings_.stall_shutdown_ms());
  // A stall shutdown shorter than the check aborts at its own time, not at the check's.
  const absl::Duration first =
      shutdown > absl::ZeroDuration() ? std::min(check, shutdown) : check;
  for (const auto& p : table_->PendingTensors(now, first)) {
    std::string what = absl::StrCat(
        "tensor '", p.name, "' was submitted by rank", p.ready_ranks.size() > 1 ? "s " : " ",
        absl::StrJoin(p.ready_ranks, ", "), " but not by rank",
        p.missing_ranks.size() > 1 ? "s " : " ", absl::StrJoin(p.missing_ranks, ", "), " for ",
        absl::FormatDuration(absl::Trunc(p.waiting, absl::Seconds(1))));
    if (p.waiting >= check && stall_logged_.insert(p.name).second) {
      LOG(WARNING) << "coordinator: stall: " << what;
    }
    if (shutdown > absl::ZeroDuration() && p.waiting >= shutdown) {
      Abort(absl::DeadlineExceededError(absl::StrCat(
          "stalled: ", what, " (BRAID_STALL_SHUTDOWN_S=", absl::ToDoubleSeconds(shutdown), ")")));
      return;
    }
  }
}

void Job::MaybeEnd(absl::Time now) {
  if (phase_ != proto::JOB_RUNNING) return;
  for (const Rank& r : ranks_) {
    if (r.state != RankState::kShutDown && r.state != RankState::kLost) return;
  }
  phase_ = proto::JOB_ENDED;
  VLOG(1) << "coordinator: job " << id() << " ended"
          << (abort_.ok() ? std::string() : absl::StrCat(", aborted: ", abort_.message()));
}

}  // namespace braid::coordinator
