#include "device/cuda/cuda_device.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "device/cuda/device_kernels.h"

namespace braid::device {
namespace {

constexpr int kMaxDevices = 64;

// The error of a CUDA call on `device`, as braid's status (out of memory: ResourceExhausted).
absl::Status CudaError(int id, const char* what, cudaError_t e) {
  const std::string message = absl::StrCat("cuda:", id, ": ", what, ": ", cudaGetErrorName(e),
                                           " (", cudaGetErrorString(e), ")");
  return e == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message)
                                        : absl::InternalError(message);
}

// Makes `id` the calling thread's current device for the guard's life; status() says when it
// could not, and then nothing may run (it would run on another GPU).
class ScopedDevice {
 public:
  explicit ScopedDevice(int id) {
    cudaError_t e = cudaGetDevice(&previous_);
    if (e == cudaSuccess && previous_ != id) e = cudaSetDevice(id);
    if (e != cudaSuccess) {
      cudaGetLastError();
      status_ = CudaError(id, "making it the current device", e);
    }
    if (e != cudaSuccess || previous_ == id) previous_ = -1;
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

#define BRAID_ON_DEVICE(id)     \
  ScopedDevice on_device(id);   \
  if (!on_device.status().ok()) return on_device.status()

class CudaEvent final : public Event {
 public:
  CudaEvent(int id, cudaEvent_t e) : id_(id), event_(e) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }
  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaError(id_, "waiting for its stream", e);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "cuda:", id_, ": its stream's work did not finish within ",
            absl::FormatDuration(timeout)));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

 private:
  int id_;
  cudaEvent_t event_;
};

class Cuda final : public Device {
 public:
  explicit Cuda(int id) : id_(id) {}
  DeviceRef ref() const override { return DeviceRef{DeviceType::kCUDA, id_}; }
  bool host_accessible() const override { return false; }
  std::string identity() const override {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, id_) != cudaSuccess) {
      cudaGetLastError();
      // Unknown: a text no other device can say, so two such devices never count as one.
      return absl::StrCat("cuda:", id_, " (unknown UUID) of process ", getpid());
    }
    std::string out = "GPU-";
    for (int i = 0; i < 16; ++i) {
      absl::StrAppend(&out, absl::Hex(static_cast<unsigned char>(prop.uuid.bytes[i]),
                                      absl::kZeroPad2));
    }
    return out;
  }

  absl::StatusOr<DeviceMemory> Allocate(size_t bytes, size_t alignment) override {
    BRAID_ON_DEVICE(id_);
    void* p = nullptr;  // cudaMalloc aligns to at least 256 bytes
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the error state: later calls report their own
      return CudaError(id_, absl::StrCat("allocating ", bytes, " bytes").c_str(), e);
    }
    return DeviceMemory(this, p, bytes);
  }
  void Free(void* data) override {
    ScopedDevice on(id_);
    cudaFree(data);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes, Stream s) override {
    return Memcpy(dst, src, bytes, cudaMemcpyDeviceToDevice, s, "copying");
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes, Stream s) override {
    return Memcpy(dst, src, bytes, cudaMemcpyHostToDevice, s, "copying from the host");
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream s) override {
    return Memcpy(dst, src, bytes, cudaMemcpyDeviceToHost, s, "copying to the host");
  }
  absl::Status FillIdentity(void* dst, size_t count, DataType dtype, ReduceOp op,
                            Stream s) override {
    std::array<char, 8> identity{};  // the host's value, one element of it
    absl::Status host = HostDevice().FillIdentity(identity.data(), 1, dtype, op, nullptr);
    if (!host.ok()) return host;
    BRAID_ON_DEVICE(id_);
    return Check("filling", cuda::LaunchFillPattern(dst, count, identity.data(),
                                                    DataTypeSize(dtype), s));
  }
  absl::Status Convert(void* dst, DataType to, const void* src, DataType from, size_t count,
                       Stream s) override {
    if (!Converts(to, from)) return NoConversion(to, from);
    if (to == from) return Copy(dst, src, count * DataTypeSize(to), s);
    BRAID_ON_DEVICE(id_);
    return Check("converting", cuda::LaunchConvert(dst, to, src, from, count, s));
  }
  absl::Status Reduce(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op,
                      Stream s) override {
    BRAID_ON_DEVICE(id_);
    return Check("reducing", cuda::LaunchReduce(inout, in, count, dtype, op, s));
  }
  absl::StatusOr<std::unique_ptr<Event>> RecordEvent(Stream s) override {
    BRAID_ON_DEVICE(id_);
    cudaEvent_t e = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(id_, "creating an event", err);
    auto event = std::make_unique<CudaEvent>(id_, e);
    err = cudaEventRecord(e, static_cast<cudaStream_t>(s));
    if (err != cudaSuccess) return CudaError(id_, "recording an event", err);
    return std::unique_ptr<Event>(std::move(event));
  }
  absl::Status WaitEvent(Stream s, Event& event) override {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    if (e == nullptr) {  // another device's: only one that is done already (the host's)
      return event.Wait(absl::ZeroDuration()).ok()
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat(
                       "cuda:", id_, ": cannot make a stream wait on another device's event"));
    }
    BRAID_ON_DEVICE(id_);
    const cudaError_t err = cudaStreamWaitEvent(static_cast<cudaStream_t>(s), e->get(), 0);
    return err == cudaSuccess ? absl::OkStatus() : CudaError(id_, "waiting for an event", err);
  }
  Stream work_stream() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (work_stream_ == nullptr) {
      ScopedDevice on(id_);
      // Null (the default stream) when it cannot be made: slower, never wrong.
      if (!on.status().ok() ||
          cudaStreamCreateWithFlags(&work_stream_, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        work_stream_ = nullptr;
      }
    }
    return work_stream_;
  }
  absl::Status Synchronize(Stream s, absl::Duration timeout) override {
    absl::StatusOr<std::unique_ptr<Event>> e = RecordEvent(s);
    if (!e.ok()) return e.status();
    return (*e)->Wait(timeout);
  }

 private:
  absl::Status Memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, Stream s,
                      const char* what) {
    if (bytes == 0 || dst == src) return absl::OkStatus();
    BRAID_ON_DEVICE(id_);
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, static_cast<cudaStream_t>(s));
    return e == cudaSuccess ? absl::OkStatus() : CudaError(id_, what, e);
  }
  // The error of a launch (cudaGetLastError: it may be an earlier asynchronous failure of
  // this device, which is as fatal).
  absl::Status Check(const char* what, int e) const {
    return e == 0 ? absl::OkStatus() : CudaError(id_, what, static_cast<cudaError_t>(e));
  }

  int id_;
  std::mutex mu_;
  cudaStream_t work_stream_ = nullptr;  // never destroyed, as the device
};

}  // namespace

absl::StatusOr<Device*> CudaDevice(int32_t id, bool allow_unverified) {
  const std::string what = absl::StrCat("cuda:", id, " tensors: ");
  if (kCudaVerifiedCommit[0] == '\0' && !allow_unverified) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "braid's CUDA path has not passed its GPU check (scripts/gpu_check.sh) on a GPU "
        "yet; set BRAID_CUDA_UNVERIFIED=1 to use it anyway"));
  }
  // Without a driver the CUDA runtime says "driver version is insufficient", which points
  // the wrong way: say there is none.
  static const bool has_driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) != nullptr;
  if (!has_driver) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "no NVIDIA driver here (libcuda.so.1 cannot be loaded)"));
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        what, "no usable CUDA driver or GPU: ", cudaGetErrorName(e), " (",
        cudaGetErrorString(e), ")"));
  }
  if (id < 0 || id >= count || id >= kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "this process sees ", count, " GPU", count == 1 ? "" : "s"));
  }
  static std::mutex mu;
  static std::array<Cuda*, kMaxDevices> devices{};  // never destroyed: used until exit
  std::lock_guard<std::mutex> lock(mu);
  if (devices[id] == nullptr) devices[id] = new Cuda(id);
  return devices[id];
}

}  // namespace braid::device
