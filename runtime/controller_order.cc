// The order a barrier imposes on what this rank sends (Note [Barrier order]).
#include <algorithm>

#include "runtime/controller.h"

namespace braid {

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

uint64_t NegotiationController::SeqOfLocked(const proto::Request& r) const {
  auto it = table_.find(r.name());
  return it == table_.end() ? 0 : it->second.seq;  // gone: failed meanwhile, sent for nothing
}

bool NegotiationController::BarrierInFlightLocked() const {
  if (barrier_sent_.first.empty()) return false;
  auto it = table_.find(barrier_sent_.first);
  return it != table_.end() && it->second.seq == barrier_sent_.second;
}

uint64_t NegotiationController::FirstBarrierLocked() const {
  if (barriers_outgoing_ == 0) return kNoBarrier;
  uint64_t first = kNoBarrier;
  for (const proto::Request& r : outgoing_) {
    if (r.collective() == proto::BARRIER) first = std::min(first, SeqOfLocked(r));
  }
  return first;
}

bool NegotiationController::FastHeldBeforeLocked(uint64_t seq) const {
  for (const auto& [name, e] : table_) {
    if (e.fast && e.seq < seq) return true;
  }
  return false;
}

NegotiationController::Sendable NegotiationController::SendableLocked(bool fast) const {
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

void NegotiationController::TakeSendableLocked(bool fast, std::vector<proto::FailureReport>* failures,
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

}  // namespace braid
