#include "common/dtype.h"

#include "absl/strings/str_cat.h"

namespace braid {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
  }
  return 0;
}

absl::string_view DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown";
}

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

bool IsValidDataType(int32_t v) { return v >= 0 && v < kNumDataTypes; }
bool IsValidReduceOp(int32_t v) { return v >= 0 && v < kNumReduceOps; }

absl::Status CheckReduceOp(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kAverage && !IsFloatingPoint(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op average is defined for floating-point types only, got ",
                     DataTypeName(dtype), "; use sum and divide"));
  }
  return absl::OkStatus();
}

std::string DeviceTypeName(int32_t type) {
  switch (type) {
    case static_cast<int32_t>(DeviceType::kCPU): return "cpu";
    case static_cast<int32_t>(DeviceType::kCUDA): return "cuda";
  }
  return absl::StrCat("device#", type);
}

std::string DeviceName(const DeviceRef& device) {
  if (device.type == DeviceType::kCPU) return "cpu";
  return absl::StrCat(DeviceTypeName(device.type), ":", device.id);
}

bool IsValidDeviceType(int32_t v) {
  return v == static_cast<int32_t>(DeviceType::kCPU) ||
         v == static_cast<int32_t>(DeviceType::kCUDA);
}

}  // namespace braid
