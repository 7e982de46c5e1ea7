#include "runtime/device_planes.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/nccl_communicator.h"

namespace braid {
namespace {

// What each rank tells the others at a device's first uncompressed bucket: whether it can
// run NCCL (and if not, why) and which physical GPU it is on. Fixed-size text fields, cut to
// fit (a GPU's identity is 36 characters; a reason is for a person to read).
struct Facts {
  static constexpr size_t kIdentity = 96;
  static constexpr size_t kReason = 159;
  char can_run = 0;
  char identity[kIdentity] = {};
  char reason[kReason] = {};
};
static_assert(sizeof(Facts) == 256);

// Rank 0's unique id, or why it has none.
struct IdMessage {
  static constexpr size_t kReason = 255;
  char ok = 0;
  char id[transport::NcclUniqueId::kBytes] = {};
  char reason[kReason] = {};
};

void CopyText(char* dst, size_t capacity, const std::string& text) {
  const size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string Text(const char* field, size_t capacity) {
  return std::string(field, strnlen(field, capacity));
}

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

DevicePlanes::DevicePlanes(GpuDataPlane setting, NcclProvider nccl,
                           transport::Communicator* control, absl::Duration timeout)
    : setting_(setting), nccl_(std::move(nccl)), control_(control), timeout_(timeout) {}

DevicePlanes::~DevicePlanes() = default;

absl::StatusOr<transport::Communicator*> DevicePlanes::For(device::Device& device,
                                                          bool* this_rank_only) {
  *this_rank_only = false;
  {
    absl::MutexLock lock(&mu_);
    if (decided_) return Use(device, this_rank_only);
  }
  Plane plane = Decide(device);
  if (plane.nccl != nullptr || !plane.why.empty()) LOG(INFO) << "braid: " << plane.why;
  absl::MutexLock lock(&mu_);
  if (plane.nccl != nullptr && !aborted_.ok()) plane.nccl->Abort(aborted_);
  plane_ = std::move(plane);
  plane_device_ = &device;
  decided_ = true;
  return Use(device, this_rank_only);
}

absl::StatusOr<transport::Communicator*> DevicePlanes::Use(device::Device& device,
                                                          bool* this_rank_only) {
  if (!plane_.error.ok()) {
    *this_rank_only = plane_.error_is_own;
    return plane_.error;
  }
  if (plane_.nccl == nullptr) return nullptr;
  if (&device == plane_device_) return plane_.nccl.get();
  // The peers run this bucket on their NCCL communicators: this rank cannot join them.
  *this_rank_only = true;
  return absl::FailedPreconditionError(absl::StrCat(
      DeviceName(device.ref()), " tensors: this rank's NCCL communicator is on ",
      DeviceName(plane_device_->ref()),
      " (made at the job's first uncompressed GPU all-reduce), and NCCL runs one GPU per rank: "
      "keep each process's GPU tensors on one GPU, or set BRAID_GPU_DATA_PLANE=host"));
}

bool DevicePlanes::staged() const {
  absl::MutexLock lock(&mu_);
  return decided_ && plane_.nccl == nullptr && plane_.error.ok();
}

device::Device* DevicePlanes::nccl_device() const {
  absl::MutexLock lock(&mu_);
  return decided_ && plane_.nccl != nullptr ? plane_device_ : nullptr;
}

DevicePlanes::Plane DevicePlanes::Decide(device::Device& device) {
  Plane p;
  const std::string where = DeviceName(device.ref());
  if (setting_ == GpuDataPlane::kHost) {
    return p;  // BRAID_GPU_DATA_PLANE=host: nothing to say
  }
  absl::StatusOr<transport::NcclApi*> api =
      nccl_ ? nccl_() : absl::FailedPreconditionError("no NCCL");
  std::vector<std::string> reasons;
  transport::NcclUniqueId id;
  absl::Status s = Exchange(device, api, &reasons);
  if (s.ok() && reasons.empty()) s = ShareId(api, &id, &reasons);
  if (!s.ok()) {
    p.error = absl::Status(s.code(), absl::StrCat(where, " tensors: choosing their data plane: ",
                                                  s.message()));
    return p;
  }
  if (!reasons.empty()) {
    const std::string reason = absl::StrJoin(reasons, "; ");
    if (setting_ == GpuDataPlane::kNccl) {
      p.error = absl::FailedPreconditionError(
          absl::StrCat(where, " tensors: BRAID_GPU_DATA_PLANE=nccl, but ", reason));
      return p;
    }
    p.why = absl::StrCat("rank ", control_->rank(), ": GPU all-reduces without compression go "
                         "through the host: ", reason);
    return p;
  }
  transport::NcclOptions options;
  options.timeout = timeout_;
  options.abort_reason = [this] {
    absl::MutexLock lock(&mu_);
    return aborted_;
  };
  absl::StatusOr<std::unique_ptr<transport::Communicator>> comm = transport::ConnectNccl(
      **api, id, control_->rank(), control_->size(), device.work_stream(), device, options);
  if (!comm.ok()) {
    // This rank's own (its peers may have made theirs and wait in their first call).
    p.error = absl::Status(comm.status().code(),
                           absl::StrCat(where, " tensors: ", comm.status().message()));
    p.error_is_own = true;
    return p;
  }
  p.nccl = *std::move(comm);
  p.why = absl::StrCat("rank ", control_->rank(), ": GPU all-reduces without compression go "
                       "over ", p.nccl->Describe(), " on ", where);
  return p;
}

absl::Status DevicePlanes::Exchange(device::Device& device,
                                    const absl::StatusOr<transport::NcclApi*>& api,
                                    std::vector<std::string>* reasons) {
  const int size = control_->size();
  Facts mine;
  mine.can_run = api.ok() ? 1 : 0;
  CopyText(mine.identity, Facts::kIdentity, device.identity());
  if (!api.ok()) CopyText(mine.reason, Facts::kReason, std::string(api.status().message()));
  std::vector<Facts> all(size);
  const std::vector<size_t> blocks(size, sizeof(Facts));
  BRAID_RETURN_IF_ERROR(control_->AllGather(&mine, sizeof(Facts), all.data(), blocks));
  std::vector<int> lacking;
  std::string first_reason;
  std::map<std::string, std::vector<int>> by_gpu;
  for (int r = 0; r < size; ++r) {
    if (all[r].can_run == 0) {
      if (lacking.empty()) {
        first_reason = absl::StrCat(" (rank ", r, ": ", Text(all[r].reason, Facts::kReason), ")");
      }
      lacking.push_back(r);
    }
    by_gpu[Text(all[r].identity, Facts::kIdentity)].push_back(r);
  }
  if (!lacking.empty()) {
    reasons->push_back(absl::StrCat(Ranks(lacking), " cannot run NCCL", first_reason));
  }
  for (const auto& [gpu, ranks] : by_gpu) {
    if (ranks.size() > 1) {
      reasons->push_back(absl::StrCat(Ranks(ranks), " share one GPU (", gpu,
                                      "), which NCCL cannot run"));
    }
  }
  return absl::OkStatus();
}

absl::Status DevicePlanes::ShareId(const absl::StatusOr<transport::NcclApi*>& api,
                                   transport::NcclUniqueId* id,
                                   std::vector<std::string>* reasons) {
  IdMessage message;
  if (control_->rank() == 0) {
    absl::StatusOr<transport::NcclUniqueId> made = (*api)->GetUniqueId();
    if (made.ok()) {
      message.ok = 1;
      std::memcpy(message.id, made->bytes.data(), sizeof(message.id));
    } else {
      CopyText(message.reason, IdMessage::kReason, std::string(made.status().message()));
    }
  }
  BRAID_RETURN_IF_ERROR(control_->Broadcast(&message, sizeof(message), 0));
  if (message.ok == 0) {
    reasons->push_back(absl::StrCat("rank 0 could not make the NCCL communicator's id (",
                                    Text(message.reason, IdMessage::kReason), ")"));
    return absl::OkStatus();
  }
  std::memcpy(id->bytes.data(), message.id, sizeof(message.id));
  return absl::OkStatus();
}

void DevicePlanes::Abort(const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) aborted_ = s;
  if (plane_.nccl != nullptr) plane_.nccl->Abort(s);
}

transport::TransportStats DevicePlanes::stats() const {
  absl::MutexLock lock(&mu_);
  return plane_.nccl != nullptr ? plane_.nccl->stats() : transport::TransportStats{};
}

}  // namespace braid
