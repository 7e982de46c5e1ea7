// braid-loop under BRAID_FAST_PATH=1: one round of the ranks' vote per cycle (Note [Fast
// path], fast_path.h). Hand-offs of a cached collective: the caller's Enqueue puts its
// Entry in table_ (under mu_) -> braid-loop votes, and runs the bucket every rank agreed on,
// and completes the Handle. No coordinator, no braid-coord-rx: one hand-off before the
// first byte on the wire instead of three (and a gRPC round trip).
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "runtime/runtime_impl.h"

namespace braid {
namespace {

// The longest an idle rank waits between votes.
constexpr absl::Duration kMaxIdlePeriod = absl::Milliseconds(100);
// How long a failed vote waits for the coordinator to say a peer left.
constexpr absl::Duration kLeaveNoticeWait = absl::Seconds(5);

}  // namespace

bool Runtime::Impl::FastCycle() {
  proto::RequestList out;
  out.set_rank(rank_);
  Vote vote;
  std::deque<Bucket> replies;  // errors for this rank alone (OnMessage)
  if (std::optional<bool> done = BeginFastRound(&out, &vote, &replies)) return *done;
  if (out.requests_size() > 0 || out.failures_size() > 0) {
    absl::Status s = client_->Send(out);
    if (!s.ok()) AbortJob(s);
  }
  for (const Bucket& b : replies) Execute(b);
  const std::vector<uint64_t> mine = EncodeVote(vote);
  std::vector<uint64_t> gathered(mine.size() * size_);
  std::vector<size_t> bytes(size_, mine.size() * sizeof(uint64_t));
  absl::Status s = comm_->AllGather(mine.data(), bytes[0], gathered.data(), bytes);
  {
    absl::MutexLock lock(&mu_);
    voting_ = false;
  }
  proto::RequestList resend;
  resend.set_rank(rank_);
  const bool progressed = FinishFastRound(s, gathered, &resend);
  if (resend.requests_size() > 0) {
    {
      absl::MutexLock lock(&mu_);
      resend.set_applied_sequence(applied_sequence_);
    }
    absl::Status sent = client_->Send(resend);
    if (!sent.ok()) AbortJob(sent);
  }
  absl::MutexLock lock(&mu_);
  executing_ = false;
  last_round_ = absl::Now();
  round_progressed_ = progressed;
  idle_rounds_ = table_.empty() && !progressed ? idle_rounds_ + 1 : 0;
  return true;
}

std::optional<bool> Runtime::Impl::BeginFastRound(proto::RequestList* out, Vote* vote,
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
    absl::Duration wait = std::max(config_.cycle_time, absl::Milliseconds(1));
    if (table_.empty()) wait = std::min(wait * (int64_t{1} << std::min(idle_rounds_, 10)), kMaxIdlePeriod);
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

bool Runtime::Impl::FinishFastRound(const absl::Status& gathered_status,
                                    const std::vector<uint64_t>& gathered,
                                    proto::RequestList* resend) {
  absl::Status vote_status = gathered_status;
  if (vote_status.code() == absl::StatusCode::kDeadlineExceeded) {
    // The data plane timed out in a bucket (whose error names its tensors) or in this vote.
    if (data_plane_timeout_.ok()) {
      data_plane_timeout_ = absl::DeadlineExceededError(absl::StrCat(
          "the fast path's vote timed out on the data plane: ", vote_status.message()));
    }
    vote_status = data_plane_timeout_;
  }
  absl::StatusOr<Agreement> agreed =
      vote_status.ok() ? Agree(gathered, size_, fast_cache_, applied_)
                       : absl::StatusOr<Agreement>(vote_status);
  if (agreed.ok()) {
    ApplyAgreement(*agreed, resend);
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
  if (!left) AbortJob(agreed.status());  // else the next cycle stops the fast path
  return false;
}

void Runtime::Impl::ReleaseRepliesLocked(bool all) {
  while (!held_replies_.empty() && (all || held_replies_.front().first <= applied_)) {
    ready_.push_back(std::move(held_replies_.front().second));
    held_replies_.pop_front();
  }
}

void Runtime::Impl::StopFastPathLocked() {
  fast_path_ = false;
  fast_active_ = false;
  for (const proto::ResponseList& msg : received_) {
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
  VLOG(1) << "braid: rank " << rank_ << ": " << peer_left_.message()
            << "; what is left goes to the coordinator";
}

void Runtime::Impl::RouteAndVoteLocked(absl::Time now, proto::RequestList* out, Vote* vote) {
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
    if (now - e.fast_since > fallback_after_) {
      SetBit(&vote->invalidate, position);
    } else {
      SetBit(&vote->ready, position);
    }
  }
  for (int32_t id : invalidate_next_) {
    if (int position = fast_cache_.Position(id); position >= 0) SetBit(&vote->invalidate, position);
  }
  invalidate_next_.clear();
}

void Runtime::Impl::ApplyAgreement(const Agreement& a, proto::RequestList* resend) {
  for (const std::vector<int32_t>& ids : PlanFastBuckets(a.ready, fast_cache_, fusion_threshold_)) {
    Bucket b;
    b.id = next_fast_bucket_id_--;
    const proto::Request& first = fast_cache_.Find(ids[0])->request;
    b.collective = static_cast<Collective>(first.collective());
    b.root_rank = first.root_rank();
    for (int32_t id : ids) b.names.push_back(fast_cache_.Find(id)->name);
    if (std::shared_ptr<Timeline> timeline = this->timeline()) {
      const absl::Time now = absl::Now();
      for (const std::string& name : b.names) {
        // The vote says only that every rank was ready by this round.
        for (int p = 0; p < size_; ++p) timeline->Mark(name, absl::StrCat("rank ", p, " ready"), now);
        timeline->End(name, "NEGOTIATE", now);
        timeline->Begin(name, "QUEUE", "", now);
      }
    }
    CountFastBucket(ids);
    Execute(b);
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
  for (const proto::ResponseList& msg : msgs) ApplyCoordinatorMessage(msg, resend);
}

void Runtime::Impl::ApplyCoordinatorMessage(const proto::ResponseList& msg,
                                            proto::RequestList* resend) {
  for (const proto::Response& r : msg.responses()) {
    {
      absl::MutexLock lock(&mu_);
      for (int i = 0; i < r.cache_ids_size() && i < r.names_size(); ++i) {
        auto entry = table_.find(r.names(i));
        if (r.cache_ids(i) != 0 && entry != table_.end()) {
          fast_cache_.Insert(r.cache_ids(i), r.names(i), entry->second.request_bytes);
        }
      }
    }
    Execute(BucketFromResponse(r));
  }
  for (int32_t id : msg.evicted_cache_ids()) LeaveFastPath(fast_cache_.Evict(id), resend);
  absl::MutexLock lock(&mu_);
  applied_sequence_ = std::max(applied_sequence_, msg.sequence());  // its evictions are done
}

void Runtime::Impl::LeaveFastPath(const std::string& name, proto::RequestList* resend) {
  if (name.empty()) return;
  absl::MutexLock lock(&mu_);
  auto it = table_.find(name);
  if (it == table_.end() || !it->second.fast) return;
  it->second.fast = false;
  resend->add_requests()->ParseFromString(it->second.request_bytes);
}

void Runtime::Impl::CountFastBucket(const std::vector<int32_t>& ids) {
  absl::MutexLock lock(&fast_stats_mu_);
  ++fast_buckets_;
  for (int32_t id : ids) {
    const proto::Request& r = fast_cache_.Find(id)->request;
    // Per method: all-reduces only, as the coordinator counts them; the other collectives
    // under "" (in the job's totals, in no method's row).
    const std::string method = r.collective() != proto::ALLREDUCE ? ""
                               : r.compression().empty()          ? "none"
                                                                  : r.compression();
    auto& [tensors, bytes] = fast_by_method_[method];
    ++tensors;
    bytes += RequestBytes(r);
  }
}

void Runtime::Impl::AddFastPathTotals(proto::HeartbeatRequest* hb) const {
  absl::MutexLock lock(&fast_stats_mu_);
  for (const auto& [method, counts] : fast_by_method_) {
    proto::MethodNegotiated* m = hb->add_fast_path();
    m->set_method(method);
    m->set_tensors(counts.first);
    m->set_bytes(counts.second);
  }
  hb->set_fast_path_buckets(fast_buckets_);
}

}  // namespace braid
