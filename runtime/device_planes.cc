#include "runtime/device_planes.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

absl::StatusOr<transport::Communicator*> DevicePlanes::For(device::Device& device) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = planes_.find(&device); it != planes_.end()) {
      if (!it->second.error.ok()) return it->second.error;
      return it->second.nccl.get();
    }
  }
  Plane plane = Decide(device);
  absl::MutexLock lock(&mu_);
  if (plane.nccl != nullptr && !aborted_.ok()) plane.nccl->Abort(aborted_);
  Plane& kept = planes_[&device] = std::move(plane);
  if (!kept.error.ok()) return kept.error;
  return kept.nccl.get();
}

DevicePlanes::Plane DevicePlanes::Decide(device::Device& device) {
  Plane p;
  const std::string where = DeviceName(device.ref());
  if (setting_ == GpuDataPlane::kHost) {
    p.why = absl::StrCat(where, ": host-staged (BRAID_GPU_DATA_PLANE=host)");
    return p;
  }
  const int rank = control_->rank();
  const int size = control_->size();

  // This rank's facts, then every rank's.
  absl::StatusOr<transport::NcclApi*> api = nccl_ ? nccl_() : absl::FailedPreconditionError("no NCCL");
  Facts mine;
  mine.can_run = api.ok() ? 1 : 0;
  CopyText(mine.identity, Facts::kIdentity, device.identity());
  if (!api.ok()) CopyText(mine.reason, Facts::kReason, std::string(api.status().message()));
  std::vector<Facts> all(size);
  const std::vector<size_t> blocks(size, sizeof(Facts));
  absl::Status s = control_->AllGather(&mine, sizeof(Facts), all.data(), blocks);
  if (!s.ok()) {
    p.error = absl::Status(s.code(), absl::StrCat(where, " tensors: choosing their data plane: ",
                                                  s.message()));
    return p;
  }
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
  std::vector<std::string> reasons;
  if (!lacking.empty()) {
    reasons.push_back(absl::StrCat(Ranks(lacking), " cannot run NCCL", first_reason));
  }
  for (const auto& [gpu, ranks] : by_gpu) {
    if (ranks.size() > 1) {
      reasons.push_back(absl::StrCat(Ranks(ranks), " share one GPU (", gpu,
                                     "), which NCCL cannot run"));
    }
  }

  // Rank 0's unique id, or why it has none, to every rank.
  IdMessage id_message;
  if (reasons.empty()) {
    if (rank == 0) {
      absl::StatusOr<transport::NcclUniqueId> id = (*api)->GetUniqueId();
      if (id.ok()) {
        id_message.ok = 1;
        std::memcpy(id_message.id, id->bytes.data(), sizeof(id_message.id));
      } else {
        CopyText(id_message.reason, IdMessage::kReason, std::string(id.status().message()));
      }
    }
    s = control_->Broadcast(&id_message, sizeof(id_message), 0);
    if (!s.ok()) {
      p.error = absl::Status(s.code(), absl::StrCat(where, " tensors: rank 0's NCCL id: ",
                                                    s.message()));
      return p;
    }
    if (id_message.ok == 0) {
      reasons.push_back(absl::StrCat("rank 0 could not make the NCCL communicator's id (",
                                     Text(id_message.reason, IdMessage::kReason), ")"));
    }
  }
  if (!reasons.empty()) {
    const std::string reason = absl::StrJoin(reasons, "; ");
    if (setting_ == GpuDataPlane::kNccl) {
      p.error = absl::FailedPreconditionError(
          absl::StrCat(where, " tensors: BRAID_GPU_DATA_PLANE=nccl, but ", reason));
      return p;
    }
    p.why = absl::StrCat(where, ": host-staged (", reason, ")");
    LOG(INFO) << "rank " << rank << ": " << where
              << " buckets without compression go through the host: " << reason;
    return p;
  }

  transport::NcclUniqueId id;
  std::memcpy(id.bytes.data(), id_message.id, sizeof(id_message.id));
  transport::NcclOptions options;
  options.timeout = timeout_;
  absl::StatusOr<std::unique_ptr<transport::Communicator>> comm =
      transport::ConnectNccl(**api, id, rank, size, device.work_stream(), device, options);
  if (!comm.ok()) {
    p.error = absl::Status(comm.status().code(),
                           absl::StrCat(where, " tensors: ", comm.status().message()));
    return p;
  }
  p.nccl = *std::move(comm);
  p.why = absl::StrCat(where, ": ", p.nccl->Describe());
  return p;
}

void DevicePlanes::Abort(const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) aborted_ = s;
  for (auto& [device, plane] : planes_) {
    if (plane.nccl != nullptr) plane.nccl->Abort(s);
  }
}

transport::TransportStats DevicePlanes::stats() const {
  absl::MutexLock lock(&mu_);
  transport::TransportStats total;
  for (const auto& [device, plane] : planes_) {
    if (plane.nccl != nullptr) total += plane.nccl->stats();
  }
  return total;
}

std::string DevicePlanes::Describe() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> parts;
  for (const auto& [device, plane] : planes_) {
    parts.push_back(plane.error.ok() ? plane.why : std::string(plane.error.message()));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace braid
