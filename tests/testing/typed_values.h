// Reading and writing one element of any braid dtype through double / int64, for tests that
// fill buffers with known values and compare results against references they compute.
#ifndef BRAID_TESTS_TESTING_TYPED_VALUES_H_
#define BRAID_TESTS_TESTING_TYPED_VALUES_H_

#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/half.h"

namespace braid::testing {

// Stores `v` as element i of `buf`, rounded once to the dtype (integers: truncated; the value
// must fit).
inline void WriteValue(void* buf, size_t i, DataType dt, double v) {
  switch (dt) {
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = FloatToFloat16(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
  }
}

// Stores an integer wrapped to the dtype's width (two's complement), as integer reductions
// wrap.
inline void WriteWrapped(void* buf, size_t i, DataType dt, int64_t v) {
  switch (dt) {
    case DataType::kInt32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(static_cast<uint32_t>(v));
      break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = v; break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<uint64_t>(v));
      break;
    default: WriteValue(buf, i, dt, static_cast<double>(v)); break;
  }
}

inline double ReadValue(const void* buf, size_t i, DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kFloat16: return Float16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

// True when element i of `a` and of `b` have the same bits.
inline bool SameBits(const void* a, const void* b, size_t i, DataType dt) {
  const size_t e = DataTypeSize(dt);
  return std::memcmp(static_cast<const char*>(a) + i * e, static_cast<const char*>(b) + i * e,
                     e) == 0;
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_TYPED_VALUES_H_
