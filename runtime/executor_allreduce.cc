// The executor's all-reduce (executor.h): where a bucket's tensors are, which data plane and
// which compression method it runs with.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/executor.h"

namespace braid {

bool Executor::JoinedIn(const Bucket& bucket) const {
  return std::find(bucket.joined_ranks.begin(), bucket.joined_ranks.end(), rank_) !=
         bucket.joined_ranks.end();
}

absl::Status Executor::NotRun(const absl::Status& s) {
  HostPlane().Abort(s);
  if (nccl_candidate_) {
    // The peers may be in the bucket's NCCL call or in the control channel's exchange that
    // chooses its plane (Note [GPU data planes]): abort both, and end the job when the
    // bucket is done (Run), since no later collective of this rank could pair with theirs.
    Abort(s);
    gpu_not_run_ = true;
  }
  return s;
}

absl::StatusOr<BucketPlace> Executor::PlaceOf(const Bucket& bucket, const TensorEntry* own) {
  // Note [Devices]: the bucket's tensors are on one device (the coordinator fuses no
  // others); a rank that joined for all of them fills the identity on its last device of
  // the type (or device 0).
  DeviceRef where{bucket.device_type, 0};
  device::Device* nccl_device =
      parts_.device_planes != nullptr ? parts_.device_planes->nccl_device() : nullptr;
  if (own != nullptr) {
    where = own->req.device;
  } else if (nccl_device != nullptr && nccl_device->ref().type == where.type) {
    where = nccl_device->ref();  // the GPU of this rank's NCCL communicator
  } else if (auto last = last_device_.find(where.type); last != last_device_.end()) {
    where = last->second;
  }
  last_device_[where.type] = where;
  absl::StatusOr<device::Device*> found = devices_->Get(where);
  if (!found.ok()) return NotRun(found.status());
  return BucketPlace{*found, (*found)->work_stream(), parts_.device_timeout};
}

absl::Status Executor::RunAllReduce(const Bucket& bucket,
                                    const std::vector<TensorEntry*>& entries,
                                    Timeline* timeline) {
  // The bucket's kind: from this rank's own requests, else (this rank joined and submitted
  // none of them, Note [Join]) from the response.
  const compression::CompressionMethod* method = nullptr;
  DataType dtype = bucket.dtype;
  ReduceOp op = bucket.op;
  const TensorEntry* own = nullptr;
  for (const TensorEntry* e : entries) own = own != nullptr ? own : e;
  if (own != nullptr) {
    method = own->method;
    dtype = own->req.dtype;
    op = own->req.op;
  } else {
    auto resolved = parts_.stage->Resolve(bucket.compression.empty() ? "none" : bucket.compression);
    if (!resolved.ok()) return resolved.status();
    method = *resolved;
  }
  // Where its peers may be when this rank fails before the collectives (NotRun).
  nccl_candidate_ = gpu_bucket_ && MayRunOnNccl(bucket, *method) &&
                    !parts_.device_planes->staged();
  BRAID_ASSIGN_OR_RETURN(BucketPlace place, PlaceOf(bucket, own));
  std::vector<AllReduceTensor> tensors;
  tensors.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorEntry* e = entries[i];
    if (e == nullptr) {
      if (i >= bucket.shapes.size()) {
        return NotRun(absl::InternalError(absl::StrCat("bucket ", bucket.id, ": no shape for '",
                                                       bucket.names[i], "', which rank ", rank_,
                                                       " joined without submitting")));
      }
      AllReduceTensor t{bucket.names[i], bucket.shapes[i], nullptr, nullptr};
      t.joined = true;  // the pipeline packs the op's identity
      tensors.push_back(t);
      continue;
    }
    // The coordinator fuses only requests that agree on these; anything else is a bug there.
    if (e->method != method || e->req.dtype != dtype || e->req.op != op ||
        e->req.device != own->req.device) {
      return NotRun(absl::InternalError(absl::StrCat(
          "bucket ", bucket.id, " mixes '", own->req.name, "' and '", e->req.name,
          "', which do not fuse")));
    }
    tensors.push_back({e->req.name, e->req.shape, e->req.input, e->req.output, false,
                       e->req.compression_pattern});
    // braid's work waits for the caller's stream to reach the point of the enqueue.
    if (e->ready != nullptr) {
      absl::Status s = place.device->WaitEvent(place.stream, *e->ready);
      if (!s.ok()) return NotRun(s);
    }
  }
  const bool is_auto = method->parsed().method == "auto" && parts_.auto_compression != nullptr;
  if (is_auto) BRAID_RETURN_IF_ERROR(ChooseAuto(bucket, &tensors, dtype, op, &method));
  BRAID_ASSIGN_OR_RETURN(transport::Communicator* comm, PlaneOf(bucket, *method, &place));
  absl::Status s = pipeline_.Run(bucket.id, *method, dtype, op, tensors, *comm, timeline, place);
  if (is_auto) parts_.auto_compression->Ran();
  return s;
}

absl::Status Executor::ChooseAuto(const Bucket& bucket, std::vector<AllReduceTensor>* tensors,
                                  DataType dtype, ReduceOp op,
                                  const compression::CompressionMethod** method) {
  // Note [Auto compression]: `auto` runs with the method in force, per bucket.
  absl::StatusOr<const compression::CompressionMethod*> chosen =
      parts_.auto_compression->ForBucket(*tensors, dtype, op);
  if (!chosen.ok()) return NotRun(chosen.status());
  *method = *chosen;
  // Its bytes count under the method chosen, in a group that says auto chose it (Note
  // [Compression groups]); the strings outlive the bucket's run.
  auto_patterns_.clear();
  auto_patterns_.reserve(tensors->size());
  for (const AllReduceTensor& t : *tensors) {
    auto_patterns_.push_back(AutoCompressionPattern(t.pattern));
  }
  for (size_t i = 0; i < tensors->size(); ++i) (*tensors)[i].pattern = auto_patterns_[i];
  nccl_candidate_ =
      gpu_bucket_ && MayRunOnNccl(bucket, **method) && !parts_.device_planes->staged();
  return absl::OkStatus();
}

absl::StatusOr<transport::Communicator*> Executor::PlaneOf(
    const Bucket& bucket, const compression::CompressionMethod& method, BucketPlace* place) {
  // Note [GPU data planes]: an uncompressed bucket of the whole world on a GPU may travel
  // NCCL; everything else the host data plane (a GPU's staged through the host).
  if (!MayRunOnNccl(bucket, method) || place->device->host_accessible()) return &HostPlane();
  // Every rank calls this for the same bucket, and decides alike: an error of the decision
  // is every rank's, before any collective of the bucket, so no plane is aborted; but not
  // one of this rank's alone (its communicator's creation, a bucket on a GPU its
  // communicator is not on), whose peers wait in NCCL.
  bool this_rank_only = false;
  absl::StatusOr<transport::Communicator*> nccl =
      parts_.device_planes->For(*place->device, &this_rank_only);
  if (!nccl.ok()) return this_rank_only ? NotRun(nccl.status()) : nccl.status();
  if (*nccl == nullptr) return &HostPlane();
  place->device_plane = true;
  return *nccl;
}

}  // namespace braid
