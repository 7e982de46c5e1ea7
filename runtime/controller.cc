// The negotiation controller (controller.h): the collectives in flight, the coordinator's
// cycle, and aborts turned into errors on every pending handle.
#include "runtime/controller.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace braid {

namespace {

// A list the coordinator sent to this rank alone (sequence 0, Note [Failure reports] in
// coordinator/negotiation.h): errors for tensors only it still waited for.
bool IsReplyToThisRank(const proto::ResponseList& msg) {
  if (msg.sequence() != 0 || msg.responses_size() == 0 || msg.shutdown() ||
      !msg.abort_message().empty() || msg.ranks_left_size() > 0 ||
      msg.evicted_cache_ids_size() > 0) {
    return false;
  }
  for (const proto::Response& r : msg.responses()) {
    if (r.type() != proto::Response::ERROR) return false;
  }
  return true;
}

}  // namespace

bool NegotiationController::NextBuckets(std::deque<Bucket>* buckets) {
  if (parts_.fast_path) return FastCycle(buckets);
  proto::RequestList out;
  if (!NextCycle(&out, buckets)) return false;
  if (out.requests_size() > 0 || out.cached_ids_size() > 0 || out.failures_size() > 0) {
    Send(out);
  }
  return true;
}

void NegotiationController::Send(const proto::RequestList& list) {
  absl::Status s = parts_.client->Send(list);
  if (!s.ok()) Abort(s);
}

void NegotiationController::Retune(absl::Duration cycle_time, int64_t fusion_threshold) {
  absl::MutexLock lock(&mu_);
  if (cycle_time > absl::ZeroDuration()) parts_.cycle_time = cycle_time;
  parts_.fusion_threshold = fusion_threshold;
}

void NegotiationController::SendSample(const proto::TuningSample& sample) {
  proto::RequestList list;
  list.set_rank(parts_.rank);
  *list.add_samples() = sample;
  Send(list);
}

int64_t NegotiationController::AllReduceBytes(const std::string& name) {
  const TensorEntry* e = Find(name);
  if (e == nullptr || e->req.collective != Collective::kAllReduce) return 0;
  int64_t elements = 1;
  for (int64_t d : e->req.shape) elements *= d;
  return elements * static_cast<int64_t>(DataTypeSize(e->req.dtype));
}

void NegotiationController::CycleDone() {
  absl::MutexLock lock(&mu_);
  executing_ = false;
  if (!std::exchange(voted_, false)) return;
  // Note [Fast path]: when the round ran, whether it ran something, and how long the rank
  // has been idle, for the next round's wait (BeginFastRound).
  last_round_ = absl::Now();
  round_progressed_ = progressed_;
  idle_rounds_ = table_.empty() && !progressed_ ? idle_rounds_ + 1 : 0;
}

bool NegotiationController::NextCycle(proto::RequestList* out, std::deque<Bucket>* todo) {
  absl::MutexLock lock(&mu_);
  // Note [Cycle]: event-driven, so an idle job costs no CPU. Buckets run as soon as they
  // arrive. New requests go out at once when nothing is being negotiated (the first tensor
  // after an idle period pays no cycle latency); while earlier requests are still
  // negotiating, new ones are batched for up to BRAID_CYCLE_TIME_MS after the last send, so
  // a burst of tensors costs one message per rank. While a group is open (BeginGroup) new
  // requests are held, and go out together when it closes.
  // Failure reports are urgent: peers may be waiting for the tensor (Note [Local failures]).
  auto urgent = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) -> bool {
    return stop_ || !ready_.empty() || (!abort_.ok() && !table_.empty()) ||
           SendableLocked(/*fast=*/false).failures;
  };
  auto anything = [this, &urgent]() ABSL_SHARED_LOCKS_REQUIRED(mu_) -> bool {
    return urgent() || SendableLocked(/*fast=*/false).requests;
  };
  while (true) {
    mu_.Await(absl::Condition(&anything));
    if (urgent() || negotiating_ == 0) break;
    const absl::Time due = last_send_ + parts_.cycle_time;
    if (absl::Now() >= due) break;
    mu_.AwaitWithDeadline(absl::Condition(&urgent), due);
  }
  if (stop_) return false;
  if (!abort_.ok()) {
    FailEverythingLocked(abort_);
    return true;
  }
  out->set_rank(parts_.rank);
  // Read with the cache under one lock: the ids below never name an entry evicted by a list
  // up to this sequence (Note [Response cache] in coordinator/negotiation.h).
  out->set_applied_sequence(applied_sequence_);
  std::vector<proto::FailureReport> failures;
  std::vector<proto::Request> sending;
  TakeSendableLocked(/*fast=*/false, &failures, &sending);
  for (auto& f : failures) *out->add_failures() = std::move(f);
  for (auto& r : sending) {
    // A request identical to a cached one travels as its id (Note [Response cache]).
    auto it = cache_.find(r.name());
    auto entry = table_.find(r.name());
    if (it != cache_.end() && entry != table_.end() &&
        it->second.second == entry->second.request_bytes) {
      out->add_cached_ids(it->second.first);
    } else {
      *out->add_requests() = std::move(r);
    }
  }
  negotiating_ += static_cast<int64_t>(sending.size());
  if (!sending.empty()) last_send_ = absl::Now();
  todo->swap(ready_);
  executing_ = !todo->empty();
  return true;
}

void NegotiationController::FailEverythingLocked(const absl::Status& s) {
  for (auto& [name, e] : table_) e.handle->Complete(s);
  table_.clear();
  outgoing_.clear();
  barriers_outgoing_ = 0;
  failures_.clear();
  held_replies_.clear();
  ready_.clear();
  negotiating_ = 0;
}

void NegotiationController::OnMessage(const proto::ResponseList& msg) {
  if (!msg.abort_message().empty()) {
    Abort(absl::Status(static_cast<absl::StatusCode>(msg.abort_code()), msg.abort_message()));
  }
  if (msg.shutdown()) {
    Abort(absl::CancelledError("the coordinator ended the job"));
  }
  if (std::shared_ptr<Timeline> timeline = parts_.timeline ? parts_.timeline() : nullptr) {
    MarkNegotiated(msg, *timeline);
  }
  std::vector<Bucket> buckets;
  {
    absl::MutexLock lock(&mu_);
    if (HoldForVoteLocked(msg)) return;
  }
  buckets.reserve(msg.responses_size());
  for (const auto& r : msg.responses()) buckets.push_back(BucketFromResponse(r));
  absl::MutexLock lock(&mu_);
  // Note [Settings changes]: in its place among the buckets (such a list has no responses).
  if (msg.has_settings_change()) ready_.push_back(SettingsBucket(msg));
  for (int k = 0; k < msg.responses_size(); ++k) {
    const proto::Response& r = msg.responses(k);
    for (const std::string& name : r.names()) {
      // A joined rank also runs others' tensors (Note [Join]): only its own were negotiating.
      if (table_.count(name)) --negotiating_;
    }
    for (int i = 0; i < r.cache_ids_size() && i < r.names_size(); ++i) {
      auto entry = table_.find(r.names(i));
      if (r.cache_ids(i) != 0 && entry != table_.end()) {
        cache_[r.names(i)] = {r.cache_ids(i), entry->second.request_bytes};
      }
    }
    ready_.push_back(std::move(buckets[k]));
  }
  for (int32_t id : msg.evicted_cache_ids()) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->second.first == id) {
        cache_.erase(it);
        break;
      }
    }
  }
  if (negotiating_ < 0) negotiating_ = 0;
  applied_sequence_ = std::max(applied_sequence_, msg.sequence());  // 0: this rank's alone
}

bool NegotiationController::HoldForVoteLocked(const proto::ResponseList& msg) {
  if (!fast_active_) return false;
  if (IsReplyToThisRank(msg)) {
    // Errors for this rank alone (Note [Failure reports]): they run no collective and the
    // other ranks never receive them, so they are not counted in the vote's messages; the
    // loop fails their handles at its first round after the common lists received before
    // them are applied (held_replies_).
    for (const proto::Response& r : msg.responses()) {
      held_replies_.emplace_back(received_count_, BucketFromResponse(r));
    }
    return true;
  }
  // Applied (run, and its cache changes made) at a round every rank agrees on.
  received_.push_back(msg);
  ++received_count_;
  if (!peer_left_.ok() || msg.ranks_left_size() == 0) return true;
  peer_left_ = absl::FailedPreconditionError(
      absl::StrCat("rank ", msg.ranks_left(0), " already shut down"));
  // No vote can complete without it: wake the loop from the one it waits in (it then
  // goes back to the coordinator for everything, FastCycle). Under mu_, so that the
  // vote cannot end and a collective the rank did finish its part of begin meanwhile.
  // The control channel alone: process sets without that rank go on over the same layer
  // (Note [Process sets] in control/process_sets.h).
  if (voting_) parts_.control->Interrupt(peer_left_);
  return true;
}

void NegotiationController::MarkNegotiated(const proto::ResponseList& msg, Timeline& timeline) {
  const absl::Time now = absl::Now();
  for (const auto& r : msg.responses()) {
    for (int i = 0; i < r.names_size(); ++i) {
      const std::string& name = r.names(i);
      for (int p = 0; p < parts_.size; ++p) {
        size_t k = static_cast<size_t>(i) * parts_.size + p;
        if (k < static_cast<size_t>(r.report_age_us_size())) {
          timeline.Mark(name, absl::StrCat("rank ", p, " ready"),
                          now - absl::Microseconds(r.report_age_us(static_cast<int>(k))));
        }
      }
      timeline.End(name, "NEGOTIATE", now);
      if (r.type() == proto::Response::OK) timeline.Begin(name, "QUEUE", "", now);
    }
  }
}

void NegotiationController::OnClosed(const absl::Status& s) {
  if (!s.ok()) Abort(s);
}

void NegotiationController::Abort(const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    if (!abort_.ok()) return;
    abort_ = s;
  }
  // Thread-safe: fails the collective in flight at once instead of at its timeout.
  if (parts_.abort_data_plane) parts_.abort_data_plane(s);
}

// ---- InFlight ----

TensorEntry* NegotiationController::Find(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(name);
  return it == table_.end() ? nullptr : &it->second;  // stays put: only braid-loop erases
}

void NegotiationController::FailProcessSet(int32_t id, const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  for (auto it = table_.begin(); it != table_.end();) {
    if (it->second.req.process_set_id == id) {
      it->second.handle->Complete(s);
      table_.erase(it++);
    } else {
      ++it;
    }
  }
}

void NegotiationController::Finish(const std::vector<std::string>& names,
                                   const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  for (const std::string& name : names) {
    auto it = table_.find(name);
    if (it == table_.end()) continue;  // failed already by an abort
    it->second.handle->Complete(s);
    table_.erase(it);
  }
}

}  // namespace braid
