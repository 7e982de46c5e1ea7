// The background loop (braid-loop, Note [Threads and locks]): sends requests to the
// coordinator, receives the buckets it agreed, runs them in order, and turns aborts into
// errors on every pending handle.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "runtime/runtime_impl.h"

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

void Runtime::Impl::Loop() {
  while (true) {
    if (fast_path_) {
      if (!FastCycle()) return;
      continue;
    }
    proto::RequestList out;
    std::deque<Bucket> todo;
    if (!NextCycle(&out, &todo)) return;
    if (out.requests_size() > 0 || out.cached_ids_size() > 0 || out.failures_size() > 0) {
      absl::Status s = client_->Send(out);
      if (!s.ok()) AbortJob(s);
    }
    for (const Bucket& b : todo) Execute(b);
    absl::MutexLock lock(&mu_);
    executing_ = false;
  }
}

bool Runtime::Impl::NextCycle(proto::RequestList* out, std::deque<Bucket>* todo) {
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
    const absl::Time due = last_send_ + config_.cycle_time;
    if (absl::Now() >= due) break;
    mu_.AwaitWithDeadline(absl::Condition(&urgent), due);
  }
  if (stop_) return false;
  if (!abort_.ok()) {
    FailEverythingLocked(abort_);
    return true;
  }
  out->set_rank(rank_);
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

// Note [Barrier order]
// A barrier is where the ranks resynchronize after an error (Note [Resynchronization] in
// coordinator/negotiation.h): a collective this rank enqueued before a barrier must be
// negotiated before it, and one enqueued after it only once it completed, or a rank that
// skipped a call before the barrier could pair its call after the barrier with another
// rank's call before it. So:
// - a barrier ends the list it travels in (the coordinator takes a list's failure reports,
//   then its requests, in order), and what this rank enqueued or reported after it waits
//   until the barrier's answer arrived (BarrierInFlightLocked);
// - under the fast path a barrier also waits until every tensor enqueued before it has been
//   agreed by the ranks' vote or handed to the coordinator, so no tensor held for a vote
//   outlives the barrier.
// Barriers are blocking in the Python and C APIs, so in practice nothing waits behind one;
// the order matters for C++ callers that enqueue a barrier and go on.
constexpr uint64_t kNoBarrier = ~uint64_t{0};

uint64_t Runtime::Impl::SeqOfLocked(const proto::Request& r) const {
  auto it = table_.find(r.name());
  return it == table_.end() ? 0 : it->second.seq;  // gone: failed meanwhile, sent for nothing
}

bool Runtime::Impl::BarrierInFlightLocked() const {
  if (barrier_sent_.first.empty()) return false;
  auto it = table_.find(barrier_sent_.first);
  return it != table_.end() && it->second.seq == barrier_sent_.second;
}

uint64_t Runtime::Impl::FirstBarrierLocked() const {
  if (barriers_outgoing_ == 0) return kNoBarrier;
  uint64_t first = kNoBarrier;
  for (const proto::Request& r : outgoing_) {
    if (r.collective() == proto::BARRIER) first = std::min(first, SeqOfLocked(r));
  }
  return first;
}

bool Runtime::Impl::FastHeldBeforeLocked(uint64_t seq) const {
  for (const auto& [name, e] : table_) {
    if (e.fast && e.seq < seq) return true;
  }
  return false;
}

Runtime::Impl::Sendable Runtime::Impl::SendableLocked(bool fast) const {
  Sendable s;
  if (BarrierInFlightLocked()) return s;
  const uint64_t cut = FirstBarrierLocked();
  for (const PendingFailure& f : failures_) s.failures = s.failures || f.seq < cut;
  if (group_depth_ > 0 || outgoing_.empty()) return s;
  // Something before the barrier, or the barrier itself when it may go.
  s.requests = cut == kNoBarrier || SeqOfLocked(outgoing_.front()) < cut ||
               !fast || !FastHeldBeforeLocked(cut);
  return s;
}

void Runtime::Impl::TakeSendableLocked(bool fast, std::vector<proto::FailureReport>* failures,
                                       std::vector<proto::Request>* requests) {
  if (BarrierInFlightLocked()) return;
  const uint64_t cut = FirstBarrierLocked();
  auto after = std::stable_partition(failures_.begin(), failures_.end(),
                                     [cut](const PendingFailure& f) { return f.seq < cut; });
  for (auto it = failures_.begin(); it != after; ++it) failures->push_back(std::move(it->report));
  failures_.erase(failures_.begin(), after);
  if (group_depth_ > 0) return;
  // Under the fast path, requests before the barrier taken now may be held for the vote
  // (routed after this): the barrier goes in a later round, once none is held.
  bool barrier_may_go = cut != kNoBarrier && (!fast || !FastHeldBeforeLocked(cut));
  for (const proto::Request& r : outgoing_) {
    if (fast && barrier_may_go && SeqOfLocked(r) < cut) barrier_may_go = false;
  }
  std::vector<proto::Request> held;
  barriers_outgoing_ = 0;
  for (proto::Request& r : outgoing_) {
    const uint64_t seq = SeqOfLocked(r);
    if (seq < cut || (seq == cut && barrier_may_go)) {
      if (seq == cut) barrier_sent_ = {r.name(), seq};
      requests->push_back(std::move(r));
    } else {
      barriers_outgoing_ += r.collective() == proto::BARRIER ? 1 : 0;
      held.push_back(std::move(r));
    }
  }
  outgoing_.swap(held);
}

void Runtime::Impl::FailEverythingLocked(const absl::Status& s) {
  for (auto& [name, e] : table_) e.handle->Complete(s);
  table_.clear();
  outgoing_.clear();
  barriers_outgoing_ = 0;
  failures_.clear();
  held_replies_.clear();
  ready_.clear();
  negotiating_ = 0;
}

void Runtime::Impl::OnMessage(const proto::ResponseList& msg) {
  if (!msg.abort_message().empty()) {
    AbortJob(absl::Status(static_cast<absl::StatusCode>(msg.abort_code()), msg.abort_message()));
  }
  if (msg.shutdown()) {
    AbortJob(absl::CancelledError("the coordinator ended the job"));
  }
  if (std::shared_ptr<Timeline> timeline = this->timeline()) MarkNegotiated(msg, *timeline);
  {
    absl::MutexLock lock(&mu_);
    if (fast_active_ && IsReplyToThisRank(msg)) {
      // Errors for this rank alone (Note [Failure reports]): they run no collective and the
      // other ranks never receive them, so they are not counted in the vote's messages; the
      // loop fails their handles at its first round after the common lists received before
      // them are applied (held_replies_).
      for (const proto::Response& r : msg.responses()) {
        held_replies_.emplace_back(received_count_, BucketFromResponse(r));
      }
      return;
    }
    if (fast_active_) {
      // Applied (run, and its cache changes made) at a round every rank agrees on.
      received_.push_back(msg);
      ++received_count_;
      if (!peer_left_.ok() || msg.ranks_left_size() == 0) return;
      peer_left_ = absl::FailedPreconditionError(
          absl::StrCat("rank ", msg.ranks_left(0), " already shut down"));
      // No vote can complete without it: wake the loop from the one it waits in (it then
      // goes back to the coordinator for everything, FastCycle). Under mu_, so that the
      // vote cannot end and a collective the rank did finish its part of begin meanwhile.
      if (voting_) comm_->Abort(peer_left_);
      return;
    }
  }
  std::vector<Bucket> buckets;
  buckets.reserve(msg.responses_size());
  for (const auto& r : msg.responses()) buckets.push_back(BucketFromResponse(r));
  absl::MutexLock lock(&mu_);
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

void Runtime::Impl::MarkNegotiated(const proto::ResponseList& msg, Timeline& timeline) {
  const absl::Time now = absl::Now();
  for (const auto& r : msg.responses()) {
    for (int i = 0; i < r.names_size(); ++i) {
      const std::string& name = r.names(i);
      for (int p = 0; p < size_; ++p) {
        size_t k = static_cast<size_t>(i) * size_ + p;
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

void Runtime::Impl::OnClosed(const absl::Status& s) {
  if (!s.ok()) AbortJob(s);
}

void Runtime::Impl::AbortJob(const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    if (!abort_.ok()) return;
    abort_ = s;
  }
  // Thread-safe: fails the collective in flight at once instead of at its timeout.
  comm_->Abort(s);
}

}  // namespace braid
