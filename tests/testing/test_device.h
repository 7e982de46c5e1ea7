// A host-backed device for CPU tests of the device paths (Note [Devices], device/device.h):
// its memory is host memory and its work runs at once, but it reports itself as a GPU
// (cuda:<id> by default), so the runtime treats its tensors as device tensors (their own
// bucket, their own fusion buffer, every copy through the interface), and it counts what it
// was asked to do, so a test can see that the pipeline moved its bytes only through it.
// Scrambled (TestDevice::scrambled), its memory holds every byte XOR a key, so host code that
// reads or writes that memory directly instead of through the interface sees or leaves wrong
// values, as it would on a GPU (where it would fault): what tests of the paths for memory the
// host cannot read use.
#ifndef BRAID_TESTS_TESTING_TEST_DEVICE_H_
#define BRAID_TESTS_TESTING_TEST_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "device/device.h"

namespace braid::testing {

class TestDevice : public device::Device {
 public:
  explicit TestDevice(DeviceRef ref = {DeviceType::kCUDA, 0}) : ref_(ref) {}

  // Every Allocate fails (ResourceExhausted) while set.
  std::atomic<bool> fail_allocations{false};
  // What host_accessible() says (false: as a real GPU's memory, which the host data plane
  // cannot carry).
  std::atomic<bool> readable_from_host{true};
  // Set before the first call and never changed: the memory holds each byte XOR kScramble
  // (the interface's calls undo and redo it), and host_accessible() is false.
  std::atomic<bool> scrambled{false};
  static constexpr unsigned char kScramble = 0xA5;
  // What it was asked to do.
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> failed_allocations{0};
  std::atomic<int64_t> copied_bytes{0};     // Copy, CopyFromHost, CopyToHost
  std::atomic<int64_t> converted_bytes{0};  // Convert (bytes written)
  std::atomic<int64_t> filled_bytes{0};     // FillIdentity
  std::atomic<int64_t> events_recorded{0};
  std::atomic<int64_t> events_waited{0};    // WaitEvent
  std::atomic<int64_t> synchronizations{0};

  // Bytes the pipeline moved into or out of memory through this device.
  int64_t moved_bytes() const { return copied_bytes + converted_bytes + filled_bytes; }

  DeviceRef ref() const override { return ref_; }
  bool host_accessible() const override { return readable_from_host && !scrambled; }
  // Each test device is a GPU of its own unless a test gives two the same identity.
  std::string identity() const override {
    return shared_identity.empty() ? absl::StrCat("test-gpu@", reinterpret_cast<uintptr_t>(this))
                                   : shared_identity;
  }
  // Set before use: the identity() this device reports (two ranks on one GPU).
  std::string shared_identity;
  absl::StatusOr<device::DeviceMemory> Allocate(size_t bytes, size_t alignment) override {
    if (fail_allocations) {
      ++failed_allocations;
      return absl::ResourceExhaustedError(absl::StrCat("test device: no ", bytes, " bytes"));
    }
    ++allocations;
    auto memory = host().Allocate(bytes, alignment);
    if (!memory.ok()) return memory.status();
    return device::DeviceMemory(this, memory->release(), bytes);
  }
  void Free(void* data) override { host().Free(data); }
  absl::Status Copy(void* dst, const void* src, size_t bytes, device::Stream s) override {
    copied_bytes += static_cast<int64_t>(bytes);
    return host().Copy(dst, src, bytes, s);
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes,
                            device::Stream s) override {
    copied_bytes += static_cast<int64_t>(bytes);
    BRAID_RETURN_IF_ERROR(host().CopyFromHost(dst, src, bytes, s));
    Flip(dst, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, device::Stream s) override {
    copied_bytes += static_cast<int64_t>(bytes);
    BRAID_RETURN_IF_ERROR(host().CopyToHost(dst, src, bytes, s));
    Flip(dst, bytes);
    return absl::OkStatus();
  }
  absl::Status FillIdentity(void* dst, size_t count, DataType dtype, ReduceOp op,
                            device::Stream s) override {
    filled_bytes += static_cast<int64_t>(count * DataTypeSize(dtype));
    BRAID_RETURN_IF_ERROR(host().FillIdentity(dst, count, dtype, op, s));
    Flip(dst, count * DataTypeSize(dtype));
    return absl::OkStatus();
  }
  absl::Status Convert(void* dst, DataType to, const void* src, DataType from, size_t count,
                       device::Stream s) override {
    converted_bytes += static_cast<int64_t>(count * DataTypeSize(to));
    if (!scrambled) return host().Convert(dst, to, src, from, count, s);
    std::vector<unsigned char> plain = Plain(src, count * DataTypeSize(from));
    BRAID_RETURN_IF_ERROR(host().Convert(dst, to, plain.data(), from, count, s));
    Flip(dst, count * DataTypeSize(to));
    return absl::OkStatus();
  }
  absl::Status Reduce(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op,
                      device::Stream s) override {
    if (!scrambled) return host().Reduce(inout, in, count, dtype, op, s);
    const size_t bytes = count * DataTypeSize(dtype);
    std::vector<unsigned char> plain = Plain(in, bytes);
    Flip(inout, bytes);
    absl::Status reduced = host().Reduce(inout, plain.data(), count, dtype, op, s);
    Flip(inout, bytes);
    return reduced;
  }
  absl::StatusOr<std::unique_ptr<device::Event>> RecordEvent(device::Stream s) override {
    ++events_recorded;
    return host().RecordEvent(s);
  }
  absl::Status WaitEvent(device::Stream s, device::Event& e) override {
    ++events_waited;
    return host().WaitEvent(s, e);
  }
  absl::Status Synchronize(device::Stream s, absl::Duration timeout) override {
    ++synchronizations;
    return host().Synchronize(s, timeout);
  }

 private:
  static device::Device& host() { return device::HostDevice(); }
  // Scrambles (or unscrambles: the same) `bytes` bytes in place, when scrambled.
  void Flip(void* data, size_t bytes) const {
    if (!scrambled) return;
    auto* p = static_cast<unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) p[i] ^= kScramble;
  }
  // A plain copy of device memory.
  std::vector<unsigned char> Plain(const void* data, size_t bytes) const {
    std::vector<unsigned char> plain(bytes);
    if (bytes > 0) std::memcpy(plain.data(), data, bytes);
    Flip(plain.data(), bytes);
    return plain;
  }
  DeviceRef ref_;
};

// A registry with `device` as every CUDA device (whatever the id), besides the host.
inline std::shared_ptr<device::DeviceRegistry> RegistryWith(TestDevice* device) {
  auto registry = std::make_shared<device::DeviceRegistry>();
  registry->Add(DeviceType::kCUDA,
                [device](int32_t) -> absl::StatusOr<device::Device*> { return device; });
  return registry;
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_TEST_DEVICE_H_
