// The executor (executor.h): one agreed bucket at a time, each handle completed exactly once.
#include "runtime/executor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/process_sets.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace braid {
namespace {

// Elements per row of dim 0 (the product of the trailing dimensions).
absl::StatusOr<int64_t> RowElements(absl::Span<const int64_t> shape) {
  if (shape.empty()) return 1;
  return ShapeElements("shape", shape.subspan(1));
}

// Rows of dim 0 each rank gets in a reduce-scatter: even, the first rows % size one more.
std::vector<int64_t> EvenRows(int64_t rows, int size) {
  std::vector<int64_t> out(size, rows / size);
  for (int r = 0; r < rows % size; ++r) ++out[r];
  return out;
}

// A scalar int32 result in the handle's output: a join's last rank, a process set's id.
void SetScalarOutput(TensorEntry& e, int32_t value) {
  e.handle->set_output_shape({});
  e.handle->mutable_output().resize(sizeof(value));
  std::memcpy(e.handle->mutable_output().data(), &value, sizeof(value));
}

}  // namespace

Executor::Executor(const Parts& parts)
    : parts_(parts),
      rank_(parts.control->rank()),
      size_(parts.control->size()),
      devices_(parts.devices != nullptr ? parts.devices
                                        : std::make_shared<device::DeviceRegistry>()),
      pipeline_(parts.stage, parts.ledger) {
  pipeline_.set_pipelined_copy(parts.pipelined_copy);
  cur_ = WorldComms();
}

Executor::Comms Executor::WorldComms() const {
  return Comms{parts_.planes->For(MemoryKind::kHost), parts_.control, rank_, size_, nullptr};
}

absl::StatusOr<bool> Executor::SelectComms(const Bucket& bucket) {
  cur_ = WorldComms();
  if (bucket.process_set_id == 0) return true;
  std::optional<std::vector<int>> ranks;
  if (parts_.process_set_ranks) ranks = parts_.process_set_ranks(bucket.process_set_id);
  if (!ranks.has_value()) {
    return absl::InternalError(absl::StrCat("bucket ", bucket.id, " runs in process set ",
                                            bucket.process_set_id, ", unknown on rank ", rank_));
  }
  const int set_rank = SetRank(*ranks, rank_);
  if (set_rank < 0) return false;
  auto it = set_channels_.find(bucket.process_set_id);
  if (it == set_channels_.end() || it->second.ranks != *ranks) {
    if (!parts_.set_channels) {
      return absl::InternalError(absl::StrCat("rank ", rank_, " has no channels for process set ",
                                              bucket.process_set_id));
    }
    if (it != set_channels_.end()) set_channels_.erase(it);
    SetChannels made{*ranks, parts_.set_channels(static_cast<uint32_t>(bucket.process_set_id),
                                                 *ranks)};
    it = set_channels_.emplace(bucket.process_set_id, std::move(made)).first;
  }
  SetChannels& sc = it->second;
  cur_ = Comms{sc.channels.data.get(), sc.channels.control.get(), set_rank,
               static_cast<int>(sc.ranks.size()), &sc.ranks};
  return true;
}

void Executor::RunProcessSetChange(const Bucket& bucket) {
  if (parts_.apply_process_set_change) parts_.apply_process_set_change(bucket);
  if (bucket.collective == Collective::kProcessSetRemove) {
    if (auto it = set_channels_.find(bucket.target_process_set_id); it != set_channels_.end()) {
      removed_sets_stats_ += it->second.channels.data->stats();
      removed_sets_stats_ += it->second.channels.control->stats();
      set_channels_.erase(it);
    }
  }
  // The rank that asked for it (a members-only change runs on every rank) gets the set's id.
  for (const std::string& name : bucket.names) {
    TensorEntry* e = parts_.in_flight->Find(name);
    if (e != nullptr) SetScalarOutput(*e, bucket.target_process_set_id);
  }
  Finish(bucket.names, absl::OkStatus());
}

void Executor::Abort(const absl::Status& s) {
  // A process set's channels share the world's point-to-point layer: aborting the world's
  // aborts theirs (Note [Channels]).
  parts_.planes->ForEach([&](transport::Communicator& plane) { plane.Abort(s); });
  if (parts_.device_planes != nullptr) parts_.device_planes->Abort(s);
  parts_.control->Abort(s);
}

transport::TransportStats Executor::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status Executor::FirstTimeout(const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  if (first_timeout_.ok()) first_timeout_ = s;
  return first_timeout_;
}

bool Executor::Resolve(const Bucket& bucket, std::vector<TensorEntry*>* entries) {
  entries->reserve(bucket.names.size());
  for (const std::string& name : bucket.names) {
    TensorEntry* e = parts_.in_flight->Find(name);  // stays put: only this thread erases
    if (e == nullptr && JoinedIn(bucket)) {
      entries->push_back(nullptr);  // this rank takes part with the identity (Note [Join])
      continue;
    }
    if (e == nullptr) {
      LOG(ERROR) << "rank " << rank_ << ": coordinator scheduled '" << name
                 << "', which this rank did not submit";
      parts_.in_flight->Abort(absl::InternalError(absl::StrCat(
          "rank ", rank_, " was told to run '", name, "', which it never submitted")));
      return false;
    }
    entries->push_back(e);
  }
  return true;
}

void Executor::Run(const Bucket& bucket) {
  if (!bucket.error.ok()) {
    Finish(bucket.names, bucket.error);
    return;
  }
  if (bucket.collective == Collective::kProcessSetAdd ||
      bucket.collective == Collective::kProcessSetRemove) {
    RunProcessSetChange(bucket);  // every rank, whatever its data plane's state
    return;
  }
  absl::StatusOr<bool> member = SelectComms(bucket);
  if (!member.ok()) {
    Finish(bucket.names, member.status());
    return;
  }
  if (!*member) return;  // another set's (Note [Process sets])
  if (absl::Status poisoned = Poisoned(); !poisoned.ok()) {
    Finish(bucket.names, poisoned);  // Note [Poisoned data plane]: agreed before the abort
    return;
  }
  std::vector<TensorEntry*> entries;
  if (!Resolve(bucket, &entries)) return;
  // One timeline for the whole bucket, even if StartTimeline / StopTimeline swap it meanwhile.
  const std::shared_ptr<Timeline> timeline = parts_.timeline ? parts_.timeline() : nullptr;
  if (timeline) {
    for (const TensorEntry* e : entries) {
      if (e != nullptr) timeline->End(e->req.name, "QUEUE");
    }
  }
  absl::Status s;
  gpu_bucket_ = bucket.device_type != DeviceType::kCPU;
  nccl_candidate_ = false;
  gpu_not_run_ = false;
  if (bucket.collective == Collective::kAllReduce) {
    s = RunAllReduce(bucket, entries, timeline.get());
  } else if (entries[0] == nullptr) {
    s = RunJoined(bucket);
  } else {
    const std::string phase = absl::AsciiStrToUpper(CollectiveName(bucket.collective));
    const CollectiveRequest& r = entries[0]->req;
    if (timeline) {
      timeline->Begin(r.name, phase,
                       absl::StrCat("\"bucket\": ", bucket.id, ", \"tensors\": 1, \"bytes\": ",
                                    // Checked at enqueue: the 0 is never taken.
                                    ShapeElements("shape", r.shape).value_or(0) *
                                        DataTypeSize(r.dtype)));
    }
    s = RunCollective(*entries[0], bucket);
    if (timeline) timeline->End(r.name, phase);
  }
  s = Named(bucket, s);
  Finish(bucket.names, s);
  if (s.code() == absl::StatusCode::kDeadlineExceeded ||
      s.code() == absl::StatusCode::kResourceExhausted || gpu_not_run_) {
    Poison(s);
  }
}

absl::Status Executor::Poisoned() const {
  absl::MutexLock lock(&mu_);
  return poisoned_;
}

void Executor::Poison(const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    if (poisoned_.ok()) poisoned_ = s;
  }
  parts_.in_flight->Abort(s);  // outside mu_, a leaf: Abort calls back into Executor::Abort
}

absl::Status Executor::Named(const Bucket& bucket, const absl::Status& s) {
  if (s.code() == absl::StatusCode::kDeadlineExceeded) return DataPlaneTimeout(bucket, s);
  // The GPU planes' errors (NCCL's, the plane's choice) name no tensor: the bucket's do.
  if (s.ok() || !gpu_bucket_ || bucket.names.empty() ||
      absl::StrContains(s.message(), absl::StrCat("'", bucket.names[0], "'"))) {
    return s;
  }
  return absl::Status(s.code(), absl::StrCat(BucketNamed(bucket), ": ", s.message()));
}

absl::Status Executor::DataPlaneTimeout(const Bucket& bucket, const absl::Status& s) {
  // The communicator is poisoned from here on and repeats its first error: every later
  // bucket gets the error that names the tensors the data plane stopped at (FirstTimeout).
  return FirstTimeout(absl::DeadlineExceededError(
      absl::StrCat(BucketNamed(bucket), " timed out on the data plane: ", s.message())));
}

std::string Executor::BucketNamed(const Bucket& bucket) {
  constexpr size_t kNamed = 5;
  std::vector<std::string> quoted;
  for (size_t i = 0; i < bucket.names.size() && i < kNamed; ++i) {
    quoted.push_back(absl::StrCat("'", bucket.names[i], "'"));
  }
  std::string names = absl::StrJoin(quoted, ", ");
  if (bucket.names.size() > kNamed) {
    absl::StrAppend(&names, " and ", bucket.names.size() - kNamed, " more");
  }
  return absl::StrCat(CollectiveName(bucket.collective), " of ",
                      bucket.names.size() == 1 ? "tensor " : "tensors ", names, " (bucket ",
                      bucket.id, ")");
}

absl::Status Executor::RunJoined(const Bucket& bucket) {
  // The coordinator gives a joined rank only all-reduces and barriers (Note [Join]).
  if (bucket.collective == Collective::kBarrier) return cur_.control->Barrier();
  return absl::InternalError(absl::StrCat("rank ", rank_, " has joined and was told to run ",
                                          CollectiveName(bucket.collective), " '",
                                          bucket.names[0], "', which it never submitted"));
}

absl::StatusOr<void*> Executor::OutputFor(TensorEntry& e, size_t bytes,
                                          std::vector<int64_t> shape, bool caller_sized) {
  const CollectiveRequest& r = e.req;
  absl::StatusOr<void*> allocated = nullptr;
  if (r.allocate_output) {
    allocated = r.allocate_output(bytes, shape);
    if (!allocated.ok() || (*allocated == nullptr && bytes > 0)) {
      return NotRun(absl::ResourceExhaustedError(absl::StrCat(
          CollectiveName(r.collective), " '", r.name, "' on rank ", rank_,
          ": its output allocator failed for ", bytes, " bytes: ",
          allocated.ok() ? "it returned null" : allocated.status().message())));
    }
  }
  e.handle->set_output_shape(std::move(shape));
  if (r.allocate_output) return *allocated;
  if (r.output != nullptr && (caller_sized || r.output_capacity_bytes >= bytes)) return r.output;
  e.handle->mutable_output().resize(bytes);
  return e.handle->mutable_output().data();
}

absl::Status Executor::RunCollective(TensorEntry& e, const Bucket& bucket) {
  const CollectiveRequest& r = e.req;
  const size_t elem = DataTypeSize(r.dtype);
  BRAID_ASSIGN_OR_RETURN(const int64_t n, ShapeElements("shape", r.shape));
  switch (r.collective) {
    case Collective::kBroadcast:
    {
      if (rank_ == bucket.root_rank && r.output != r.input && n > 0) {
        std::memcpy(r.output, r.input, n * elem);
      }
      // The root is a rank of the job; the set's communicator numbers its members.
      const int root = cur_.ranks == nullptr ? bucket.root_rank
                                             : SetRank(*cur_.ranks, bucket.root_rank);
      if (root < 0) {
        return absl::InternalError(absl::StrCat("'", r.name, "': broadcast root ",
                                                bucket.root_rank, " is not in its process set"));
      }
      return HostPlane().Broadcast(r.output, n * elem, root);
    }
    case Collective::kBarrier:
      return cur_.control->Barrier();
    case Collective::kJoin: {
      // Every rank has joined (Note [Join]): the result is the rank that joined last.
      SetScalarOutput(e, bucket.last_joined_rank);
      return absl::OkStatus();
    }
    case Collective::kAllGather:
      return RunAllGather(e, bucket);
    case Collective::kReduceScatter:
      return RunReduceScatter(e);
    case Collective::kAllToAll:
      return RunAllToAll(e);
    case Collective::kAllReduce:
    case Collective::kProcessSetAdd:
    case Collective::kProcessSetRemove:
      break;  // the pipeline's; Run's
  }
  return absl::InternalError(absl::StrCat("'", r.name, "': no direct execution for ",
                                          CollectiveName(r.collective)));
}

absl::Status Executor::RunAllGather(TensorEntry& e, const Bucket& bucket) {
  const CollectiveRequest& r = e.req;
  const size_t elem = DataTypeSize(r.dtype);
  BRAID_ASSIGN_OR_RETURN(const int64_t row, RowElements(r.shape));
  std::vector<int64_t> shape = r.shape;
  const int size = cur_.size;
  if (static_cast<int>(bucket.first_dims.size()) != size) {
    return absl::InternalError(absl::StrCat("'", r.name, "': ", bucket.first_dims.size(),
                                            " first dimensions for ", size, " ranks"));
  }
  std::vector<size_t> bytes(size);
  shape[0] = 0;
  for (int p = 0; p < size; ++p) {
    bytes[p] = bucket.first_dims[p] * row * elem;
    shape[0] += bucket.first_dims[p];
  }
  BRAID_ASSIGN_OR_RETURN(void* out, OutputFor(e, shape[0] * row * elem, shape, false));
  return HostPlane().AllGather(r.input, bytes[cur_.rank], out, bytes);
}

absl::Status Executor::RunReduceScatter(TensorEntry& e) {
  const CollectiveRequest& r = e.req;
  BRAID_ASSIGN_OR_RETURN(const int64_t row, RowElements(r.shape));
  std::vector<int64_t> shape = r.shape;
  const int size = cur_.size;
  std::vector<int64_t> rows = EvenRows(r.shape[0], size);
  std::vector<size_t> counts(size);
  for (int p = 0; p < size; ++p) counts[p] = rows[p] * row;
  shape[0] = rows[cur_.rank];
  BRAID_ASSIGN_OR_RETURN(void* out, OutputFor(e, counts[cur_.rank] * DataTypeSize(r.dtype),
                                              shape, r.output != nullptr));
  return HostPlane().ReduceScatter(r.input, out, counts, r.dtype, r.op);
}

absl::Status Executor::RunAllToAll(TensorEntry& e) {
  const CollectiveRequest& r = e.req;
  const size_t elem = DataTypeSize(r.dtype);
  BRAID_ASSIGN_OR_RETURN(const int64_t row, RowElements(r.shape));
  std::vector<int64_t> shape = r.shape;
  const int size = cur_.size;
  std::vector<int64_t> send_rows = r.splits.empty() ? EvenRows(r.shape[0], size) : r.splits;
  std::vector<int64_t> recv_rows(size);
  std::vector<size_t> eight(size, sizeof(int64_t));
  // The split exchange sizes the transfer: control traffic.
  BRAID_RETURN_IF_ERROR(
      cur_.control->AllToAll(send_rows.data(), eight, recv_rows.data(), eight));
  std::vector<size_t> sb(size), rb(size);
  shape[0] = 0;
  for (int p = 0; p < size; ++p) {
    sb[p] = send_rows[p] * row * elem;
    rb[p] = recv_rows[p] * row * elem;
    shape[0] += recv_rows[p];
  }
  BRAID_ASSIGN_OR_RETURN(void* out, OutputFor(e, shape[0] * row * elem, shape, false));
  return HostPlane().AllToAll(r.input, sb, out, rb);
}

void Executor::Finish(const std::vector<std::string>& names, const absl::Status& s) {
  // This thread's: the planes' and the control channel's counters, as one rank's traffic.
  transport::TransportStats stats = parts_.control->stats();
  parts_.planes->ForEach([&](transport::Communicator& plane) { stats += plane.stats(); });
  if (parts_.device_planes != nullptr) stats += parts_.device_planes->stats();
  stats += removed_sets_stats_;
  for (const auto& [id, sc] : set_channels_) {
    stats += sc.channels.data->stats();
    stats += sc.channels.control->stats();
  }
  {
    absl::MutexLock lock(&mu_);
    stats_ = stats;
  }
  parts_.in_flight->Finish(names, s);
}

}  // namespace braid
