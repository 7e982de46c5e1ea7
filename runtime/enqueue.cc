// Enqueue: a request is checked locally and its compression resolved once into a canonical
// method; the controller (controller_submit.cc) takes it into the table of collectives in
// flight and the queue of requests to negotiate.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/process_sets.h"
#include "glog/logging.h"
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

// A plan pattern as it travels (Request.compression_pattern): at most
// kMaxCompressionPatternBytes, "..." included.
std::string BoundedPattern(absl::string_view pattern) {
  return Truncated(pattern, kMaxCompressionPatternBytes - 3);
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
  if (compression::CompressionPlan::IsPlan(spec)) {
    BRAID_ASSIGN_OR_RETURN(compression::CompressionPlan plan,
                           compression::CompressionPlan::Parse(spec, o));
    return plan.canonical();
  }
  BRAID_ASSIGN_OR_RETURN(compression::CompressionSpec parsed,
                         compression::ParseCompressionSpec(spec, o));
  return parsed.canonical;
}

absl::StatusOr<CompressionPlanChoice> CompressionPlanFor(absl::string_view plan,
                                                         absl::string_view name,
                                                         absl::Span<const int64_t> shape,
                                                         DataType dtype, ReduceOp op,
                                                         bool test_methods) {
  compression::RegistryOptions o;
  o.test_methods = test_methods;
  BRAID_ASSIGN_OR_RETURN(compression::CompressionPlan parsed,
                         compression::CompressionPlan::Parse(plan, o));
  BRAID_RETURN_IF_ERROR(ShapeElements("shape", shape).status());  // For multiplies it out
  compression::PlanChoice choice = parsed.For(name, shape, dtype, op);
  return CompressionPlanChoice{std::move(choice.spec), BoundedPattern(choice.pattern)};
}

absl::Status Runtime::Impl::CheckNoCompressionInFlight(absl::string_view what) const {
  return controller_.CheckNoneInFlight(
      [](const TensorEntry& e) { return e.method != nullptr && !e.method->is_none(); },
      [&](const std::string& name) {
        return absl::StrCat(what, " on rank ", rank_, " while the compressed all-reduce '", name,
                            "' is in flight: call it between steps, after synchronizing every "
                            "all-reduce");
      });
}

absl::Status Runtime::Impl::CheckRequest(const CollectiveRequest& r, int set_size) const {
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
  if (InvalidUtf8Offset(r.compression_pattern) < r.compression_pattern.size()) {
    return bad("compression_pattern is not valid UTF-8");
  }
  if (const size_t limit = compression::MaxCompressionBytes(r.compression);
      r.compression.size() > limit) {
    return bad(absl::StrCat("compression is ", r.compression.size(),
                            " bytes long, more than the limit of ", limit));
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
  if (r.collective == Collective::kAllToAll) return CheckSplits(r, set_size, bad);
  return absl::OkStatus();
}

absl::StatusOr<Accepted> Runtime::Impl::ResolveCompression(const CollectiveRequest& r,
                                                           absl::string_view plan_name) const {
  // Compression applies to floating-point sum / average all-reduces (MethodApplies). The
  // job's default (BRAID_COMPRESSION) silently skips other tensors, as Horovod's compressors
  // do; a method asked for explicitly on one of them is an error.
  // A plan (Note [Compression plans]) resolves per tensor by its rule, as a default does.
  const bool allreduce = r.collective == Collective::kAllReduce;
  if (r.compression.empty()) {
    if (!allreduce) return nullptr;
    if (default_plan_ != nullptr) return FromPlan(*default_plan_, r, plan_name);
    return default_method_->Applies(r.dtype, r.op) ? default_method_ : &stage_->none();
  }
  if (compression::CompressionPlan::IsPlan(r.compression)) {
    absl::StatusOr<std::shared_ptr<const compression::CompressionPlan>> plan =
        PlanOf(r.compression);
    if (!plan.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(CollectiveName(r.collective), " '", r.name,
                                                     "' on rank ", rank_, ": ",
                                                     plan.status().message()));
    }
    return allreduce ? FromPlan(**plan, r, plan_name) : nullptr;
  }
  auto method = stage_->Resolve(r.compression);
  if (!method.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(r.collective), " '", r.name,
                                                   "' on rank ", rank_, ": ",
                                                   method.status().message()));
  }
  if ((*method)->is_none() && !allreduce) return nullptr;
  if (!(*method)->is_none() && (!allreduce || !(*method)->Applies(r.dtype, r.op))) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(r.collective), " '", r.name, "' on rank ", rank_, ": compression '",
        (*method)->spec(), "' applies only to allreduce of floating-point tensors with op sum or ",
        "average, got ", DataTypeName(r.dtype), " / ", ReduceOpName(r.op)));
  }
  // A caller that resolved a plan itself names the pattern it matched.
  Accepted accepted(*method);
  accepted.pattern = BoundedPattern(r.compression_pattern);
  return accepted;
}

absl::StatusOr<std::shared_ptr<const compression::CompressionPlan>> Runtime::Impl::PlanOf(
    const std::string& text) const {
  constexpr size_t kMaxPlans = 64;  // a program names a few; more are parsed again
  {
    absl::MutexLock lock(&plans_mu_);
    if (auto it = plans_.find(text); it != plans_.end()) return it->second;
  }
  compression::RegistryOptions options;
  options.test_methods = test_compressors_;
  BRAID_ASSIGN_OR_RETURN(compression::CompressionPlan plan,
                         compression::CompressionPlan::Parse(text, options));
  auto shared = std::make_shared<const compression::CompressionPlan>(std::move(plan));
  absl::MutexLock lock(&plans_mu_);
  if (plans_.size() >= kMaxPlans) plans_.clear();
  plans_.emplace(text, shared);
  return shared;
}

absl::StatusOr<Accepted> Runtime::Impl::FromPlan(const compression::CompressionPlan& plan,
                                                 const CollectiveRequest& r,
                                                 absl::string_view plan_name) const {
  const compression::PlanChoice choice = plan.For(plan_name, r.shape, r.dtype, r.op);
  // Checked by the plan's parse: a failure here is the stage's (a missing library).
  absl::StatusOr<const compression::CompressionMethod*> method = stage_->Resolve(choice.spec);
  if (!method.ok()) {
    return absl::Status(method.status().code(),
                        absl::StrCat(CollectiveName(r.collective), " '", r.name, "' on rank ",
                                     rank_, ": ", method.status().message()));
  }
  Accepted accepted(*method);
  accepted.pattern = BoundedPattern(choice.pattern);
  return accepted;
}

absl::Status Runtime::Impl::ReportFailure(const std::string& name, const absl::Status& cause) {
  return controller_.ReportFailure(name, cause);
}

absl::StatusOr<int> Runtime::Impl::CheckProcessSet(const CollectiveRequest& r) const {
  absl::MutexLock lock(&sets_mu_);
  if (r.process_set_id == 0) return sets_.world_size();
  const std::vector<int>* ranks = sets_.Find(r.process_set_id);
  if (ranks == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(r.collective), " '", r.name, "' on rank ", rank_, ": process set ",
        r.process_set_id, " does not exist (never added, or removed)"));
  }
  if (SetRank(*ranks, rank_) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(r.collective), " '", r.name, "' on rank ", rank_, ": rank ", rank_,
        " is not in process set ", r.process_set_id, " (ranks ", absl::StrJoin(*ranks, ", "),
        ")"));
  }
  return static_cast<int>(ranks->size());
}

absl::StatusOr<Accepted> Runtime::Impl::AcceptDevice(const CollectiveRequest& r,
                                                     Accepted accepted) const {
  if (r.device.type == DeviceType::kCPU && r.device.id == 0) return accepted;
  const std::string what =
      absl::StrCat(CollectiveName(r.collective), " '", r.name, "' on rank ", rank_, ": ");
  if (!IsValidDeviceType(static_cast<int32_t>(r.device.type))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "unknown device type ", static_cast<int32_t>(r.device.type),
                     " (0: cpu, 1: cuda)"));
  }
  if (r.device.id < 0 || r.device.type == DeviceType::kCPU) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "no device ", DeviceTypeName(r.device.type), " with id ", r.device.id,
        r.device.type == DeviceType::kCPU ? " (the cpu's id is 0)" : ""));
  }
  absl::StatusOr<device::Device*> device = devices_->Get(r.device);
  if (!device.ok()) {
    return absl::Status(device.status().code(), absl::StrCat(what, device.status().message()));
  }
  // The device path runs the all-reduce pipeline (pack, compress, reduce, unpack) and the
  // collectives without buffers; the others copy through host memory still.
  if (r.collective != Collective::kAllReduce && r.collective != Collective::kBarrier &&
      r.collective != Collective::kJoin) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, CollectiveName(r.collective), " of ", DeviceName(r.device),
        " tensors is not supported yet (all-reduce is)"));
  }
  // Memory the host cannot read travels the host-staged plane (Note [Host staging],
  // runtime/allreduce_pipeline.h).
  auto ready = (*device)->RecordEvent(r.stream);
  if (!ready.ok()) {
    return absl::Status(ready.status().code(), absl::StrCat(what, ready.status().message()));
  }
  accepted.ready = *std::move(ready);
  return accepted;
}

absl::StatusOr<std::shared_ptr<Handle>> Runtime::Impl::Enqueue(CollectiveRequest req) {
  if (req.collective == Collective::kProcessSetAdd ||
      req.collective == Collective::kProcessSetRemove) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", req.name, "': process sets change through AddProcessSet and RemoveProcessSet"));
  }
  int set_size = 0;
  if (controller_.running()) {  // else Submit says FailedPrecondition
    BRAID_ASSIGN_OR_RETURN(set_size, CheckProcessSet(req));
  }
  // Note [Process sets]: the job knows a set's tensors by their qualified names; a plan's
  // patterns match the name the caller gave.
  std::string plan_name = req.name;
  req.name = QualifiedName(req.process_set_id, req.name);
  // Checked under the controller's lock: no Shutdown or Init replaces the stage meanwhile.
  return controller_.Submit(
      std::move(req),
      [this, set_size, &plan_name](const CollectiveRequest& r) -> absl::StatusOr<Accepted> {
        BRAID_RETURN_IF_ERROR(CheckRequest(r, set_size));
        BRAID_ASSIGN_OR_RETURN(Accepted accepted, ResolveCompression(r, plan_name));
        return AcceptDevice(r, std::move(accepted));
      });
}

absl::StatusOr<int32_t> Runtime::Impl::ChangeProcessSets(CollectiveRequest req) {
  req.dtype = DataType::kUInt8;
  auto handle = controller_.Submit(
      std::move(req),
      [](const CollectiveRequest&) -> absl::StatusOr<Accepted> { return Accepted(); });
  if (!handle.ok()) return handle.status();
  BRAID_RETURN_IF_ERROR((*handle)->Wait());
  int32_t id = 0;
  if ((*handle)->output().size() == sizeof(id)) {
    std::memcpy(&id, (*handle)->output().data(), sizeof(id));
  }
  return id;
}

absl::StatusOr<int32_t> Runtime::Impl::AddProcessSet(std::vector<int> ranks, bool members_only) {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  std::sort(ranks.begin(), ranks.end());
  CollectiveRequest req;
  req.collective = Collective::kProcessSetAdd;
  req.process_set_ranks = ranks;
  req.members_only = members_only;
  absl::Status refused;
  {
    absl::MutexLock lock(&sets_mu_);
    if (members_only && SetRank(ranks, rank_) < 0) {  // pairs with no one's call
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " is not in the new set ",
                                                     RanksText(ranks)));
    }
    // The call takes its place in this rank's sequence of changes whatever happens next, so
    // that a refusal here never shifts which changes of the ranks pair (Note [Process sets]).
    req.name = members_only ? absl::StrCat("process_set.new_group.", absl::StrJoin(ranks, ","),
                                           ".", members_only_changes_[ranks]++)
                            : absl::StrCat("process_set.change.", set_changes_++);
    refused = sets_.CheckRanks(ranks);
  }
  if (!refused.ok()) {
    // This rank's own mistake, at once; the other ranks hear of it (Note [Local failures]).
    refused = absl::InvalidArgumentError(
        absl::StrCat("add_process_set on rank ", rank_, ": ", refused.message()));
    (void)controller_.ReportFailure(req.name, refused);
    return refused;
  }
  return ChangeProcessSets(std::move(req));
}

absl::Status Runtime::Impl::RemoveProcessSet(int32_t id) {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  CollectiveRequest req;
  req.collective = Collective::kProcessSetRemove;
  req.target_process_set_id = id;
  {
    absl::MutexLock lock(&sets_mu_);
    req.name = absl::StrCat("process_set.change.", set_changes_++);
  }
  return ChangeProcessSets(std::move(req)).status();
}

absl::StatusOr<std::vector<int>> Runtime::Impl::ProcessSetRanks(int32_t id) const {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  std::optional<std::vector<int>> ranks = SetRanksOf(id);
  if (!ranks.has_value()) {
    return absl::NotFoundError(absl::StrCat("process set ", id, " does not exist"));
  }
  return *std::move(ranks);
}

void Runtime::Impl::ResetProcessSets() {
  absl::MutexLock lock(&sets_mu_);
  sets_ = ProcessSetTable(size_);  // a new job has only the whole world's set
  members_only_changes_.clear();
  set_changes_ = 0;
}

std::optional<std::vector<int>> Runtime::Impl::SetRanksOf(int32_t id) const {
  absl::MutexLock lock(&sets_mu_);
  const std::vector<int>* ranks = sets_.Find(id);
  if (ranks == nullptr) return std::nullopt;
  return *ranks;
}

absl::StatusOr<std::map<int32_t, std::vector<int>>> Runtime::Impl::ProcessSets() const {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  absl::MutexLock lock(&sets_mu_);
  return sets_.sets();
}

void Runtime::Impl::ApplyProcessSetChange(const Bucket& bucket) {
  absl::Status s;
  {
    absl::MutexLock lock(&sets_mu_);
    if (bucket.collective == Collective::kProcessSetAdd) {
      if (sets_.Find(bucket.target_process_set_id) == nullptr) {  // not a members-only reuse
        s = sets_.AddAs(bucket.target_process_set_id, bucket.process_set_ranks);
      }
    } else {
      s = sets_.Remove(bucket.target_process_set_id);
    }
  }
  if (!s.ok()) LOG(ERROR) << "rank " << rank_ << ": process set change: " << s;
  if (bucket.collective == Collective::kProcessSetRemove) {
    controller_.FailProcessSet(
        bucket.target_process_set_id,
        absl::FailedPreconditionError(absl::StrCat(
            "process set ", bucket.target_process_set_id, " ",
            RanksText(bucket.process_set_ranks), " was removed by '", bucket.names[0],
            "' while this collective was pending")));
  }
}

void Runtime::Impl::BeginGroup() { controller_.BeginGroup(); }

absl::Status Runtime::Impl::EndGroup() { return controller_.EndGroup(); }

}  // namespace braid
