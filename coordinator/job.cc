#include "coordinator/job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "common/secret.h"
#include "coordinator/rendezvous.h"
#include "glog/logging.h"

namespace braid::coordinator {
namespace {

proto::ResponseList AbortMessage(const absl::Status& s) {
  proto::ResponseList rl;
  rl.set_abort_message(std::string(s.message()));
  rl.set_abort_code(static_cast<int>(s.code()));
  return rl;
}

proto::ResponseList ShutdownMessage() {
  proto::ResponseList rl;
  rl.set_shutdown(true);
  return rl;
}

}  // namespace

absl::string_view RankStateName(RankState state) {
  switch (state) {
    case RankState::kRegistered: return "registered";
    case RankState::kNegotiating: return "negotiating";
    case RankState::kShutDown: return "shut down";
    case RankState::kLost: return "lost";
  }
  return "unknown";
}

Job::Job(const Options& options, absl::Time now)
    : opts_(options), world_size_(options.world_size) {}

void Job::AddRegistration(int64_t call_id, const proto::RegisterRequest& req,
                          RegisterDone done, absl::Time now, Completions* out) {
  ++register_rpcs_;
  if (first_registration_ == absl::InfinitePast()) first_registration_ = now;
  auto refuse = [&](absl::Status s) {
    out->push_back([done = std::move(done), s = std::move(s)] { done(s); });
  };
  if (!refusal_.ok()) return refuse(refusal_);
  if (phase_ != proto::JOB_FORMING) {
    return refuse(absl::FailedPreconditionError(absl::StrCat("job ", id(), " already formed")));
  }
  if (req.size() > kMaxWorldSize) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("pid ", req.pid(), " on ", req.host(), " asks for a world of ", req.size(),
                     " ranks; braid's limit is ", kMaxWorldSize)));
  }
  if (world_size_ == 0) world_size_ = req.size();
  if (world_size_ <= 0) {
    world_size_ = opts_.world_size;
    return refuse(absl::InvalidArgumentError("world size unknown: set BRAID_SIZE"));
  }
  if (req.size() != 0 && req.size() != world_size_) return refuse(DisagreeOnWorldSize(req, out));
  pending_.push_back({call_id, req, now + opts_.register_timeout, std::move(done)});
  if (static_cast<int>(pending_.size()) == world_size_) Form(now, out);
}

namespace {

// "rank 1 (pid 7 on h)", or "pid 7 on h" without a rank of its own.
std::string Registrant(const proto::RegisterRequest& r) {
  std::string who = absl::StrCat("pid ", r.pid(), " on ", r.host());
  return r.rank() >= 0 ? absl::StrCat("rank ", r.rank(), " (", who, ")") : who;
}

}  // namespace

absl::Status Job::DisagreeOnWorldSize(const proto::RegisterRequest& req, Completions* out) {
  // The ranks disagree, so this world can never form: the newcomer and every rank waiting
  // fail now with both sizes named, rather than the waiting ranks at the register timeout.
  std::vector<std::string> others;
  for (const Pending& p : pending_) others.push_back(Registrant(p.request));
  const std::string why = absl::StrCat(
      "the ranks disagree on the world size (", req.size(), " vs ", world_size_, "): ",
      Registrant(req), " expects ", req.size(), " but ",
      others.empty() ? std::string("this coordinator was started for")
                     : absl::StrCat(absl::StrJoin(others, ", "),
                                    others.size() > 1 ? " expect" : " expects"),
      " ", world_size_, ": give every rank the same world size (WORLD_SIZE, BRAID_SIZE, ...)");
  const absl::Status status = absl::InvalidArgumentError(why);
  if (pending_.empty() && !opts_.one_job) return status;
  if (opts_.one_job) refusal_ = status;
  FailRegistrations(status, out);
  return status;
}

void Job::FailRegistrations(const absl::Status& why, Completions* out) {
  const int world_size = world_size_;  // RemoveRegistration frees it with the last one
  while (!pending_.empty()) RemoveRegistration(pending_.front().id, why, out);
  // The job is over before it began: its status says so, with the reason, and the next
  // registration starts the next job.
  world_size_ = world_size;
  abort_ = absl::Status(why.code(), absl::StrCat("registration failed: ", why.message()));
  phase_ = proto::JOB_ENDED;
  LOG(WARNING) << "coordinator: job " << id() << " " << abort_.message();
}

void Job::Form(absl::Time now, Completions* out) {
  std::vector<proto::RegisterRequest> requests;
  for (const Pending& p : pending_) requests.push_back(p.request);
  auto formed = FormJob(requests, world_size_, opts_.settings);
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  formed_at_ = now;
  if (!formed.ok()) {
    // Every rank gets the error; the job is over before it began.
    abort_ = absl::Status(formed.status().code(),
                          absl::StrCat("registration failed: ", formed.status().message()));
    phase_ = proto::JOB_ENDED;
    for (Pending& p : pending) {
      out->push_back([done = std::move(p.done), s = formed.status()] { done(s); });
    }
    return;
  }
  settings_ = (*formed)[0].settings();
  table_ = std::make_unique<NegotiationTable>(world_size_, settings_.fusion_threshold_bytes(),
                                              settings_.cache_capacity());
  table_->set_report_ages(false);  // until a rank asks for them (OpenStream)
  ranks_.assign(world_size_, Rank{});
  for (size_t i = 0; i < pending.size(); ++i) {
    Rank& r = ranks_[(*formed)[i].rank()];
    r.host = pending[i].request.host();
    r.pid = pending[i].request.pid();
    r.last_seen = now;
    r.token = RandomSecret();
    (*formed)[i].set_rank_token(r.token);
    out->push_back([done = std::move(pending[i].done), resp = std::move((*formed)[i])] {
      done(resp);
    });
  }
  phase_ = proto::JOB_RUNNING;
  VLOG(1) << "coordinator: job " << id() << " formed: " << world_size_ << " ranks";
}

bool Job::HasRankProcess(const std::string& host, int64_t pid) const {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [&](const Rank& r) { return r.host == host && r.pid == pid; });
}

bool Job::RemoveRegistration(int64_t call_id, const absl::Status& why, Completions* out) {
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [call_id](const Pending& p) { return p.id == call_id; });
  if (it == pending_.end()) return false;
  out->push_back([done = std::move(it->done), why] { done(why); });
  pending_.erase(it);
  // With nobody left waiting, the next registration may name another world size.
  if (pending_.empty()) world_size_ = opts_.world_size;
  return true;
}

absl::Status Job::CheckToken(int rank, absl::string_view token, absl::string_view what) const {
  if (rank >= 0 && rank < static_cast<int>(ranks_.size()) &&
      SecretsEqual(token, ranks_[rank].token)) {
    return absl::OkStatus();
  }
  const std::string why = token.empty() ? std::string("no rank token")
                                        : absl::StrCat("not its token in job ", id());
  return absl::PermissionDeniedError(
      absl::StrCat(what, " for rank ", rank, " refused: ", why,
                   " (a stream or heartbeat speaks only for the rank that registered it)"));
}

absl::Status Job::OpenStream(int rank, absl::string_view token, std::shared_ptr<StreamSink> sink,
                             absl::Time now, bool report_ages) {
  if (phase_ == proto::JOB_FORMING || rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " opened negotiation before job ", id(), " formed"));
  }
  if (absl::Status s = CheckToken(rank, token, "negotiation stream"); !s.ok()) return s;
  Rank& r = ranks_[rank];
  if (phase_ == proto::JOB_ENDED || r.state == RankState::kShutDown ||
      r.state == RankState::kLost) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " has left job ", id(), ": it cannot negotiate again"));
  }
  if (r.stream) r.stream->Close();  // a second stream replaces the first
  r.stream = std::move(sink);
  r.report_ages = report_ages;
  r.stream->set_coalesce(settings_.fast_path() == 0);
  if (report_ages) table_->set_report_ages(true);
  r.state = RankState::kNegotiating;
  r.last_seen = now;
  if (!abort_.ok()) r.stream->Send(AbortMessage(abort_));
  if (shutting_down_) {
    r.stream->Send(ShutdownMessage());
    r.stream->Close();
  }
  return absl::OkStatus();
}

void Job::Broadcast(proto::ResponseList rl) {
  // Called under the service's lock: every stream receives the same sequence. One shared
  // message per kind, not a copy per stream; the ranks that did not ask for report ages
  // (N of them per tensor) get a message without them, so a step's responses cost the
  // coordinator O(N·T), not O(N²·T).
  if (rl.sequence() == 0) rl.set_sequence(++sequence_);
  auto full = std::make_shared<const proto::ResponseList>(std::move(rl));
  std::shared_ptr<const proto::ResponseList> lean;
  for (Rank& r : ranks_) {
    if (!r.stream) continue;
    if (r.report_ages) {
      r.stream->SendShared(full);
      continue;
    }
    if (lean == nullptr) {
      bool has_ages = false;
      for (const proto::Response& resp : full->responses()) {
        has_ages |= resp.report_age_us_size() > 0;
      }
      if (has_ages) {
        auto copy = std::make_shared<proto::ResponseList>(*full);
        for (proto::Response& resp : *copy->mutable_responses()) resp.clear_report_age_us();
        lean = std::move(copy);
      } else {
        lean = full;
      }
    }
    r.stream->SendShared(lean);
  }
}

void Job::SendReplies() {
  for (auto& [rank, responses] : table_->TakeReplies()) {
    if (rank < 0 || rank >= static_cast<int>(ranks_.size()) || !ranks_[rank].stream) continue;
    proto::ResponseList rl;  // sequence 0: this rank's alone
    for (proto::Response& r : responses) *rl.add_responses() = std::move(r);
    ranks_[rank].stream->Send(rl);
  }
}

void Job::AbortForFailure(int rank, const proto::FailureReport& f) {
  absl::StatusCode code = static_cast<absl::StatusCode>(f.error_code());
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  Abort(absl::Status(code, absl::StrCat("tensor '", Truncated(f.name(), kMaxNameBytes),
                                        "' failed on rank ", rank,
                                        " inside its collective: ",
                                        Truncated(f.message(), kMaxErrorMessageBytes))));
}

void Job::NoteApplied(int rank, const proto::RequestList& msg) {
  if (!msg.has_applied_sequence()) return;
  Rank& me = ranks_[rank];
  me.applied_sequence = std::max(me.applied_sequence, msg.applied_sequence());
  me.reports_applied = true;
  int64_t applied = sequence_;
  for (const Rank& r : ranks_) {
    if (r.state == RankState::kShutDown || r.state == RankState::kLost) continue;
    if (!r.reports_applied) return;  // an older client: keep every retired entry
    applied = std::min(applied, r.applied_sequence);
  }
  table_->ReleaseRetired(applied);
}

void Job::OnRequests(int rank, const StreamSink* sink, const proto::RequestList& msg,
                     absl::Time now) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()) || ranks_[rank].stream.get() != sink) {
    return;  // a stream that is no longer this rank's
  }
  if (msg.shutdown()) return Goodbye(rank, now);
  ranks_[rank].last_seen = now;
  ++cycles_;
  NoteApplied(rank, msg);
  for (const proto::FailureReport& f : msg.failures()) {
    if (f.in_collective()) AbortForFailure(rank, f);
  }
  std::vector<proto::Response> ready = table_->Submit(rank, msg, now);
  for (auto& r : table_->FailTensorsWaitingFor(clean_)) ready.push_back(std::move(r));
  SendReplies();
  if (ready.empty()) return;
  proto::ResponseList rl;
  for (auto& r : ready) *rl.add_responses() = std::move(r);
  rl.set_sequence(++sequence_);
  for (int32_t id : table_->TakeEvictions(rl.sequence())) rl.add_evicted_cache_ids(id);
  responses_sent_ += rl.responses_size();
  Broadcast(std::move(rl));
}

void Job::Goodbye(int rank, absl::Time now) {
  Rank& r = ranks_[rank];
  r.state = RankState::kShutDown;
  r.last_seen = now;
  r.stream->Close();  // the coordinator ends the stream after a goodbye
  r.stream.reset();
  clean_.insert(rank);
  // Work the others still wait on from this rank can never complete: fail it now.
  proto::ResponseList rl;
  for (auto& resp : table_->FailTensorsWaitingFor(clean_)) *rl.add_responses() = std::move(resp);
  rl.add_ranks_left(rank);
  Broadcast(std::move(rl));
  MaybeEnd(now);
}

void Job::OnStreamEnd(int rank, const StreamSink* sink, absl::Time now) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()) || ranks_[rank].stream.get() != sink) {
    return;
  }
  Rank& r = ranks_[rank];
  r.stream->Close();
  r.stream.reset();
  if (!shutting_down_) {
    Lose(rank, absl::StrCat("rank ", rank, " (pid ", r.pid, " on ", r.host,
                            ") was lost: its connection to the coordinator closed"));
  }
  MaybeEnd(now);
}

void Job::Lose(int rank, const std::string& why) {
  Rank& r = ranks_[rank];
  r.state = RankState::kLost;
  if (r.stream) {
    // The lost rank learns why too, should it still read (a stopped process resumed): not
    // just that its stream closed, which it would take for a lost coordinator.
    if (abort_.ok()) r.stream->Send(AbortMessage(absl::UnavailableError(why)));
    r.stream->Close();
    r.stream.reset();
  }
  Abort(absl::UnavailableError(why));
  if (opts_.on_rank_lost) opts_.on_rank_lost(rank, why);
}

absl::Status Job::Heartbeat(const proto::HeartbeatRequest& req, absl::string_view token,
                            absl::Time now) {
  if (phase_ == proto::JOB_FORMING) {
    return absl::FailedPreconditionError(
        absl::StrCat("heartbeat for rank ", req.rank(), " before job ", id(), " formed"));
  }
  if (absl::Status s = CheckToken(req.rank(), token, "heartbeat"); !s.ok()) return s;
  Rank& r = ranks_[req.rank()];
  r.last_seen = now;
  // Each report holds the rank's cumulative totals, so the newer replaces the older. A
  // report counting fewer reductions than the one kept is older, overtaken in flight (the
  // heartbeat thread's last beat racing the final report from Close()): drop it.
  auto total = [](const auto& reports) {
    int64_t n = 0;
    for (const proto::MethodBytes& m : reports) n += m.reductions();
    return n;
  };
  if (total(req.compression()) >= total(r.compression)) {
    r.compression.assign(req.compression().begin(), req.compression().end());
  }
  if (req.fast_path_buckets() >= r.fast_path_buckets) {  // cumulative too: keep the newer
    r.fast_path.assign(req.fast_path().begin(), req.fast_path().end());
    r.fast_path_buckets = req.fast_path_buckets();
  }
  return absl::OkStatus();
}

absl::Status Job::KeyValueSet(const std::string& key, const std::string& value) {
  const KeyValueLimits& l = opts_.kv_limits;
  if (key.size() > l.max_key_bytes || value.size() > l.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key-value store of job ", id(), ": a key of ", key.size(), " bytes and a value of ",
        value.size(), " bytes exceed its limits of ", l.max_key_bytes, " and ",
        l.max_value_bytes, " bytes"));
  }
  auto it = kv_.find(key);
  if (it == kv_.end() && static_cast<int>(kv_.size()) >= l.max_keys) {
    return absl::InvalidArgumentError(absl::StrCat("key-value store of job ", id(),
                                                   " is full: it holds its limit of ",
                                                   l.max_keys, " keys"));
  }
  if (it == kv_.end()) {
    kv_.emplace(key, value);
  } else {
    it->second = value;
  }
  return absl::OkStatus();
}

const std::string* Job::KeyValueGet(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

void Job::Abort(const absl::Status& s) {
  if (!abort_.ok()) return;
  abort_ = s;
  LOG(WARNING) << "coordinator: aborting job " << id() << ": " << s.message();
  Broadcast(AbortMessage(s));
}

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

void Job::Shutdown(const absl::Status& why, Completions* out) {
  shutting_down_ = true;
  while (!pending_.empty()) RemoveRegistration(pending_.front().id, why, out);
  for (Rank& r : ranks_) {
    if (!r.stream) continue;
    r.stream->Send(ShutdownMessage());
    r.stream->Close();
    r.stream.reset();
  }
}

}  // namespace braid::coordinator
