#include "tools/bench/bench_check.h"

#include <algorithm>
#include <cstring>

#include "common/half.h"

namespace braid::bench {
namespace {

// One element of `dtype` holding `value`, as raw bits in the low DataTypeSize bytes.
// `value` is an exact integer result, or for average an already divided float.
uint64_t EncodeInteger(DataType dtype, int64_t value) {
  switch (dtype) {
    case DataType::kFloat32: return FloatBits(static_cast<float>(value));
    case DataType::kFloat64: {
      double d = static_cast<double>(value);
      uint64_t u;
      std::memcpy(&u, &d, 8);
      return u;
    }
    case DataType::kFloat16: return FloatToFloat16(static_cast<float>(value));
    case DataType::kBFloat16: return FloatToBFloat16(static_cast<float>(value));
    case DataType::kInt32: return static_cast<uint32_t>(static_cast<uint64_t>(value));
    case DataType::kInt64: return static_cast<uint64_t>(value);
    case DataType::kUInt8: return static_cast<uint8_t>(static_cast<uint64_t>(value));
  }
  return 0;
}

// Average of an exact integer `sum` over `ranks`: divided in float32 (float64 for float64)
// and rounded once to the dtype, like the Communicator's sum-then-divide.
uint64_t EncodeAverage(DataType dtype, int64_t sum, int ranks) {
  if (dtype == DataType::kFloat64) {
    double d = static_cast<double>(sum) / ranks;
    uint64_t u;
    std::memcpy(&u, &d, 8);
    return u;
  }
  float f = static_cast<float>(sum) / static_cast<float>(ranks);
  switch (dtype) {
    case DataType::kFloat16: return FloatToFloat16(f);
    case DataType::kBFloat16: return FloatToBFloat16(f);
    default: return FloatBits(f);
  }
}

uint64_t LoadBits(const void* buf, size_t i, size_t elem) {
  uint64_t u = 0;
  std::memcpy(&u, static_cast<const char*>(buf) + i * elem, elem);  // little endian
  return u;
}

void StoreBits(void* buf, size_t i, size_t elem, uint64_t bits) {
  std::memcpy(static_cast<char*>(buf) + i * elem, &bits, elem);
}

// Exact reduction of the pattern over ranks, in wrapping 64-bit integer arithmetic.
int64_t ReducedPattern(int ranks, size_t index, DataType dtype, ReduceOp op) {
  uint64_t acc = static_cast<uint64_t>(PatternValue(0, index, dtype, op));
  for (int r = 1; r < ranks; ++r) {
    const int64_t v = PatternValue(r, index, dtype, op);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc += static_cast<uint64_t>(v); break;
      case ReduceOp::kProduct: acc *= static_cast<uint64_t>(v); break;
      case ReduceOp::kMin:
        acc = static_cast<uint64_t>(std::min(static_cast<int64_t>(acc), v));
        break;
      case ReduceOp::kMax:
        acc = static_cast<uint64_t>(std::max(static_cast<int64_t>(acc), v));
        break;
    }
  }
  return static_cast<int64_t>(acc);
}

}  // namespace

int64_t PatternValue(int rank, size_t index, DataType dtype, ReduceOp op) {
  const bool is_unsigned = dtype == DataType::kUInt8;
  if (op == ReduceOp::kProduct) {
    static constexpr int64_t kSigned[4] = {1, 2, -1, 1};
    static constexpr int64_t kUnsigned[4] = {1, 2, 1, 1};
    const size_t k = (index * 3 + static_cast<size_t>(rank)) % 4;
    return is_unsigned ? kUnsigned[k] : kSigned[k];
  }
  // 7 and 13 are coprime with 17, so neighbouring elements and neighbouring ranks differ.
  const int64_t k = static_cast<int64_t>((index * 7 + static_cast<size_t>(rank) * 13 + 3) % 17);
  return is_unsigned ? k : k - 8;
}

void FillPattern(void* buf, size_t count, DataType dtype, ReduceOp op, int rank,
                 size_t first_index) {
  const size_t elem = DataTypeSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    StoreBits(buf, i, elem, EncodeInteger(dtype, PatternValue(rank, first_index + i, dtype, op)));
  }
}

size_t CountWrongReduced(const void* buf, size_t count, DataType dtype, ReduceOp op, int ranks,
                         size_t first_index) {
  const size_t elem = DataTypeSize(dtype);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t exact = ReducedPattern(ranks, first_index + i, dtype, op);
    const uint64_t want =
        op == ReduceOp::kAverage ? EncodeAverage(dtype, exact, ranks) : EncodeInteger(dtype, exact);
    if (LoadBits(buf, i, elem) != want) ++wrong;
  }
  return wrong;
}

size_t CountWrongCopied(const void* buf, size_t count, DataType dtype, ReduceOp op, int rank,
                        size_t first_index) {
  const size_t elem = DataTypeSize(dtype);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t want = EncodeInteger(dtype, PatternValue(rank, first_index + i, dtype, op));
    if (LoadBits(buf, i, elem) != want) ++wrong;
  }
  return wrong;
}

}  // namespace braid::bench
