// Element types and reduction operators shared by every layer of braid.
#ifndef BRAID_COMMON_DTYPE_H_
#define BRAID_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace braid {

// Values are part of the wire protocol and the C ABI: never renumber.
enum class DataType : int32_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,   // IEEE 754 binary16
  kBFloat16 = 3,  // bfloat16: the upper 16 bits of a float32
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};
inline constexpr int kNumDataTypes = 7;

// Values are part of the wire protocol and the C ABI: never renumber.
enum class ReduceOp : int32_t {
  kSum = 0,
  kAverage = 1,  // sum / world size; floating-point types only
  kMin = 2,
  kMax = 3,
  kProduct = 4,
};
inline constexpr int kNumReduceOps = 5;

// Values are part of the wire protocol and the C ABI: never renumber.
enum class Collective : int32_t {
  kAllReduce = 0,
  kAllGather = 1,
  kBroadcast = 2,
  kReduceScatter = 3,
  kAllToAll = 4,
  kBarrier = 5,
  // Note [Join] (coordinator/negotiation.h): join() for uneven inputs, as Horovod's. Needs
  // only a name, the same on every rank. Until every rank has joined, this rank takes part
  // in the others' all-reduces with the op's identity (zeros for sum and average; an
  // average still divides by the whole world size) and in their barriers; their other
  // collectives fail with FailedPrecondition naming the joined ranks. Completes once every
  // rank has joined; Handle::output() then holds the rank that joined last (one int32).
  kJoin = 6,
  // Note [Process sets] (control/process_sets.h): a change of the job's process sets, made
  // through Runtime::AddProcessSet / RemoveProcessSet, never enqueued directly.
  kProcessSetAdd = 7,
  kProcessSetRemove = 8,
};

// Where a tensor's memory is. Values are part of the wire protocol (proto Device) and the C
// ABI (braid_*_opts.device_type): never renumber.
enum class DeviceType : int32_t {
  kCPU = 0,   // host memory
  kCUDA = 1,  // an NVIDIA GPU's memory; the device id picks the GPU
};

// A device: its type and, for a GPU, which one (0 for the CPU).
struct DeviceRef {
  DeviceType type = DeviceType::kCPU;
  int32_t id = 0;
  friend bool operator==(const DeviceRef& a, const DeviceRef& b) {
    return a.type == b.type && a.id == b.id;
  }
  friend bool operator!=(const DeviceRef& a, const DeviceRef& b) { return !(a == b); }
  friend bool operator<(const DeviceRef& a, const DeviceRef& b) {
    return a.type != b.type ? a.type < b.type : a.id < b.id;
  }
};

// "cpu", "cuda"; "device#N" for a value outside the enum (from the wire or C).
std::string DeviceTypeName(int32_t type);
inline std::string DeviceTypeName(DeviceType type) {
  return DeviceTypeName(static_cast<int32_t>(type));
}
// "cpu", "cuda:1": as torch spells a device.
std::string DeviceName(const DeviceRef& device);
bool IsValidDeviceType(int32_t v);

// Size of one element in bytes.
size_t DataTypeSize(DataType dtype);
// "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8".
absl::string_view DataTypeName(DataType dtype);
// "sum", "average", "min", "max", "product".
absl::string_view ReduceOpName(ReduceOp op);
bool IsFloatingPoint(DataType dtype);
// True when `v` names a DataType / ReduceOp enumerator (for values from the wire or C).
bool IsValidDataType(int32_t v);
bool IsValidReduceOp(int32_t v);

// OK, or InvalidArgument when `op` is not defined for `dtype` (average of an integer type).
absl::Status CheckReduceOp(DataType dtype, ReduceOp op);

}  // namespace braid

#endif  // BRAID_COMMON_DTYPE_H_
