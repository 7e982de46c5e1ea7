// Note [Devices]
//   A collective's tensors are in host memory (DeviceType::kCPU) or a device's (kCUDA, a
//   device id: rank r on cuda:r is the usual placement). Requests, buckets and responses say
//   which (common/dtype.h: DeviceRef); the coordinator compares the type across ranks (a CPU
//   tensor on one rank and a CUDA one on another is InvalidArgument on every rank, naming
//   both) and fuses only tensors on the same device on every rank.
//
//   Every byte the all-reduce pipeline moves or changes outside the compressor and the data
//   plane (the fusion buffer's memory, packing, the join identity, dtype conversions,
//   unpacking) goes through the Device of the bucket's tensors: this interface, with the
//   host implementation (HostDevice) and the CUDA one (device/cuda). Its calls take a stream
//   and may complete asynchronously, in stream order, as cudaMemcpyAsync does: a caller
//   that hands the memory to something outside the stream (the data plane, the host)
//   first waits (Synchronize, or an Event). The host device runs every call at once.
//
//   The framework's stream is never blocked on the host: braid's work on a tensor is queued
//   on the device's work stream after an event recorded on the caller's stream at enqueue
//   (WaitEvent). The all-reduce pipeline then waits on the host for its device work before
//   the handle completes (the compressors and the host data plane read the memory from the
//   host); a device data plane replaces that wait with an event the caller's stream waits
//   on.
//
//   The registry maps a device type to its implementation; a type with none is refused at
//   enqueue (FailedPrecondition). Tests register a host-backed device for kCUDA, which lets
//   CPU tests drive the device paths (tests/testing/test_device.h).
#ifndef BRAID_DEVICE_DEVICE_H_
#define BRAID_DEVICE_DEVICE_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"

namespace braid::device {

// A stream of the device (a cudaStream_t for CUDA); null: the device's default stream.
using Stream = void*;

// A point in a stream's work, recorded by Device::RecordEvent.
class Event {
 public:
  virtual ~Event() = default;
  // Blocks the calling thread until the work before the event is done, at most `timeout`.
  // DeadlineExceeded when it is not done by then; the device's error when that work failed.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
};

class Device;

// Memory allocated by a Device, freed by it when this goes.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(Device* device, void* data, size_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { Reset(); }
  void Reset();
  // Gives up the memory without freeing it (the caller frees it through the device).
  void* release() {
    void* data = data_;
    device_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
    return data;
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The memory work of one device (Note [Devices]). Counts are elements of the dtype, sizes
// bytes. Every call may return before the work is done; errors of asynchronous work come
// back from a later call (Synchronize, Event::Wait). Implementations are thread-safe.
class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceRef ref() const = 0;
  // True when host code may read and write this device's memory directly (the host; the
  // host-backed test device): the host data plane can carry its tensors as they are.
  virtual bool host_accessible() const = 0;
  // The physical device, as the same text in every process that uses it and another for
  // any other device: a GPU's UUID ("GPU-" and 32 hex digits); "host" for host memory
  // (never compared). Two ranks whose devices say the same share one GPU, where NCCL cannot
  // run (Note [GPU data planes], runtime/device_planes.h).
  virtual std::string identity() const = 0;

  // `bytes` bytes aligned to `alignment` (a power of two, at most 256). ResourceExhausted,
  // naming the bytes and the device, when the device has not that much.
  virtual absl::StatusOr<DeviceMemory> Allocate(size_t bytes, size_t alignment) = 0;
  // Frees memory of Allocate (through DeviceMemory only).
  virtual void Free(void* data) = 0;

  // Copies within this device's memory; the spans may not overlap.
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  // From host memory to this device's, and back.
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes,
                                    Stream stream) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes,
                                  Stream stream) = 0;
  // Fills `count` elements with the identity of `op` (Note [Join]): zeros for sum and
  // average, the largest value for min (+inf for floating point), the lowest for max
  // (-inf), one for product.
  virtual absl::Status FillIdentity(void* dst, size_t count, DataType dtype, ReduceOp op,
                                    Stream stream) = 0;
  // dst[i] = `to`(src[i]): float32 from and to float16, bfloat16 (round to nearest even) and
  // float64, or a copy when the dtypes are equal; InvalidArgument for other pairs. `dst` may
  // equal `src` only when the dtypes are equal.
  virtual absl::Status Convert(void* dst, DataType to, const void* src, DataType from,
                               size_t count, Stream stream) = 0;
  // inout[i] = op(inout[i], in[i]); kAverage sums (the caller divides).
  virtual absl::Status Reduce(void* inout, const void* in, size_t count, DataType dtype,
                              ReduceOp op, Stream stream) = 0;

  // An event after the work queued on `stream` so far.
  virtual absl::StatusOr<std::unique_ptr<Event>> RecordEvent(Stream stream) = 0;
  // Work queued on `stream` after this call waits for `event`; the host is not blocked.
  virtual absl::Status WaitEvent(Stream stream, Event& event) = 0;
  // Blocks until the work queued on `stream` is done, at most `timeout`.
  virtual absl::Status Synchronize(Stream stream, absl::Duration timeout) = 0;

  // The stream braid queues its own work on for this device (CUDA: a non-blocking stream of
  // braid's, so it never waits on the legacy default stream's other work); null for devices
  // that run their work at once.
  virtual Stream work_stream() { return nullptr; }
};

// Whether Device::Convert takes the pair: equal dtypes, or float32 from or to float16,
// bfloat16 and float64. Every implementation refuses the others with the same
// InvalidArgument ("no conversion from X to Y").
bool Converts(DataType to, DataType from);
absl::Status NoConversion(DataType to, DataType from);

// Host memory (DeviceType::kCPU): every call runs at once on the calling thread.
Device& HostDevice();

// The devices a runtime can use: for each device type, a factory of its devices by id.
// Filled once by the composition root (or a test) before use, read-only after; Get is
// thread-safe when the factories are.
class DeviceRegistry {
 public:
  // The device of an id, owned by the factory (it outlives the registry's use). Errors: the
  // id does not name a device of the type (InvalidArgument), or it cannot be used
  // (FailedPrecondition, naming why).
  using Factory = std::function<absl::StatusOr<Device*>(int32_t id)>;
  // The host device (kCPU, id 0) is always there.
  DeviceRegistry();
  // Replaces any earlier factory of `type`.
  void Add(DeviceType type, Factory factory) { factories_[type] = std::move(factory); }
  bool Has(DeviceType type) const { return factories_.count(type) != 0; }
  // FailedPrecondition naming the device when its type has no factory here.
  absl::StatusOr<Device*> Get(const DeviceRef& ref) const;

 private:
  std::map<DeviceType, Factory> factories_;
};

// The devices of this build: the host and, when braid is built with CUDA, the GPUs (whose
// factory refuses them, FailedPrecondition saying why, until the GPU check has passed once
// or BRAID_CUDA_UNVERIFIED=1: Note [Unverified CUDA], device/cuda/cuda_device.h).
// `allow_unverified_cuda`: BRAID_CUDA_UNVERIFIED=1.
std::shared_ptr<DeviceRegistry> MakeDefaultDevices(bool allow_unverified_cuda);

}  // namespace braid::device

#endif  // BRAID_DEVICE_DEVICE_H_
