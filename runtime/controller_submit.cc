// The negotiation controller's side for the callers' threads (controller.h): a job's start
// and end, collectives taken into the table of those in flight, local failures, groups.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "runtime/controller.h"

namespace braid {
namespace {

proto::Request ToProto(const CollectiveRequest& req, const std::string& compression,
                       const std::string& pattern) {
  proto::Request p;
  p.set_name(req.name);
  p.set_collective(static_cast<proto::Collective>(req.collective));
  p.set_dtype(static_cast<proto::DataType>(req.dtype));
  for (int64_t d : req.shape) p.add_shape(d);
  p.set_device(static_cast<proto::Device>(req.device.type));
  p.set_device_id(req.device.id);
  p.set_reduce_op(static_cast<proto::ReduceOp>(req.op));
  p.set_root_rank(req.root_rank);
  p.set_process_set_id(req.process_set_id);
  p.set_compression(compression);
  p.set_compression_pattern(pattern);
  for (int r : req.process_set_ranks) p.add_process_set_ranks(r);
  p.set_target_process_set_id(req.target_process_set_id);
  p.set_members_only(req.members_only);
  return p;
}

}  // namespace

absl::Status NegotiationController::Start(const Parts& parts) {
  {
    absl::MutexLock lock(&mu_);
    parts_ = parts;
    stop_ = false;
    abort_ = absl::OkStatus();
    executing_ = false;
    negotiating_ = 0;
    group_depth_ = 0;
    cache_.clear();
    outgoing_.clear();
    barriers_outgoing_ = 0;
    barrier_sent_ = {};
    failures_.clear();
    ready_.clear();
    received_.clear();
    held_replies_.clear();
    received_count_ = 0;
    applied_sequence_ = 0;
    fast_active_ = parts.fast_path;
    peer_left_ = absl::OkStatus();
    voting_ = false;
    last_round_ = absl::InfinitePast();
    round_progressed_ = false;
    idle_rounds_ = 0;
    last_send_ = absl::InfinitePast();
    state_ = State::kRunning;
  }
  fast_cache_.Clear();
  applied_ = 0;
  invalidate_next_.clear();
  next_fast_bucket_id_ = -1;
  voted_ = false;
  progressed_ = false;
  {
    absl::MutexLock lock(&fast_stats_mu_);
    fast_by_method_.clear();
    fast_by_group_ = {};
    fast_buckets_ = 0;
  }
  absl::Status s = parts_.client->StartNegotiation(
      parts_.rank, [this](const proto::ResponseList& m) { OnMessage(m); },
      [this](const absl::Status& st) { OnClosed(st); });
  if (!s.ok()) Reset();
  return s;
}

void NegotiationController::Reset() {
  absl::MutexLock lock(&mu_);
  state_ = State::kUninitialized;
}

bool NegotiationController::RequestStop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  return executing_;
}

void NegotiationController::EndJob() {
  absl::MutexLock lock(&mu_);
  for (auto& [name, e] : table_) {
    e.handle->Complete(absl::CancelledError(
        absl::StrCat("braid was shut down before '", name, "' completed")));
  }
  table_.clear();
  state_ = State::kShutDown;
}

bool NegotiationController::running() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kRunning;
}

absl::Status NegotiationController::CheckRunning() const {
  absl::MutexLock lock(&mu_);
  return CheckRunningLocked();
}

absl::Status NegotiationController::CheckRunningLocked() const {
  switch (state_) {
    case State::kRunning: return absl::OkStatus();
    case State::kUninitialized:
      return absl::FailedPreconditionError("braid is not initialized: call init() first");
    case State::kShutDown:
      return absl::FailedPreconditionError(
          "braid has been shut down: call init() again to start a new job");
  }
  return absl::InternalError("bad state");
}

absl::Status NegotiationController::CheckNoneInFlight(
    const std::function<bool(const TensorEntry&)>& in_flight,
    const std::function<std::string(const std::string&)>& why) const {
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  for (const auto& [name, e] : table_) {
    if (in_flight(e)) return absl::FailedPreconditionError(why(name));
  }
  return absl::OkStatus();
}

// Note [Local failures]
// A collective this rank refuses (bad arguments, a compression spec it cannot use) fails
// here, at once, and the caller goes on; but its peers, which asked for the same tensor,
// would wait for this rank's request until the negotiation deadline. So the refusal is also
// reported to the coordinator (a FailureReport, sent in the next cycle without waiting for
// the cycle time), which fails the tensor on every rank that submitted it, naming this rank
// and the cause, and answers the peers that submit it later with the same error (Note
// [Failure reports] in coordinator/negotiation.h). Not reported: a name already in flight
// here (AlreadyExists: the failure would hit the earlier, valid instance) and names that
// cannot travel (empty, or beyond kMaxNameBytes).
void NegotiationController::ReportFailureLocked(const std::string& name,
                                                const absl::Status& cause) {
  if (state_ != State::kRunning || !CheckName("name", name).ok()) return;
  proto::FailureReport f;
  f.set_name(name);
  f.set_error_code(static_cast<int32_t>(cause.code()));
  f.set_message(Truncated(cause.message(), kMaxErrorMessageBytes));
  failures_.push_back(PendingFailure{next_seq_++, std::move(f)});
}

absl::Status NegotiationController::ReportFailure(const std::string& name,
                                                  const absl::Status& cause) {
  if (cause.ok()) return absl::InvalidArgumentError("a failure report needs an error");
  BRAID_RETURN_IF_ERROR(CheckName("name", name));
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  if (table_.count(name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", name, "' is in flight on rank ", parts_.rank, ": its own handle reports it"));
  }
  ReportFailureLocked(name, cause);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Handle>> NegotiationController::Submit(CollectiveRequest req,
                                                                       const Validate& validate) {
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  if (table_.count(req.name)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "tensor '", req.name, "' is already in flight on rank ", parts_.rank,
        ": wait for it to complete before reusing the name"));
  }
  absl::StatusOr<Accepted> accepted = validate(req);
  if (!accepted.ok()) {
    ReportFailureLocked(req.name, accepted.status());
    return accepted.status();
  }
  const compression::CompressionMethod* method = accepted->method;
  // The pattern the runtime resolved replaces the caller's (Note [Compression groups]).
  req.compression_pattern = method != nullptr ? std::move(accepted->pattern) : std::string();
  auto handle = std::make_shared<Handle>();
  if (!abort_.ok()) {
    handle->Complete(abort_);
    return handle;
  }
  // The canonical spec travels (the coordinator compares it across ranks as it is).
  proto::Request p = ToProto(req, method != nullptr ? method->spec() : std::string(),
                             req.compression_pattern);
  std::string request_bytes = p.SerializeAsString();
  if (req.collective == Collective::kBarrier) ++barriers_outgoing_;
  outgoing_.push_back(std::move(p));
  if (std::shared_ptr<Timeline> timeline = parts_.timeline ? parts_.timeline() : nullptr) {
    timeline->Begin(req.name, "NEGOTIATE",
                    absl::StrCat("\"collective\": \"", CollectiveName(req.collective), "\""));
  }
  std::string name = req.name;
  table_.emplace(std::move(name),
                 TensorEntry{std::move(req), handle, method, std::move(request_bytes),
                             /*fast=*/false, absl::InfinitePast(), next_seq_++,
                             std::move(accepted->ready)});
  return handle;
}

void NegotiationController::BeginGroup() {
  absl::MutexLock lock(&mu_);
  ++group_depth_;
}

absl::Status NegotiationController::EndGroup() {
  absl::MutexLock lock(&mu_);
  if (group_depth_ == 0) {
    return absl::FailedPreconditionError("EndGroup() without a matching BeginGroup()");
  }
  --group_depth_;  // at 0 the loop sends what the group held (Note [Cycle])
  return CheckRunningLocked();
}

}  // namespace braid
