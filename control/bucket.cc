#include "control/bucket.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid {

Bucket SettingsBucket(const proto::ResponseList& msg) {
  Bucket b;
  b.settings_change = std::make_shared<const proto::SettingsChange>(msg.settings_change());
  return b;
}

Bucket BucketFromResponse(const proto::Response& r) {
  Bucket b;
  b.id = r.bucket_id();
  b.collective = static_cast<Collective>(r.collective());
  b.names.assign(r.names().begin(), r.names().end());
  if (r.type() == proto::Response::ERROR) {
    b.error = absl::Status(static_cast<absl::StatusCode>(r.error_code()), r.error_message());
  }
  b.root_rank = r.root_rank();
  b.first_dims.assign(r.first_dims().begin(), r.first_dims().end());
  b.joined_ranks.assign(r.joined_ranks().begin(), r.joined_ranks().end());
  for (const proto::TensorShape& s : r.shapes()) {
    b.shapes.emplace_back(s.dims().begin(), s.dims().end());
  }
  b.dtype = static_cast<DataType>(r.dtype());
  b.op = static_cast<ReduceOp>(r.reduce_op());
  b.compression = r.compression();
  b.last_joined_rank = r.last_joined_rank();
  b.process_set_id = r.process_set_id();
  b.target_process_set_id = r.target_process_set_id();
  b.process_set_ranks.assign(r.process_set_ranks().begin(), r.process_set_ranks().end());
  b.device_type = static_cast<DeviceType>(r.device());
  return b;
}

std::string FusionDeviceKey(const proto::Response& r) {
  return absl::StrCat(r.device(), ":", absl::StrJoin(r.device_ids(), ","));
}

std::string CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kAllGather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kAllToAll: return "alltoall";
    case Collective::kBarrier: return "barrier";
    case Collective::kJoin: return "join";
    case Collective::kProcessSetAdd: return "add_process_set";
    case Collective::kProcessSetRemove: return "remove_process_set";
  }
  return absl::StrCat("collective#", static_cast<int>(c));
}

std::string CollectiveName(proto::Collective c) {
  return CollectiveName(static_cast<Collective>(c));
}

}  // namespace braid
