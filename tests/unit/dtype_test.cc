// common/dtype: names, sizes, wire values, and which (dtype, op) pairs are accepted.
#include "common/dtype.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/status/status.h"

namespace braid {
namespace {

struct TypeInfo {
  DataType dtype;
  int32_t wire;
  size_t size;
  const char* name;
  bool floating;
};

constexpr TypeInfo kTypes[] = {
    {DataType::kFloat32, 0, 4, "float32", true},  {DataType::kFloat64, 1, 8, "float64", true},
    {DataType::kFloat16, 2, 2, "float16", true},  {DataType::kBFloat16, 3, 2, "bfloat16", true},
    {DataType::kInt32, 4, 4, "int32", false},     {DataType::kInt64, 5, 8, "int64", false},
    {DataType::kUInt8, 6, 1, "uint8", false},
};

TEST(DataType, NamesSizesAndWireValues) {
  static_assert(kNumDataTypes == 7);
  for (const TypeInfo& t : kTypes) {
    EXPECT_EQ(static_cast<int32_t>(t.dtype), t.wire) << t.name;
    EXPECT_EQ(DataTypeSize(t.dtype), t.size) << t.name;
    EXPECT_EQ(std::string(DataTypeName(t.dtype)), t.name);
    EXPECT_EQ(IsFloatingPoint(t.dtype), t.floating) << t.name;
    EXPECT_TRUE(IsValidDataType(t.wire));
  }
  EXPECT_FALSE(IsValidDataType(-1));
  EXPECT_FALSE(IsValidDataType(7));
  EXPECT_EQ(DataTypeSize(static_cast<DataType>(42)), 0u);
  EXPECT_EQ(std::string(DataTypeName(static_cast<DataType>(42))), "unknown");
}

TEST(ReduceOp, NamesAndWireValues) {
  static_assert(kNumReduceOps == 5);
  const std::pair<ReduceOp, const char*> ops[] = {{ReduceOp::kSum, "sum"},
                                                  {ReduceOp::kAverage, "average"},
                                                  {ReduceOp::kMin, "min"},
                                                  {ReduceOp::kMax, "max"},
                                                  {ReduceOp::kProduct, "product"}};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(static_cast<int32_t>(ops[i].first), i);
    EXPECT_EQ(std::string(ReduceOpName(ops[i].first)), ops[i].second);
    EXPECT_TRUE(IsValidReduceOp(i));
  }
  EXPECT_FALSE(IsValidReduceOp(-1));
  EXPECT_FALSE(IsValidReduceOp(5));
  EXPECT_EQ(std::string(ReduceOpName(static_cast<ReduceOp>(9))), "unknown");
}

TEST(CheckReduceOp, AverageOfIntegerIsInvalid) {
  const absl::Status s = CheckReduceOp(DataType::kInt32, ReduceOp::kAverage);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()),
            "reduce op average is defined for floating-point types only, got int32; use sum "
            "and divide");
  EXPECT_EQ(std::string(CheckReduceOp(DataType::kUInt8, ReduceOp::kAverage).message()),
            "reduce op average is defined for floating-point types only, got uint8; use sum "
            "and divide");
}

TEST(CheckReduceOp, EveryOtherPairIsValid) {
  for (const TypeInfo& t : kTypes) {
    for (int op = 0; op < kNumReduceOps; ++op) {
      const absl::Status s = CheckReduceOp(t.dtype, static_cast<ReduceOp>(op));
      const bool invalid = !t.floating && static_cast<ReduceOp>(op) == ReduceOp::kAverage;
      EXPECT_EQ(s.ok(), !invalid) << t.name << " op " << op << ": " << s;
    }
  }
}

}  // namespace
}  // namespace braid
