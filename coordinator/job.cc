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
  if (opts_.elastic_world_size) {
    absl::StatusOr<int> n = opts_.elastic_world_size();
    if (!n.ok()) return refuse(n.status());
    world_size_ = std::max(*n, 0);
  }
  if (opts_.elastic_admit && req.has_worker()) {
    if (absl::Status s = opts_.elastic_admit(req.worker()); !s.ok()) return refuse(s);
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

void Job::Resize(absl::Time now, Completions* out) {
  if (!opts_.elastic_world_size || phase_ != proto::JOB_FORMING || pending_.empty()) return;
  absl::StatusOr<int> size = opts_.elastic_world_size();
  if (!size.ok()) return FailRegistrations(size.status(), out);
  const int n = *size;
  if (n <= 0) return;
  // A process drained after it registered (Note [Elastic membership]) is refused now: it is
  // not among the n.
  if (opts_.elastic_admit) {
    std::vector<std::pair<int64_t, absl::Status>> refused;
    for (const Pending& p : pending_) {
      if (!p.request.has_worker()) continue;
      absl::Status s = opts_.elastic_admit(p.request.worker());
      if (!s.ok()) refused.emplace_back(p.id, std::move(s));
    }
    for (auto& [id, why] : refused) RemoveRegistration(id, why, out);
    if (pending_.empty()) return;
  }
  // More registrations than ranks: one of them is a process braidrun already counts out (it
  // died after registering); its call is cancelled when its connection closes.
  world_size_ = n;
  if (static_cast<int>(pending_.size()) == world_size_) Form(now, out);
}

std::string Registrant(const proto::RegisterRequest& r) {
  std::string who = absl::StrCat("pid ", r.pid(), " on ", r.host());
  return r.rank() >= 0 ? absl::StrCat("rank ", r.rank(), " (", who, ")") : who;
}

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
  autotuner_.reset();
  chooser_.reset();
  for (size_t i = 0; i < pending.size(); ++i) {
    Rank& r = ranks_[(*formed)[i].rank()];
    r.host = pending[i].request.host();
    r.pid = pending[i].request.pid();
    r.worker = pending[i].request.has_worker() ? pending[i].request.worker() : -1;
    r.last_seen = now;
    r.token = RandomSecret();
    (*formed)[i].set_rank_token(r.token);
    out->push_back([done = std::move(pending[i].done), resp = std::move((*formed)[i])] {
      done(resp);
    });
  }
  if (settings_.autotune() != 0) {
    autotuner_ = std::make_unique<Autotuner>(opts_.autotune, StartSettings(), world_size_);
  }
  phase_ = proto::JOB_RUNNING;
  VLOG(1) << "coordinator: job " << id() << " formed: " << world_size_ << " ranks";
}

bool Job::HasRankProcess(const std::string& host, int64_t pid) const {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [&](const Rank& r) { return r.host == host && r.pid == pid; });
}

int Job::CountActiveRanks(const std::function<bool(int worker)>& pred) const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) {
    return (r.state == RankState::kRegistered || r.state == RankState::kNegotiating) &&
           pred(r.worker);
  }));
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
  if (msg.samples_size() > 0) OnSamples(rank, msg);
  // A list of samples alone (Note [Settings changes]) is no negotiation cycle.
  if (msg.samples_size() > 0 && msg.requests_size() == 0 && msg.cached_ids_size() == 0 &&
      msg.failures_size() == 0 && !msg.has_applied_sequence()) {
    return;
  }
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
  if (opts_.on_rank_lost) opts_.on_rank_lost(rank, r.worker, why);
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
  // Per group when the rank reports them (Note [Compression groups]), else per method: a
  // rank that predates the groups, each method then one group with no pattern.
  const auto& groups =
      req.compression_groups_size() > 0 ? req.compression_groups() : req.compression();
  if (total(groups) >= total(r.compression)) {
    r.compression.assign(groups.begin(), groups.end());
  }
  if (req.fast_path_buckets() >= r.fast_path_buckets) {  // cumulative too: keep the newer
    r.fast_path.assign(req.fast_path().begin(), req.fast_path().end());
    // Per group when the rank reports them, else its per-method counts (all-reduces only).
    r.fast_path_groups.clear();
    for (const proto::MethodNegotiated& m :
         req.fast_path_groups_size() > 0 ? req.fast_path_groups() : req.fast_path()) {
      if (!m.method().empty()) r.fast_path_groups.push_back(m);
    }
    r.fast_path_buckets = req.fast_path_buckets();
    r.fast_path_sets.clear();
    r.fast_path_sets.insert(req.fast_path_sets().begin(), req.fast_path_sets().end());
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
