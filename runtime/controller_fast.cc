// The negotiation controller under BRAID_FAST_PATH=1: one round of the ranks' vote per
// cycle (Note [Fast path], fast_path.h). Hand-offs of a cached collective: the caller's
// Enqueue puts its entry in table_ (under mu_) -> braid-loop votes over the control channel
// and hands the bucket every rank agreed on to the executor, which runs it and completes the
// Handle. No coordinator, no braid-coord-rx: one hand-off before the first byte on the wire
// instead of three (and a gRPC round trip).
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "runtime/controller.h"

namespace braid {
namespace {

// The longest an idle rank waits between votes.
constexpr absl::Duration kMaxIdlePeriod = absl::Milliseconds(100);
// How long a failed vote waits for the coordinator to say a peer left.
constexpr absl::Duration kLeaveNoticeWait = absl::Seconds(5);

}  // namespace

bool NegotiationController::FastCycle(std::deque<Bucket>* buckets) {
  proto::RequestList out;
  out.set_rank(parts_.rank);
  Vote vote;
  // Errors for this rank alone (OnMessage) go first: they run no collective.
  if (std::optional<bool> done = BeginFastRound(&out, &vote, buckets)) return *done;
  if (out.requests_size() > 0 || out.failures_size() > 0) Send(out);
  std::vector<uint64_t> gathered;
  absl::Status s = GatherVotes(vote, &gathered);
  {
    absl::MutexLock lock(&mu_);
    voting_ = false;
  }
  proto::RequestList resend;
  resend.set_rank(parts_.rank);
  progressed_ = FinishFastRound(s, gathered, &resend, buckets);
  voted_ = true;
  if (resend.requests_size() > 0) {
    {
      absl::MutexLock lock(&mu_);
      resend.set_applied_sequence(applied_sequence_);
    }
    Send(resend);
  }
  return true;
}

absl::Status NegotiationController::GatherVotes(const Vote& vote,
                                                std::vector<uint64_t>* gathered) {
  const std::vector<uint64_t> mine = EncodeVote(vote);
  gathered->resize(mine.size() * parts_.size);
  std::vector<size_t> bytes(parts_.size, mine.size() * sizeof(uint64_t));
  return parts_.control->AllGather(mine.data(), bytes[0], gathered->data(), bytes);
}

std::optional<bool> NegotiationController::BeginFastRound(proto::RequestList* out, Vote* vote,
                                                  std::deque<Bucket>* replies) {
  absl::MutexLock lock(&mu_);
  auto event = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stop_ || !abort_.ok() || !peer_left_.ok() || received_count_ > applied_ ||
           !ready_.empty() || (!held_replies_.empty() && held_replies_.front().first <= applied_) ||
           SendableLocked(/*fast=*/true).any();
  };
  // A round right away when the last one ran something and tensors still wait (a step's
  // next bucket); else on a new request or coordinator message, or after a cycle. A rank
  // with nothing to send votes too (a rank holding a tensor another never sends must reach
  // its fallback), but backs off to kMaxIdlePeriod so an idle job costs almost no CPU.
  if (!round_progressed_ || table_.empty()) {
    absl::Duration wait = std::max(parts_.cycle_time, absl::Milliseconds(1));
    if (table_.empty()) {
      wait = std::min(wait * (int64_t{1} << std::min(idle_rounds_, 10)), kMaxIdlePeriod);
    }
    mu_.AwaitWithDeadline(absl::Condition(&event), last_round_ + wait);
  }
  if (stop_) return false;
  if (!peer_left_.ok() && abort_.ok()) {
    StopFastPathLocked();
    return true;
  }
  if (!abort_.ok()) {
    // No more rounds: the communicator is poisoned. Fail what is and what comes.
    auto any = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || !table_.empty() || !outgoing_.empty();
    };
    mu_.Await(absl::Condition(&any));
    if (stop_) return false;
    FailEverythingLocked(abort_);
    received_.clear();
    return true;
  }
  RouteAndVoteLocked(absl::Now(), out, vote);
  ReleaseRepliesLocked(/*all=*/false);
  replies->swap(ready_);
  executing_ = true;
  voting_ = true;
  return std::nullopt;
}

bool NegotiationController::FinishFastRound(const absl::Status& gathered_status,
                                            const std::vector<uint64_t>& gathered,
                                            proto::RequestList* resend,
                                            std::deque<Bucket>* buckets) {
  absl::Status vote_status = gathered_status;
  if (vote_status.code() == absl::StatusCode::kDeadlineExceeded) {
    // The data plane timed out in a bucket (whose error names its tensors) or in this vote.
    vote_status = parts_.first_timeout(absl::DeadlineExceededError(absl::StrCat(
        "the fast path's vote timed out on the data plane: ", vote_status.message())));
  }
  absl::StatusOr<Agreement> agreed =
      vote_status.ok() ? Agree(gathered, parts_.size, fast_cache_, applied_,
                               parts_.process_set_ranks)
                       : absl::StatusOr<Agreement>(vote_status);
  if (agreed.ok()) {
    ApplyAgreement(*agreed, resend, buckets);
    return !agreed->ready.empty() || !agreed->invalidate.empty() || agreed->received > applied_;
  }
  bool left;
  {
    // A vote also fails when a peer closed its endpoints. If it shut down cleanly, the
    // coordinator's notice (ranks_left) is on its way: wait for it (briefly), so the work
    // that peer never sends fails as on the slow path, not with the transport's error.
    absl::MutexLock lock(&mu_);
    auto told = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || !peer_left_.ok() || !abort_.ok();
    };
    mu_.AwaitWithDeadline(absl::Condition(&told), absl::Now() + kLeaveNoticeWait);
    left = !peer_left_.ok();
  }
  if (!left) Abort(agreed.status());  // else the next cycle stops the fast path
  return false;
}

void NegotiationController::ReleaseRepliesLocked(bool all) {
  while (!held_replies_.empty() && (all || held_replies_.front().first <= applied_)) {
    ready_.push_back(std::move(held_replies_.front().second));
    held_replies_.pop_front();
  }
}

void NegotiationController::StopFastPathLocked() {
  parts_.fast_path = false;
  fast_active_ = false;
  for (const proto::ResponseList& msg : received_) {
    if (msg.has_settings_change()) ready_.push_back(SettingsBucket(msg));
    for (const proto::Response& r : msg.responses()) ready_.push_back(BucketFromResponse(r));
    // From here cache_ (empty: the fast path never fills it) is the only cache: no id from
    // before can be sent any more.
    applied_sequence_ = std::max(applied_sequence_, msg.sequence());
  }
  received_.clear();
  ReleaseRepliesLocked(/*all=*/true);
  for (auto& [name, e] : table_) {
    if (!e.fast) continue;
    e.fast = false;
    proto::Request r;
    r.ParseFromString(e.request_bytes);
    outgoing_.push_back(std::move(r));
  }
  negotiating_ = 0;
  executing_ = false;
  // Routine at the end of every job (a peer shut down first): not worth a line on stderr.
  VLOG(1) << "braid: rank " << parts_.rank << ": " << peer_left_.message()
            << "; what is left goes to the coordinator";
}

void NegotiationController::RouteAndVoteLocked(absl::Time now, proto::RequestList* out,
                                               Vote* vote) {
  // Local failures go out at once (Note [Local failures]). A failed tensor's slot leaves
  // every rank's cache at this round: the ranks holding it send it to the coordinator, which
  // answers them with the failure, instead of waiting for the fallback.
  out->set_applied_sequence(applied_sequence_);
  // An open group (BeginGroup) holds its requests until it closes, as on the slow path; a
  // barrier and what follows it wait as Note [Barrier order] says.
  std::vector<proto::FailureReport> failures;
  std::vector<proto::Request> routing;
  TakeSendableLocked(/*fast=*/true, &failures, &routing);
  for (proto::FailureReport& f : failures) {
    if (int32_t id = fast_cache_.IdOf(f.name()); id != 0) invalidate_next_.push_back(id);
    *out->add_failures() = std::move(f);
  }
  for (proto::Request& r : routing) {
    auto entry = table_.find(r.name());
    if (entry == table_.end()) continue;
    if (fast_cache_.Lookup(r.name(), entry->second.request_bytes) != 0) {
      entry->second.fast = true;
      entry->second.fast_since = now;
      continue;
    }
    // First time, or changed under a cached name: the coordinator's. A changed one also
    // takes its stale slot out of every rank's cache, so no rank waits on it.
    if (int32_t id = fast_cache_.IdOf(r.name()); id != 0) invalidate_next_.push_back(id);
    *out->add_requests() = std::move(r);
  }
  FillVoteLocked(now, vote);
}

void NegotiationController::FillVoteLocked(absl::Time now, Vote* vote) {
  const size_t words = VoteWords(fast_cache_.size());
  vote->applied = applied_;
  vote->received = received_count_;
  vote->cache_size = fast_cache_.size();
  vote->digest = fast_cache_.digest();
  vote->ready.assign(words, 0);
  vote->invalidate.assign(words, 0);
  for (const auto& [name, e] : table_) {
    vote->joined = vote->joined || e.req.collective == Collective::kJoin;
    if (!e.fast) continue;
    const int position = fast_cache_.Position(fast_cache_.IdOf(name));
    if (position < 0) continue;  // cannot happen: a slot that goes takes its tensors along
    // Waited too long for another rank: let the coordinator's stall inspector see it.
    if (now - e.fast_since > parts_.fallback_after) {
      SetBit(&vote->invalidate, position);
    } else {
      SetBit(&vote->ready, position);
    }
  }
  for (int32_t id : invalidate_next_) {
    if (int position = fast_cache_.Position(id); position >= 0) {
      SetBit(&vote->invalidate, position);
    }
  }
  invalidate_next_.clear();
}

void NegotiationController::ApplyAgreement(const Agreement& a, proto::RequestList* resend,
                                           std::deque<Bucket>* buckets) {
  for (const std::vector<int32_t>& ids :
       PlanFastBuckets(a.ready, fast_cache_, parts_.fusion_threshold)) {
    buckets->push_back(FastBucket(ids));
  }
  for (int32_t id : a.invalidate) LeaveFastPath(fast_cache_.Evict(id), resend);
  if (a.joined) {
    // A rank has joined: what this rank holds goes to the coordinator, which lets the joined
    // rank take part (Note [Fast path]); the slots stay cached.
    std::vector<std::string> held;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [name, e] : table_) {
        if (e.fast) held.push_back(name);
      }
    }
    for (const std::string& name : held) LeaveFastPath(name, resend);
  }
  std::deque<proto::ResponseList> msgs;
  {
    absl::MutexLock lock(&mu_);
    while (applied_ < a.received && !received_.empty()) {
      msgs.push_back(std::move(received_.front()));
      received_.pop_front();
      ++applied_;
    }
  }
  for (const proto::ResponseList& msg : msgs) ApplyCoordinatorMessage(msg, resend, buckets);
}

Bucket NegotiationController::FastBucket(const std::vector<int32_t>& ids) {
  Bucket b;
  b.id = next_fast_bucket_id_--;
  const proto::Request& first = fast_cache_.Find(ids[0])->request;
  b.collective = static_cast<Collective>(first.collective());
  b.root_rank = first.root_rank();
  b.process_set_id = first.process_set_id();  // only its members run it
  b.device_type = static_cast<DeviceType>(first.device());  // every rank's, as agreed
  for (int32_t id : ids) b.names.push_back(fast_cache_.Find(id)->name);
  {
    // Handed to the executor: no longer held for a vote, so a slot evicted before the
    // executor runs it (later in this round) does not send it to the coordinator too.
    absl::MutexLock lock(&mu_);
    for (const std::string& name : b.names) {
      if (auto it = table_.find(name); it != table_.end()) it->second.fast = false;
    }
  }
  if (std::shared_ptr<Timeline> timeline = parts_.timeline ? parts_.timeline() : nullptr) {
    const absl::Time now = absl::Now();
    for (const std::string& name : b.names) {
      // The vote says only that every rank was ready by this round.
      for (int p = 0; p < parts_.size; ++p) {
        timeline->Mark(name, absl::StrCat("rank ", p, " ready"), now);
      }
      timeline->End(name, "NEGOTIATE", now);
      timeline->Begin(name, "QUEUE", "", now);
    }
  }
  CountFastBucket(ids);
  return b;
}

void NegotiationController::ApplyCoordinatorMessage(const proto::ResponseList& msg,
                                                    proto::RequestList* resend,
                                                    std::deque<Bucket>* buckets) {
  // Note [Settings changes]: in its place among the buckets, at the round every rank applies
  // the list in.
  if (msg.has_settings_change()) buckets->push_back(SettingsBucket(msg));
  for (const proto::Response& r : msg.responses()) {
    {
      absl::MutexLock lock(&mu_);
      for (int i = 0; i < r.cache_ids_size() && i < r.names_size(); ++i) {
        auto entry = table_.find(r.names(i));
        if (r.cache_ids(i) != 0 && entry != table_.end()) {
          fast_cache_.Insert(r.cache_ids(i), r.names(i), entry->second.request_bytes, r);
        } else if (r.cache_ids(i) != 0 && r.process_set_id() != 0) {
          fast_cache_.InsertOutside(r.cache_ids(i), r, i);  // another set's
        }
      }
    }
    buckets->push_back(BucketFromResponse(r));
  }
  for (int32_t id : msg.evicted_cache_ids()) LeaveFastPath(fast_cache_.Evict(id), resend);
  absl::MutexLock lock(&mu_);
  applied_sequence_ = std::max(applied_sequence_, msg.sequence());  // its evictions are done
}

void NegotiationController::LeaveFastPath(const std::string& name, proto::RequestList* resend) {
  if (name.empty()) return;
  absl::MutexLock lock(&mu_);
  auto it = table_.find(name);
  if (it == table_.end() || !it->second.fast) return;
  it->second.fast = false;
  resend->add_requests()->ParseFromString(it->second.request_bytes);
}

void NegotiationController::CountFastBucket(const std::vector<int32_t>& ids) {
  absl::MutexLock lock(&fast_stats_mu_);
  ++fast_buckets_;
  for (int32_t id : ids) {
    const proto::Request& r = fast_cache_.Find(id)->request;
    // Per method: all-reduces only, as the coordinator counts them; the other collectives
    // under "" (in the job's totals, in no method's row).
    const std::string method = r.collective() != proto::ALLREDUCE ? ""
                               : r.compression().empty()          ? "none"
                                                                  : r.compression();
    if (r.process_set_id() != 0) ++fast_by_set_[r.process_set_id()];
    const int64_t request_bytes = RequestBytes(r);
    auto& [tensors, bytes] = fast_by_method_[method];
    ++tensors;
    bytes += request_bytes;
    if (method.empty()) continue;
    auto& [group_tensors, group_bytes] = fast_by_group_.At(method, r.compression_pattern()).second;
    ++group_tensors;
    group_bytes += request_bytes;
  }
}

void NegotiationController::AddFastPathTotals(proto::HeartbeatRequest* hb) const {
  absl::MutexLock lock(&fast_stats_mu_);
  for (const auto& [method, counts] : fast_by_method_) {
    proto::MethodNegotiated* m = hb->add_fast_path();
    m->set_method(method);
    m->set_tensors(counts.first);
    m->set_bytes(counts.second);
  }
  fast_by_group_.ForEach([hb](const std::string& method, const std::string& pattern,
                              const std::pair<int64_t, int64_t>& counts) {
    proto::MethodNegotiated* m = hb->add_fast_path_groups();
    m->set_method(method);
    m->set_pattern(pattern);
    m->set_tensors(counts.first);
    m->set_bytes(counts.second);
  });
  hb->set_fast_path_buckets(fast_buckets_);
  for (const auto& [set, tensors] : fast_by_set_) (*hb->mutable_fast_path_sets())[set] = tensors;
}

}  // namespace braid
