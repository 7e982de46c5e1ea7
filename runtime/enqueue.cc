// Enqueue: a request is checked locally, its compression resolved once into a canonical
// method, and it joins the tensor table and the queue of requests to negotiate.
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "compression/registry.h"
#include "runtime/runtime_impl.h"

namespace braid {
namespace {

absl::Status CheckSplits(const CollectiveRequest& r, int size,
                         const std::function<absl::Status(const std::string&)>& bad) {
  if (r.splits.empty()) {
    if (r.shape[0] % size != 0) {
      return bad(absl::StrCat("dim 0 (", r.shape[0], ") does not divide evenly among ", size,
                              " ranks: pass splits"));
    }
    return absl::OkStatus();
  }
  if (static_cast<int>(r.splits.size()) != size) {
    return bad(absl::StrCat("splits has ", r.splits.size(), " entries for ", size, " ranks"));
  }
  // Overflow-checked: splits whose sum wraps around to dim 0 must not pass.
  auto sum = CheckedSum("splits", r.splits, kMaxTensorBytes);
  if (!sum.ok()) return bad(std::string(sum.status().message()));
  if (*sum != r.shape[0]) {
    return bad(absl::StrCat("splits sum to ", *sum, " but dim 0 is ", r.shape[0]));
  }
  return absl::OkStatus();
}

proto::Request ToProto(const CollectiveRequest& req, const std::string& compression) {
  proto::Request p;
  p.set_name(req.name);
  p.set_collective(static_cast<proto::Collective>(req.collective));
  p.set_dtype(static_cast<proto::DataType>(req.dtype));
  for (int64_t d : req.shape) p.add_shape(d);
  p.set_device(proto::CPU);
  p.set_reduce_op(static_cast<proto::ReduceOp>(req.op));
  p.set_root_rank(req.root_rank);
  p.set_process_set_id(req.process_set_id);
  p.set_compression(compression);
  return p;
}

}  // namespace

std::vector<std::string> CompressionMethods(bool test_methods) {
  compression::RegistryOptions o;
  o.test_methods = test_methods;
  return compression::CompressionMethods(o);
}

absl::StatusOr<std::string> CanonicalCompression(absl::string_view spec, bool test_methods) {
  compression::RegistryOptions o;
  o.test_methods = test_methods;
  BRAID_ASSIGN_OR_RETURN(compression::CompressionSpec parsed,
                         compression::ParseCompressionSpec(spec, o));
  return parsed.canonical;
}

absl::Status Runtime::Impl::CheckRunningLocked() const {
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

absl::Status Runtime::Impl::CheckNoCompressionInFlight(absl::string_view what) const {
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  for (const auto& [name, e] : table_) {
    if (e.method != nullptr && !e.method->is_none()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " on rank ", rank_, " while the compressed all-reduce '", name,
          "' is in flight: call it between steps, after synchronizing every all-reduce"));
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::Impl::CheckRequest(const CollectiveRequest& r) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(r.collective), " '", r.name,
                                                   "' on rank ", rank_, ": ", why));
  };
  if (r.name.empty()) return bad("a name is required");
  if (InvalidUtf8Offset(r.name) < r.name.size()) {  // never quoted raw: CheckName escapes it
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(r.collective), " on rank ",
                                                   rank_, ": ",
                                                   CheckName("the name", r.name).message()));
  }
  if (r.name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(r.collective), " '", Truncated(r.name, 64), "' on rank ", rank_,
        ": the name is ", r.name.size(), " bytes long, more than the limit of ", kMaxNameBytes));
  }
  if (!IsValidDataType(static_cast<int32_t>(r.dtype))) return bad("unknown dtype");
  // Overflow-checked against common/limits.h: no size computed from the shape later wraps.
  auto elements = ShapeElements("shape", r.shape);
  if (!elements.ok()) return bad(std::string(elements.status().message()));
  const int64_t n = *elements;
  auto bytes = TensorBytes("shape", n, DataTypeSize(r.dtype));
  if (!bytes.ok()) return bad(std::string(bytes.status().message()));
  if (r.compression.size() > kMaxCompressionSpecBytes) {
    return bad(absl::StrCat("compression is ", r.compression.size(),
                            " bytes long, more than the limit of ", kMaxCompressionSpecBytes));
  }
  if (r.collective == Collective::kBarrier || r.collective == Collective::kJoin) {
    return absl::OkStatus();  // no buffers
  }
  if (n > 0 && r.input == nullptr) {
    return bad("input buffer is null");
  }
  if ((r.collective == Collective::kAllReduce || r.collective == Collective::kBroadcast) &&
      n > 0 && r.output == nullptr) {
    return bad("output buffer is null");
  }
  if (r.collective == Collective::kAllReduce || r.collective == Collective::kReduceScatter) {
    if (!IsValidReduceOp(static_cast<int32_t>(r.op))) {
      return bad(absl::StrCat("unknown reduce op ", static_cast<int32_t>(r.op)));
    }
    absl::Status s = CheckReduceOp(r.dtype, r.op);
    if (!s.ok()) return bad(std::string(s.message()));
  }
  if ((r.collective == Collective::kAllGather || r.collective == Collective::kAllToAll ||
       r.collective == Collective::kReduceScatter) && r.shape.empty()) {
    return bad("needs at least one dimension, got a scalar");
  }
  if (r.collective == Collective::kAllToAll) return CheckSplits(r, size_, bad);
  return absl::OkStatus();
}

absl::StatusOr<const compression::CompressionMethod*> Runtime::Impl::ResolveCompression(
    const CollectiveRequest& r) const {
  // Compression applies to floating-point sum / average all-reduces (MethodApplies). The
  // job's default (BRAID_COMPRESSION) silently skips other tensors, as Horovod's compressors
  // do; a method asked for explicitly on one of them is an error.
  const bool allreduce = r.collective == Collective::kAllReduce;
  if (r.compression.empty()) {
    if (!allreduce) return nullptr;
    return default_method_->Applies(r.dtype, r.op) ? default_method_ : &stage_->none();
  }
  auto method = stage_->Resolve(r.compression);
  if (!method.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(r.collective), " '", r.name,
                                                   "' on rank ", rank_, ": ",
                                                   method.status().message()));
  }
  if ((*method)->is_none()) return allreduce ? *method : nullptr;
  if (!allreduce || !(*method)->Applies(r.dtype, r.op)) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(r.collective), " '", r.name, "' on rank ", rank_, ": compression '",
        (*method)->spec(), "' applies only to allreduce of floating-point tensors with op sum or ",
        "average, got ", DataTypeName(r.dtype), " / ", ReduceOpName(r.op)));
  }
  return *method;
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
void Runtime::Impl::ReportFailureLocked(const std::string& name, const absl::Status& cause) {
  if (state_ != State::kRunning || !CheckName("name", name).ok()) return;
  proto::FailureReport f;
  f.set_name(name);
  f.set_error_code(static_cast<int32_t>(cause.code()));
  f.set_message(Truncated(cause.message(), kMaxErrorMessageBytes));
  failures_.push_back(PendingFailure{next_seq_++, std::move(f)});
}

absl::Status Runtime::Impl::ReportFailure(const std::string& name, const absl::Status& cause) {
  if (cause.ok()) return absl::InvalidArgumentError("a failure report needs an error");
  BRAID_RETURN_IF_ERROR(CheckName("name", name));
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  if (table_.count(name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", name, "' is in flight on rank ", rank_, ": its own handle reports it"));
  }
  ReportFailureLocked(name, cause);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Handle>> Runtime::Impl::Enqueue(CollectiveRequest req) {
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  if (table_.count(req.name)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "tensor '", req.name, "' is already in flight on rank ", rank_,
        ": wait for it to complete before reusing the name"));
  }
  absl::Status bad = CheckRequest(req);
  const compression::CompressionMethod* method = nullptr;
  if (bad.ok()) {
    auto resolved = ResolveCompression(req);
    if (resolved.ok()) method = *resolved;
    bad = resolved.status();
  }
  if (!bad.ok()) {
    ReportFailureLocked(req.name, bad);
    return bad;
  }
  auto handle = std::make_shared<Handle>();
  if (!abort_.ok()) {
    handle->Complete(abort_);
    return handle;
  }
  // The canonical spec travels (the coordinator compares it across ranks as it is).
  proto::Request p = ToProto(req, method != nullptr ? method->spec() : std::string());
  std::string request_bytes = p.SerializeAsString();
  if (req.collective == Collective::kBarrier) ++barriers_outgoing_;
  outgoing_.push_back(std::move(p));
  if (std::shared_ptr<Timeline> timeline = this->timeline()) {
    timeline->Begin(req.name, "NEGOTIATE",
                     absl::StrCat("\"collective\": \"", CollectiveName(req.collective), "\""));
  }
  std::string name = req.name;
  table_.emplace(std::move(name), Entry{std::move(req), handle, method, std::move(request_bytes),
                                       /*fast=*/false, absl::InfinitePast(), next_seq_++});
  return handle;
}

void Runtime::Impl::BeginGroup() {
  absl::MutexLock lock(&mu_);
  ++group_depth_;
}

absl::Status Runtime::Impl::EndGroup() {
  absl::MutexLock lock(&mu_);
  if (group_depth_ == 0) {
    return absl::FailedPreconditionError("EndGroup() without a matching BeginGroup()");
  }
  --group_depth_;  // at 0 the loop sends what the group held (Note [Cycle])
  return CheckRunningLocked();
}

}  // namespace braid
