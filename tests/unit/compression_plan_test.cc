// Compression plans (Note [Compression plans], compression/compression_plan.h): parsing,
// the patterns' precedence, the defaults, and the minimum-size and minimum-rate rule.
#include "compression/compression_plan.h"

#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace braid::compression {
namespace {

constexpr DataType kF32 = DataType::kFloat32;
constexpr ReduceOp kAvg = ReduceOp::kAverage;

CompressionPlan Plan(const std::string& text) {
  absl::StatusOr<CompressionPlan> plan = CompressionPlan::Parse(text);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : CompressionPlan();
}

std::string SpecFor(const CompressionPlan& plan, const std::string& name,
                    std::vector<int64_t> shape, DataType dtype = kF32, ReduceOp op = kAvg) {
  return plan.For(name, shape, dtype, op).spec;
}

TEST(CompressionPlanTest, TheFirstMatchingPatternInTheOrderWrittenWins) {
  const CompressionPlan plan = Plan(
      R"({"*.bias": "none", "embedding.*": "scalecomp:ratio=50", "*": "powersgd:rank=4"})");
  EXPECT_EQ(SpecFor(plan, "layer1.bias", {4096}), "none");
  EXPECT_EQ(plan.For("layer1.bias", std::vector<int64_t>{4096}, kF32, kAvg).pattern, "*.bias");
  EXPECT_EQ(SpecFor(plan, "embedding.weight", {1000, 64}), "scalecomp:ratio=50");
  EXPECT_EQ(SpecFor(plan, "fc.weight", {512, 512}), "powersgd:rank=4");
  // The order is the text's, not the keys' sorted order ("*" sorts before "z*").
  const CompressionPlan written = Plan(R"({"z*": "fp16", "*": "fp4"})");
  EXPECT_EQ(SpecFor(written, "zeta.weight", {4096}), "fp16");
  EXPECT_EQ(SpecFor(written, "alpha.weight", {4096}), "fp4");
  // `*` crosses dots; `?` is one character; sets work; the whole name must match.
  const CompressionPlan globs = Plan(R"({"layer?.w*": "fp16", "head.[ab]": "fp4"})");
  EXPECT_EQ(SpecFor(globs, "layer1.weight.grad", {4096}), "fp16");
  EXPECT_EQ(SpecFor(globs, "layer12.weight", {4096}), "none");
  EXPECT_EQ(SpecFor(globs, "head.b", {4096}), "fp4");
  EXPECT_EQ(SpecFor(globs, "head.c", {4096}), "none");
  EXPECT_EQ(SpecFor(globs, "xlayer1.w", {4096}), "none");
}

// Note [Plan globs]: Python's fnmatch syntax, the same on every rank whatever its locale.
TEST(CompressionPlanTest, GlobsArePythonsFnmatchOnCodePoints) {
  const CompressionPlan plan = Plan(
      R"({"a[!0-9]": "fp16", "b[]x]": "bf16", "c\\d": "fp4", "é?": "int4", "*": "none"})");
  EXPECT_EQ(SpecFor(plan, "ax", {4096}), "fp16");
  EXPECT_EQ(SpecFor(plan, "a7", {4096}), "none");
  EXPECT_EQ(SpecFor(plan, "b]", {4096}), "bf16");  // a ']' first in a set is literal
  EXPECT_EQ(SpecFor(plan, "bx", {4096}), "bf16");
  EXPECT_EQ(SpecFor(plan, "c\\d", {4096}), "fp4");  // no escapes: the backslash is literal
  EXPECT_EQ(SpecFor(plan, "cd", {4096}), "none");
  // `?` is one character, however many bytes: "é" and "ü" are two bytes each in UTF-8.
  EXPECT_EQ(SpecFor(plan, "\xc3\xa9\xc3\xbc", {4096}), "int4");
  EXPECT_EQ(SpecFor(plan, "\xc3\xa9x", {4096}), "int4");
  EXPECT_EQ(SpecFor(plan, "\xc3\xa9xy", {4096}), "none");
  // Backtracking to the last `*`.
  const CompressionPlan stars = Plan(R"({"*.w*.b": "fp16"})");
  EXPECT_EQ(SpecFor(stars, "l1.wx.wy.b", {4096}), "fp16");
  EXPECT_EQ(SpecFor(stars, "l1.wx.wy.c", {4096}), "none");
}

TEST(CompressionPlanTest, ATensorNoPatternMatchesIsNotCompressed) {
  const CompressionPlan plan = Plan(R"({"conv*": "fp4"})");
  const PlanChoice c = plan.For("fc.weight", std::vector<int64_t>{4096}, kF32, kAvg);
  EXPECT_EQ(c.spec, "none");
  EXPECT_EQ(c.pattern, "");
  EXPECT_EQ(c.skipped, "");
}

TEST(CompressionPlanTest, SpecsAreCanonicalAndTheOptionsExplicit) {
  const CompressionPlan plan = Plan(R"({"a*": "fp4:chunk=128", "*": "powersgd"})");
  EXPECT_EQ(SpecFor(plan, "a.weight", {4096}), "fp4");
  EXPECT_EQ(plan.canonical(),
            R"({"a*":"fp4","*":"powersgd","$min_elements":1024,"$min_compression_rate":2.0})");
  EXPECT_EQ(Plan(plan.canonical()).canonical(), plan.canonical());
}

// The rule (Note [Compression plans]): fewer than $min_elements elements, an estimated rate
// below $min_compression_rate, or a method that does not apply: uncompressed, saying why.
TEST(CompressionPlanTest, TensorsTooSmallOrTooFlatForTheirMethodGoUncompressed) {
  const CompressionPlan plan = Plan(R"({"*": "powersgd:rank=4"})");
  PlanChoice c = plan.For("bias", std::vector<int64_t>{1023}, kF32, kAvg);
  EXPECT_EQ(c.spec, "none");
  EXPECT_EQ(c.pattern, "*");
  EXPECT_EQ(c.skipped, "1023 elements, fewer than $min_elements 1024");
  EXPECT_EQ(SpecFor(plan, "w", {1024, 1024}), "powersgd:rank=4");
  // A vector: PowerSGD sends it as it is (rate 1).
  c = plan.For("norm", std::vector<int64_t>{4096}, kF32, kAvg);
  EXPECT_EQ(c.spec, "none");
  EXPECT_EQ(c.skipped, "powersgd:rank=4's estimated rate 1 is below $min_compression_rate 2");
  // 16 x 256: 4096 / (272 * 4) = 3.76 pays; 8 x 512 with rank 4: 4096 / 2080 = 1.97 does not.
  EXPECT_EQ(SpecFor(plan, "w", {16, 256}), "powersgd:rank=4");
  EXPECT_EQ(SpecFor(plan, "w", {8, 512}), "none");
  // P and Q travel in float32: a bfloat16 16 x 256 gains half as much, 1.88.
  EXPECT_EQ(SpecFor(plan, "w", {16, 256}, DataType::kBFloat16), "none");
  // fp16 of a float16 tensor saves nothing; of a float32 tensor, half.
  const CompressionPlan half = Plan(R"({"*": "fp16"})");
  EXPECT_EQ(SpecFor(half, "w", {4096}, DataType::kFloat16), "none");
  EXPECT_EQ(SpecFor(half, "w", {4096}), "fp16");
  // Integers and other ops: the method does not apply.
  c = half.For("steps", std::vector<int64_t>{4096}, DataType::kInt32, kAvg);
  EXPECT_EQ(c.spec, "none");
  EXPECT_EQ(c.skipped, "fp16 does not apply to int32 / average");
  EXPECT_EQ(SpecFor(half, "w", {4096}, kF32, ReduceOp::kMax), "none");
}

TEST(CompressionPlanTest, TheRuleIsTunedByTheDollarOptions) {
  const CompressionPlan plan =
      Plan(R"({"$min_elements": 0, "$min_compression_rate": 1, "*": "powersgd:rank=4"})");
  EXPECT_EQ(plan.min_elements(), 0);
  EXPECT_EQ(plan.min_compression_rate(), 1.0);
  EXPECT_EQ(SpecFor(plan, "w", {8, 512}), "powersgd:rank=4");  // rate 1.97 >= 1
  EXPECT_EQ(SpecFor(plan, "tiny", {4, 4}), "none");            // 16 / 32 = 0.5 < 1
  const CompressionPlan strict = Plan(R"({"$min_compression_rate": 8, "*": "fp4"})");
  EXPECT_EQ(SpecFor(strict, "w", {4096}), "none");  // 32 / 4.25 = 7.5
  EXPECT_EQ(SpecFor(strict, "w", {4096}, DataType::kFloat64), "fp4");  // 15.1
}

TEST(CompressionPlanTest, EstimatedRates) {
  const auto spec = [](const std::string& s) { return *ParseCompressionSpec(s); };
  const std::vector<int64_t> vec = {4096}, mat = {100, 300};
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("none"), vec, kF32), 1.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("bf16"), vec, kF32), 2.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("fp4"), vec, kF32), 32.0 / 4.25);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("int4:chunk=32"), vec, kF32), 32.0 / 5.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("powersgd:rank=2"), mat, kF32), 30000.0 / 800.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("powersgd:rank=2"), mat, DataType::kFloat16),
                   15000.0 / 800.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("powersgd:rank=2"), vec, kF32), 1.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("topk:ratio=100"), vec, kF32), 50.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("randomk:ratio=100"), vec, kF32), 100.0);
  EXPECT_DOUBLE_EQ(EstimatedRate(spec("scalecomp:ratio=10"), vec, kF32), 5.0);
}

TEST(CompressionPlanTest, BadPlansAreRefusedNamingTheKey) {
  const auto error = [](const std::string& text) {
    absl::StatusOr<CompressionPlan> plan = CompressionPlan::Parse(text);
    EXPECT_FALSE(plan.ok()) << text;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << text;
    return std::string(plan.status().message());
  };
  EXPECT_TRUE(absl::StartsWith(error("{\"*\": "), "compression plan: not JSON: "))
      << error("{\"*\": ");
  EXPECT_TRUE(absl::StrContains(error("{\"*\": "), "column 7")) << "where: " << error("{\"*\": ");
  EXPECT_EQ(error(R"({"*": "fp4", "*.bias": "none", "*": "powersgd"})"),
            "compression plan, key '*': given twice (the first match wins: keep one)");
  EXPECT_EQ(error(R"({"layer[12.w": "fp4"})"),
            "compression plan, key 'layer[12.w': the set at character 6 has no closing ']'");
  EXPECT_TRUE(absl::StartsWith(error("[\"fp4\"]"), "a compression plan must be a JSON object"));
  EXPECT_EQ(error(R"({"*": 4})"), "compression plan, key '*': its spec must be a string");
  EXPECT_EQ(error(R"({"": "fp4"})"), "compression plan, key '': empty pattern");
  EXPECT_TRUE(absl::StartsWith(error(R"({"conv*": "fp5"})"),
                               "compression plan, key 'conv*': compression 'fp5': unknown method"))
      << error(R"({"conv*": "fp5"})");
  EXPECT_EQ(error(R"({"$min_rate": 2})"),
            "compression plan, key '$min_rate': unknown option (the options are $min_elements "
            "and $min_compression_rate)");
  EXPECT_TRUE(absl::StrContains(error(R"({"$min_compression_rate": 0.5})"), "out of range"));
  EXPECT_TRUE(absl::StrContains(error(R"({"$min_elements": 1.5})"), "out of range"));
  EXPECT_EQ(error(R"({"$min_elements": "10"})"),
            "compression plan, key '$min_elements': must be a number");
}

TEST(CompressionPlanTest, IsPlanTellsAPlanFromASpec) {
  EXPECT_TRUE(CompressionPlan::IsPlan(R"(  {"*": "fp4"})"));
  EXPECT_FALSE(CompressionPlan::IsPlan("fp4:ef=1"));
  EXPECT_FALSE(CompressionPlan::IsPlan(""));
}

}  // namespace
}  // namespace braid::compression
