// Note [Execution step]: one agreed unit of work, the same on every rank and run in the same
// order: a bucket of all-reduces (fused when it names several), another collective, or an
// error every named tensor fails with. Its producers are the coordinator's Response
// (BucketFromResponse) and the ranks' own agreement over the control channel (the response
// cache's fast path, runtime/fast_path.h); running it needs nothing from either, so whatever
// agrees on a bucket can hand it to the executor.
#ifndef BRAID_CONTROL_BUCKET_H_
#define BRAID_CONTROL_BUCKET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "proto/braid.pb.h"

namespace braid {

struct Bucket {
  int64_t id = 0;
  Collective collective = Collective::kAllReduce;
  std::vector<std::string> names;
  absl::Status error;              // not OK: every named tensor fails with it
  int root_rank = 0;               // broadcast
  std::vector<int64_t> first_dims;  // all-gather: every rank's dim 0
  // Note [Join]: ranks that joined and did not submit these tensors, and for them each
  // name's shape and the bucket's dtype, op and compression (a joined rank has no request
  // of its own to take them from).
  std::vector<int> joined_ranks;
  std::vector<std::vector<int64_t>> shapes;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::string compression;
  int last_joined_rank = -1;  // join
  // Note [Process sets]: the set whose ranks run it (0: every rank); only its members run
  // it, the others skip it. For a change of the sets, the set added or removed, and an
  // added set's ranks.
  int process_set_id = 0;
  int target_process_set_id = 0;
  std::vector<int> process_set_ranks;
  // Where the tensors are (Note [Devices], device/device.h): the type is the same on every
  // rank; the device id is this rank's own and comes with its requests.
  DeviceType device_type = DeviceType::kCPU;
  // Note [Settings changes] (runtime/step_settings.h): set, the bucket carries new settings
  // only (no names), to apply from the next step boundary; the executor never sees it.
  std::shared_ptr<const proto::SettingsChange> settings_change;
};

// The bucket that carries `msg`'s settings change, placed before its responses' buckets.
Bucket SettingsBucket(const proto::ResponseList& msg);

// The bucket a coordinator's Response describes.
Bucket BucketFromResponse(const proto::Response& response);

// The part of an all-reduce's fusion key that says where its tensors are: the device type
// and every rank's device id, so tensors on different devices (on any rank) never share a
// bucket. The same on every rank: it comes from the coordinator's response.
std::string FusionDeviceKey(const proto::Response& response);

// "allreduce", "allgather", ...; "collective#N" for a value outside the enum (a peer's
// malformed request). The one spelling of collective names in messages.
std::string CollectiveName(Collective c);
std::string CollectiveName(proto::Collective c);

}  // namespace braid

#endif  // BRAID_CONTROL_BUCKET_H_
