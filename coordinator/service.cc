#include "coordinator/service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace braid::coordinator {
namespace {

void Run(Completions& out) {
  for (auto& f : out) f();
}

}  // namespace

CoordinatorService::CoordinatorService(ServiceOptions options)
    : opts_(std::move(options)), start_(Now()), admission_(opts_.job_secret, opts_.clock) {
  absl::MutexLock lock(&mu_);
  job_ = std::make_unique<Job>(JobOptions(1), start_);
}

CoordinatorService::~CoordinatorService() = default;

Job::Options CoordinatorService::JobOptions(int64_t id) const {
  Job::Options o;
  o.id = id;
  o.world_size = opts_.world_size;
  o.settings = opts_.settings;
  o.register_timeout = opts_.register_timeout;
  o.kv_limits = opts_.kv_limits;
  // An elastic job's memberships follow one another: a disagreement ends one membership,
  // not the coordinator's service.
  o.one_job = opts_.single_job && !opts_.elastic_world_size;
  o.on_rank_lost = opts_.on_rank_lost;
  o.elastic_world_size = opts_.elastic_world_size;
  o.elastic_admit = opts_.elastic_admit;
  o.autotune = opts_.autotune;
  return o;
}

int64_t CoordinatorService::NewCallId() {
  absl::MutexLock lock(&mu_);
  return next_call_id_++;
}

Job* CoordinatorService::FindJobLocked(int64_t job_id) {
  if (job_id == 0 || job_id == job_->id()) return job_.get();
  if (previous_ && job_id == previous_->id()) return previous_.get();
  return nullptr;
}

void CoordinatorService::Register(int64_t call_id, const Caller& caller,
                                  const proto::RegisterRequest& req, RegisterDone done) {
  if (absl::Status s = admission_.Check(caller, "Register"); !s.ok()) return done(s);
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    auto refuse = [&](absl::Status s) {
      out.push_back([done = std::move(done), s = std::move(s)] { done(s); });
    };
    if (shutting_down_) {
      refuse(absl::UnavailableError("the coordinator is shutting down"));
    } else if (opts_.single_job && !opts_.elastic_world_size &&
               job_->phase() == proto::JOB_RUNNING &&
               !job_->HasRankProcess(req.host(), req.pid())) {
      // Note [One job at a time]: this coordinator's one job is running and the caller is
      // none of its processes (those may init again: they wait for the job to end), so it
      // is another job's rank, sent to the same port.
      refuse(absl::FailedPreconditionError(absl::StrCat(
          "pid ", req.pid(), " on ", req.host(), " tried to join a job of ",
          job_->world_size(), " ranks that is already running on this coordinator: is a "
          "second job using the same coordinator port? Give each job its own port "
          "(BRAID_COORDINATOR_PORT or MASTER_PORT)")));
    } else {
      RegisterLocked(call_id, req, std::move(done), Now(), &out);
      AfterChangeLocked(&out);
    }
  }
  Run(out);
}

void CoordinatorService::RegisterLocked(int64_t id, const proto::RegisterRequest& req,
                                        RegisterDone done, absl::Time now, Completions* out) {
  if (job_->ended() && job_->refusal().ok()) NextJobLocked(out);
  if (job_->phase() == proto::JOB_RUNNING) {
    // Note [Elastic membership]: a drained process is refused at once rather than queued,
    // where it would count as one waiting to join (Job::AddRegistration asks the others).
    if (opts_.elastic_admit && req.has_worker()) {
      if (absl::Status s = opts_.elastic_admit(req.worker()); !s.ok()) {
        out->push_back([done = std::move(done), s = std::move(s)] { done(s); });
        return;
      }
    }
    // Note [One job at a time]: wait for the running job to end.
    queued_.push_back({id, req, now + opts_.register_timeout, std::move(done)});
    return;
  }
  job_->AddRegistration(id, req, std::move(done), now, out);
}

void CoordinatorService::NextJobLocked(Completions* out) {
  const absl::Time now = Now();
  const int64_t id = job_->id() + 1;
  previous_ = std::move(job_);
  job_ = std::make_unique<Job>(JobOptions(id), now);
  std::vector<Queued> queued = std::move(queued_);
  queued_.clear();
  for (Queued& q : queued) {
    if (job_->phase() == proto::JOB_FORMING) {
      job_->AddRegistration(q.id, q.request, std::move(q.done), now, out);
    } else {
      queued_.push_back(std::move(q));  // more ranks than this job has: the job after it
    }
  }
}

void CoordinatorService::AfterChangeLocked(Completions* out) {
  while (job_->ended()) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->status_done && it->job_id == job_->id()) {
        CompleteStatusLocked(*it, out);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (queued_.empty() || shutting_down_) return;
    NextJobLocked(out);
  }
}

void CoordinatorService::CompleteStatusLocked(Waiter& w, Completions* out) {
  Job* job = FindJobLocked(w.job_id);
  absl::StatusOr<proto::StatusResponse> resp;
  if (job == nullptr) {
    resp = absl::FailedPreconditionError(absl::StrCat(
        "job ", w.job_id, " is no longer known to this coordinator (it is at job ", job_->id(),
        ")"));
  } else {
    const absl::Time now = Now();
    resp = proto::StatusResponse();
    resp->set_uptime_ms(absl::ToInt64Milliseconds(now - start_));
    job->FillStatus(now, &*resp);
  }
  out->push_back([done = std::move(w.status_done), resp = std::move(resp)] { done(resp); });
}

void CoordinatorService::Cancel(int64_t call_id) {
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    const absl::Status why = absl::CancelledError("the caller went away");
    if (!job_->RemoveRegistration(call_id, why, &out)) {
      auto q = std::find_if(queued_.begin(), queued_.end(),
                            [&](const Queued& x) { return x.id == call_id; });
      if (q != queued_.end()) {
        out.push_back([done = std::move(q->done), why] { done(why); });
        queued_.erase(q);
      }
      auto w = std::find_if(waiters_.begin(), waiters_.end(),
                            [&](const Waiter& x) { return x.id == call_id; });
      if (w != waiters_.end()) {
        if (w->kv_done) {
          out.push_back([done = std::move(w->kv_done)] { done(proto::KeyValueGetResponse()); });
        } else {
          out.push_back([done = std::move(w->status_done), why] { done(why); });
        }
        waiters_.erase(w);
      }
    }
  }
  Run(out);
}

absl::Status CoordinatorService::KeyValueSet(const Caller& caller,
                                             const proto::KeyValueSetRequest& req) {
  BRAID_RETURN_IF_ERROR(admission_.Check(caller, "KeyValueSet"));
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    job_->CountKeyValueRpc();
    BRAID_RETURN_IF_ERROR(job_->KeyValueSet(req.key(), req.value()));
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->kv_done && it->key == req.key()) {
        proto::KeyValueGetResponse resp;
        resp.set_found(true);
        resp.set_value(req.value());
        out.push_back([done = std::move(it->kv_done), resp] { done(resp); });
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Run(out);
  return absl::OkStatus();
}

void CoordinatorService::KeyValueGet(int64_t call_id, const Caller& caller,
                                     const proto::KeyValueGetRequest& req, KeyValueDone done) {
  if (absl::Status s = admission_.Check(caller, "KeyValueGet"); !s.ok()) return done(s);
  proto::KeyValueGetResponse resp;
  {
    absl::MutexLock lock(&mu_);
    job_->CountKeyValueRpc();
    if (const std::string* v = job_->KeyValueGet(req.key())) {
      resp.set_found(true);
      resp.set_value(*v);
    } else if (req.timeout_ms() > 0 && !shutting_down_) {
      Waiter w;
      w.id = call_id;
      w.job_id = job_->id();
      w.deadline = Now() + absl::Milliseconds(req.timeout_ms());
      w.key = req.key();
      w.kv_done = std::move(done);
      waiters_.push_back(std::move(w));
      return;
    }
  }
  done(resp);
}

absl::Status CoordinatorService::AdmitStream(const Caller& caller) {
  return admission_.Check(caller, "Negotiate");
}

absl::StatusOr<StreamKey> CoordinatorService::OpenStream(const Caller& caller,
                                                         const proto::RequestList& hello,
                                                         std::shared_ptr<StreamSink> sink) {
  BRAID_RETURN_IF_ERROR(admission_.Check(caller, "Negotiate"));
  absl::Status s;
  StreamKey key;
  {
    absl::MutexLock lock(&mu_);
    key = StreamKey{job_->id(), hello.rank(), sink.get()};
    s = job_->OpenStream(hello.rank(), caller.rank_token, std::move(sink), Now(),
                         hello.report_ages());
  }
  if (s.code() == absl::StatusCode::kPermissionDenied) {
    admission_.LogRefusal(caller, "Negotiate", s.message());
  }
  if (!s.ok()) return s;
  return key;
}

void CoordinatorService::OnRequests(const StreamKey& key, const proto::RequestList& msg) {
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    if (key.job_id != job_->id()) return;  // a stream of an earlier job
    job_->OnRequests(key.rank, key.sink, msg, Now());
    AfterChangeLocked(&out);
  }
  Run(out);
}

void CoordinatorService::OnStreamEnd(const StreamKey& key) {
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    if (key.job_id != job_->id()) return;
    job_->OnStreamEnd(key.rank, key.sink, Now());
    AfterChangeLocked(&out);
  }
  Run(out);
}

absl::Status CoordinatorService::Heartbeat(const Caller& caller,
                                           const proto::HeartbeatRequest& req,
                                           proto::HeartbeatResponse* resp) {
  bool holds_token;
  {
    absl::MutexLock lock(&mu_);
    holds_token = job_->IsRankToken(req.rank(), caller.rank_token);
  }
  // Note [Refusal budget]: a rank's heartbeat goes through while others guess from its
  // address, so guessing cannot get the job's ranks declared lost.
  BRAID_RETURN_IF_ERROR(admission_.Check(caller, "Heartbeat", holds_token));
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = job_->Heartbeat(req, caller.rank_token, Now());
    if (s.ok() && resp != nullptr) {
      resp->set_ranks_waiting(static_cast<int>(queued_.size()));
      if (opts_.elastic_leaving) {
        resp->set_ranks_leaving(job_->CountActiveRanks(
            [this](int worker) { return worker >= 0 && opts_.elastic_leaving(worker); }));
      }
    }
  }
  if (s.code() == absl::StatusCode::kPermissionDenied) {
    admission_.LogRefusal(caller, "Heartbeat", s.message());
  }
  return s;
}

void CoordinatorService::Status(int64_t call_id, const Caller& caller,
                                const proto::StatusRequest& req, StatusDone done) {
  if (absl::Status s = admission_.Check(caller, "Status"); !s.ok()) return done(s);
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJobLocked(req.job_id());
    Waiter w;
    w.id = call_id;
    w.job_id = job != nullptr ? job->id() : req.job_id();
    w.deadline = Now() + absl::Milliseconds(req.wait_for_end_ms());
    w.status_done = std::move(done);
    if (job != nullptr && !job->ended() && req.wait_for_end_ms() > 0 && !shutting_down_) {
      waiters_.push_back(std::move(w));
      return;
    }
    CompleteStatusLocked(w, &out);
  }
  Run(out);
}

absl::Status CoordinatorService::RequestShutdown(const Caller& caller,
                                                 const proto::ShutdownRequest& req) {
  BRAID_RETURN_IF_ERROR(admission_.Check(caller, "Shutdown"));
  absl::MutexLock lock(&mu_);
  LOG(INFO) << "coordinator: shutdown requested by " << caller.peer
            << (req.reason().empty() ? std::string() : ": " + req.reason());
  shutdown_requested_ = true;
  return absl::OkStatus();
}

bool CoordinatorService::shutdown_requested() const {
  absl::MutexLock lock(&mu_);
  return shutdown_requested_;
}

void CoordinatorService::BeginShutdown() {
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    const absl::Status why = absl::UnavailableError("the coordinator is shutting down");
    job_->Shutdown(why, &out);
    for (Queued& q : queued_) out.push_back([done = std::move(q.done), why] { done(why); });
    queued_.clear();
    for (Waiter& w : waiters_) {
      if (w.kv_done) {
        out.push_back([done = std::move(w.kv_done)] { done(proto::KeyValueGetResponse()); });
      } else {
        CompleteStatusLocked(w, &out);
      }
    }
    waiters_.clear();
  }
  Run(out);
}

void CoordinatorService::Inspect() {
  Completions out;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    job_->Inspect(now, &out);
    job_->Resize(now, &out);
    for (auto it = queued_.begin(); it != queued_.end();) {
      if (now < it->deadline) {
        ++it;
        continue;
      }
      absl::Status s = absl::FailedPreconditionError(absl::StrCat(
          "a job is already running on this coordinator: job ", job_->id(),
          " did not end within ", absl::FormatDuration(opts_.register_timeout)));
      out.push_back([done = std::move(it->done), s] { done(s); });
      it = queued_.erase(it);
    }
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (now < it->deadline) {
        ++it;
        continue;
      }
      if (it->kv_done) {
        out.push_back([done = std::move(it->kv_done)] { done(proto::KeyValueGetResponse()); });
      } else {
        CompleteStatusLocked(*it, &out);
      }
      it = waiters_.erase(it);
    }
    AfterChangeLocked(&out);
  }
  Run(out);
}

}  // namespace braid::coordinator
