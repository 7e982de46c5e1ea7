// The host implementation of Device (Note [Devices]): every call runs at once on the
// calling thread, so its events are always complete and its streams are ignored.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "device/device.h"
#include "transport/reduce.h"

namespace braid::device {
namespace {

class DoneEvent : public Event {
 public:
  absl::Status Wait(absl::Duration) override { return absl::OkStatus(); }
};

// float16 / bfloat16 / float64 -> float32 (exact for the 16-bit formats).
void ToFloat32(const void* in, DataType dtype, size_t n, float* out) {
  switch (dtype) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
      transport::WidenToFloat32(out, in, n, dtype, /*divisor=*/1);
      return;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<const double*>(in)[i]);
      return;
    default:
      return;  // Convert checked the pair
  }
}

// The inverse (round to nearest even for the 16-bit formats).
void FromFloat32(const float* in, DataType dtype, size_t n, void* out) {
  switch (dtype) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
      transport::NarrowFromFloat32(out, in, n, dtype);
      return;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(out)[i] = in[i];
      return;
    default:
      return;
  }
}

class Host final : public Device {
 public:
  DeviceRef ref() const override { return DeviceRef{}; }
  bool host_accessible() const override { return true; }
  std::string identity() const override { return "host"; }

  absl::StatusOr<DeviceMemory> Allocate(size_t bytes, size_t alignment) override {
    // aligned_alloc wants a multiple of the alignment; 0 bytes still gives a unique pointer.
    const size_t rounded = std::max<size_t>((bytes + alignment - 1) / alignment, 1) * alignment;
    void* p = rounded < bytes ? nullptr : std::aligned_alloc(alignment, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
    }
    return DeviceMemory(this, p, bytes);
  }
  void Free(void* data) override { std::free(data); }

  absl::Status Copy(void* dst, const void* src, size_t bytes, Stream) override {
    if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes, Stream s) override {
    return Copy(dst, src, bytes, s);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream s) override {
    return Copy(dst, src, bytes, s);
  }
  absl::Status FillIdentity(void* dst, size_t count, DataType dtype, ReduceOp op,
                            Stream) override;
  absl::Status Convert(void* dst, DataType to, const void* src, DataType from, size_t count,
                       Stream stream) override {
    if (!Converts(to, from)) return NoConversion(to, from);
    if (to == from) return Copy(dst, src, count * DataTypeSize(to), stream);
    if (to == DataType::kFloat32) {
      ToFloat32(src, from, count, static_cast<float*>(dst));
    } else {
      FromFloat32(static_cast<const float*>(src), to, count, dst);
    }
    return absl::OkStatus();
  }
  absl::Status Reduce(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op,
                      Stream) override {
    transport::ReduceInto(inout, in, count, dtype,
                          op == ReduceOp::kAverage ? ReduceOp::kSum : op);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Event>> RecordEvent(Stream) override {
    return std::unique_ptr<Event>(new DoneEvent);
  }
  absl::Status WaitEvent(Stream, Event&) override { return absl::OkStatus(); }
  absl::Status Synchronize(Stream, absl::Duration) override { return absl::OkStatus(); }
};

absl::Status Host::FillIdentity(void* out, size_t n, DataType dtype, ReduceOp op, Stream) {
  if (n == 0) return absl::OkStatus();
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
    std::memset(out, 0, n * DataTypeSize(dtype));
    return absl::OkStatus();
  }
  auto fill = [&](auto value) {
    auto* p = static_cast<decltype(value)*>(out);
    std::fill(p, p + n, value);
    return absl::OkStatus();
  };
  auto pick = [&](auto lowest, auto highest, auto one) {
    return fill(op == ReduceOp::kMin ? highest : op == ReduceOp::kMax ? lowest : one);
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  switch (dtype) {
    case DataType::kFloat32: return pick(-kInf, kInf, 1.0f);
    case DataType::kFloat64:
      return pick(-std::numeric_limits<double>::infinity(),
                  std::numeric_limits<double>::infinity(), 1.0);
    case DataType::kFloat16:
      return pick(FloatToFloat16(-kInf), FloatToFloat16(kInf), FloatToFloat16(1.0f));
    case DataType::kBFloat16:
      return pick(FloatToBFloat16(-kInf), FloatToBFloat16(kInf), FloatToBFloat16(1.0f));
    case DataType::kInt32:
      return pick(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                  int32_t{1});
    case DataType::kInt64:
      return pick(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                  int64_t{1});
    case DataType::kUInt8:
      return pick(uint8_t{0}, std::numeric_limits<uint8_t>::max(), uint8_t{1});
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
}

}  // namespace

bool Converts(DataType to, DataType from) {
  const auto wide = [](DataType d) {
    return d == DataType::kFloat16 || d == DataType::kBFloat16 || d == DataType::kFloat64;
  };
  return to == from || (to == DataType::kFloat32 && wide(from)) ||
         (from == DataType::kFloat32 && wide(to));
}

absl::Status NoConversion(DataType to, DataType from) {
  return absl::InvalidArgumentError(
      absl::StrCat("no conversion from ", DataTypeName(from), " to ", DataTypeName(to)));
}

Device& HostDevice() {
  static Host* host = new Host;  // never destroyed: outlives every static user
  return *host;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceMemory::Reset() {
  if (device_ != nullptr && data_ != nullptr) device_->Free(data_);
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

DeviceRegistry::DeviceRegistry() {
  Add(DeviceType::kCPU, [](int32_t id) -> absl::StatusOr<Device*> {
    if (id != 0) {
      return absl::InvalidArgumentError(absl::StrCat("device id ", id, " of the cpu"));
    }
    return &HostDevice();
  });
}

absl::StatusOr<Device*> DeviceRegistry::Get(const DeviceRef& ref) const {
  auto it = factories_.find(ref.type);
  if (it == factories_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        DeviceName(ref), " tensors: this braid has no ", DeviceTypeName(ref.type),
        " device (", ref.type == DeviceType::kCUDA ? "built without CUDA, or no GPU path yet"
                                                    : "unknown device type",
        ")"));
  }
  return it->second(ref.id);
}

}  // namespace braid::device
