// What every compression method does with NaN, infinities and values near its format's
// limits, as docs/compression.md's table "Non-finite values and the formats' limits" states: an
// average over 2 ranks (threads on the in-process transport, every algorithm real), each
// case checked on both ranks, which must agree bit for bit.
//  - fp16 / bf16: NaN and inf pass through element-wise; a value whose x/n leaves the
//    format becomes ±inf (NaN when both signs meet); an average that fits is returned;
//  - fp4 / int4: a NaN or inf anywhere in a 128-element chunk on any rank makes that chunk
//    NaN (and only that chunk); fp4 holds magnitudes up to 2^127 (beyond, no power-of-two
//    scale exists: the chunk is NaN); int4 up to float32's maximum;
//  - powersgd and the sparsifiers: a NaN or inf fails the step on every rank with
//    InvalidArgument naming the tensor and the rank; PowerSGD also fails when its sums
//    overflow; the sparsifiers' float32 sums overflow to inf as float32's do (an average
//    divides the sum), like an uncompressed float32 all-reduce.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/stage.h"
#include "gtest/gtest.h"
#include "tests/testing/local_world.h"

namespace braid::compression {
namespace {

constexpr size_t kCount = 256;  // two fp4 / int4 chunks of 128
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
const float kMax = std::numeric_limits<float>::max();

struct Outcome {
  absl::Status status;
  std::vector<float> result;  // rank 0's (rank 1's must be the same bits)
};

// The average over 2 ranks of `r0` / `r1` (kCount elements, as a 16 x 16 matrix) with
// `spec`; "none" is the uncompressed float32 all-reduce.
Outcome Average(const std::string& spec, const std::vector<float>& r0,
                const std::vector<float>& r1) {
  std::vector<std::vector<float>> out(2);
  std::vector<absl::Status> status(2);
  transport::CollectiveOptions o;
  o.timeout = absl::Seconds(30);
  braid::testing::RunLocalWorld(2, o, [&](int rank, transport::Communicator& comm) {
    std::vector<float> d = rank == 0 ? r0 : r1;
    if (spec == "none") {
      status[rank] = comm.AllReduce(d.data(), d.data(), d.size(), DataType::kFloat32,
                                    ReduceOp::kAverage);
    } else {
      CompressionStage stage({});
      auto method = stage.Resolve(spec);
      ASSERT_TRUE(method.ok()) << method.status();
      const std::vector<int64_t> shape = {16, 16};
      TensorView v{"t", shape, d.data(), d.size()};
      status[rank] = stage.Reduce(**method, {&v, 1}, ReduceOp::kAverage, comm);
    }
    out[rank] = std::move(d);
  });
  EXPECT_EQ(status[0].code(), status[1].code()) << spec;
  if (status[0].ok()) {
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), kCount * 4)) << spec << ": ranks differ";
  }
  return {status[0], out[0]};
}

std::vector<float> Filled(float v) { return std::vector<float>(kCount, v); }
std::vector<float> Ramp() {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = 1.0f + static_cast<float>(i % 7);
  return v;
}
std::vector<float> With(std::vector<float> v, size_t i, float x) {
  v[i] = x;
  return v;
}

const char* const kElementwise[] = {"none", "fp16", "bf16"};
const char* const kChunked[] = {"fp4", "int4"};
const char* const kFailing[] = {"powersgd", "scalecomp:ratio=4", "topk:ratio=4",
                                "randomk:ratio=4"};

// A NaN or inf on one rank: element-wise methods keep it in its element, chunked methods
// spread it over its chunk (NaN), the others fail the step naming the tensor and the rank.
TEST(CompressionLimitsTest, NaNAndInfinityOnOneRank) {
  for (float bad : {kNaN, kInf}) {
    const std::vector<float> r0 = Ramp(), r1 = With(Ramp(), 5, bad);
    for (const char* spec : kElementwise) {
      Outcome o = Average(spec, r0, r1);
      ASSERT_TRUE(o.status.ok()) << spec << ": " << o.status;
      for (size_t i = 0; i < kCount; ++i) {
        if (i == 5) {
          EXPECT_TRUE(std::isnan(bad) ? std::isnan(o.result[i]) : o.result[i] == kInf)
              << spec << " " << bad << " -> " << o.result[i];
        } else {
          EXPECT_EQ(o.result[i], r0[i]) << spec << " [" << i << "]";
        }
      }
    }
    for (const char* spec : kChunked) {
      Outcome o = Average(spec, r0, r1);
      ASSERT_TRUE(o.status.ok()) << spec << ": " << o.status;
      for (size_t i = 0; i < kCount; ++i) {
        EXPECT_EQ(std::isnan(o.result[i]), i < 128) << spec << " " << bad << " [" << i << "]";
      }
    }
    for (const char* spec : kFailing) {
      Outcome o = Average(spec, r0, r1);
      EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument) << spec << " " << bad;
      EXPECT_NE(o.status.message().find("'t'"), std::string::npos) << o.status;
      EXPECT_NE(o.status.message().find("rank"), std::string::npos) << o.status;
    }
  }
}

// Each format's edge: its largest value averages to itself; beyond it the result is
// non-finite (or an error), never a silently clipped finite value.
TEST(CompressionLimitsTest, ValuesNearEachFormatsLimits) {
  struct Case {
    const char* spec;
    float r0, r1;
    float want;  // NaN: a NaN; otherwise the value (within `rel`)
    float rel;
  };
  const Case cases[] = {
      {"none", 0x1p127f, 0x1p127f, kInf, 0},  // float32 sums, then divides: 2^128 overflows
      {"none", kMax, -kMax, 0.0f, 0},
      {"fp16", 65504.0f, 65504.0f, 65504.0f, 0},  // pre-divided, summed in float32
      {"fp16", 70000.0f, 140000.0f, kInf, 0},     // the mean 105000 is beyond 65504
      {"fp16", 1e30f, -1e30f, kNaN, 0},           // x/n beyond the format: +inf + -inf
      {"bf16", 3e38f, 3e38f, 3e38f, 1.0f / 256},
      {"bf16", kMax, kMax, kInf, 0},              // FLT_MAX is beyond bfloat16's 3.39e38
      {"fp4", 0x1p127f, 0x1p127f, 0x1p127f, 0},   // a power of two: exact
      {"fp4", 3e38f, 3e38f, kNaN, 0},             // above 2^127: no scale
      {"int4", kMax, kMax, kMax, 1e-6f},  // s = max/7, decoded 7·s: one rounding each
      {"int4", 65504.0f, 65504.0f, 65504.0f, 1e-6f},
      {"powersgd", 65504.0f, 65504.0f, 65504.0f, 1e-6f},
      {"scalecomp:ratio=4", 0x1p127f, 0x1p127f, kInf, 0},  // float32 sums overflow
      {"randomk:ratio=4", 0x1p127f, 0x1p127f, kInf, 0},
      {"topk:ratio=4", 0x1p127f, 0x1p127f, 0x1p127f, 0},
  };
  for (const Case& c : cases) {
    Outcome o = Average(c.spec, Filled(c.r0), Filled(c.r1));
    const std::string what = absl::StrCat(c.spec, " of ", c.r0, " and ", c.r1);
    ASSERT_TRUE(o.status.ok()) << what << ": " << o.status;
    // The sparsifiers send k = 64 of 256 elements: check the ones they sent.
    size_t checked = 0;
    for (float got : o.result) {
      if (got == 0.0f && c.want != 0.0f && std::string(c.spec).find("ratio") != std::string::npos) {
        continue;
      }
      ++checked;
      if (std::isnan(c.want)) {
        EXPECT_TRUE(std::isnan(got)) << what << " -> " << got;
      } else if (std::isinf(c.want) || c.rel == 0) {
        EXPECT_EQ(got, c.want) << what;
      } else {
        EXPECT_NEAR(got, c.want, c.rel * std::fabs(c.want)) << what;
      }
    }
    EXPECT_GE(checked, 64u) << what;
  }
  // PowerSGD's sums overflow: the step fails on every rank instead of returning inf.
  Outcome p = Average("powersgd", Filled(0x1p127f), Filled(0x1p127f));
  EXPECT_EQ(p.status.code(), absl::StatusCode::kInvalidArgument) << p.status;
}

}  // namespace
}  // namespace braid::compression
