#include "compression/state_array.h"

#include <utility>

#include "common/status_macros.h"

namespace braid::compression {
namespace {

// Wide enough for any vector load of the host code and a GPU's coalesced accesses.
constexpr size_t kAlignment = 64;

absl::Status Allocate(device::Device& device, size_t count, device::DeviceMemory* memory) {
  auto allocated = device.Allocate(count * sizeof(float), kAlignment);
  if (!allocated.ok()) return allocated.status();
  *memory = std::move(*allocated);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StateArray> StateArray::Zeros(device::Device& device, size_t count) {
  StateArray a;
  a.device_ = &device;
  if (count == 0) return a;
  BRAID_RETURN_IF_ERROR(Allocate(device, count, &a.memory_));
  a.size_ = count;
  const device::Stream stream = device.work_stream();
  BRAID_RETURN_IF_ERROR(device.FillIdentity(a.data(), count, DataType::kFloat32,
                                            ReduceOp::kSum, stream));
  BRAID_RETURN_IF_ERROR(device.Synchronize(stream, kStateCopyTimeout));
  return a;
}

absl::StatusOr<StateArray> StateArray::FromHost(device::Device& device,
                                                absl::Span<const float> values) {
  StateArray a;
  a.device_ = &device;
  if (values.empty()) return a;
  BRAID_RETURN_IF_ERROR(Allocate(device, values.size(), &a.memory_));
  a.size_ = values.size();
  const device::Stream stream = device.work_stream();
  BRAID_RETURN_IF_ERROR(
      device.CopyFromHost(a.data(), values.data(), values.size() * sizeof(float), stream));
  // The host's values may go once this returns.
  BRAID_RETURN_IF_ERROR(device.Synchronize(stream, kStateCopyTimeout));
  return a;
}

absl::StatusOr<std::vector<float>> StateArray::ToHost() const {
  std::vector<float> host(size_);
  if (size_ == 0) return host;
  const device::Stream stream = device_->work_stream();
  BRAID_RETURN_IF_ERROR(device_->CopyToHost(host.data(), data(), size_ * sizeof(float), stream));
  BRAID_RETURN_IF_ERROR(device_->Synchronize(stream, kStateCopyTimeout));
  return host;
}

absl::Status StateArray::MoveTo(device::Device& device) {
  if (device_ == &device) return absl::OkStatus();
  std::vector<float> host;
  if (device_ != nullptr) {
    auto copied = ToHost();
    if (!copied.ok()) return copied.status();
    host = std::move(*copied);
  }
  auto moved = FromHost(device, host);
  if (!moved.ok()) return moved.status();
  *this = std::move(*moved);
  return absl::OkStatus();
}

absl::StatusOr<bool> StateArray::PlaceOn(device::Device& device, size_t count) {
  if (device_ != nullptr && size_ == count) {
    BRAID_RETURN_IF_ERROR(MoveTo(device));
    return true;
  }
  auto zeros = Zeros(device, count);
  if (!zeros.ok()) return zeros.status();
  *this = *std::move(zeros);
  return false;
}

}  // namespace braid::compression
