// The all-reduce pipeline alone (runtime/allreduce_pipeline.h), with no runtime or
// coordinator: its ranks are threads over the in-process transport. The three layouts of
// Note [One pipeline] (packed, converted, joined; in place; a lone tensor read out of place),
// a bucket's timeline passed with the bucket, and Note [Allocation failure].
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/stage.h"
#include "gtest/gtest.h"
#include "runtime/allreduce_pipeline.h"
#include "runtime/statistics.h"
#include "runtime/timeline.h"
#include "tests/testing/local_world.h"

namespace braid {
namespace {

// A bucket's tensors for AllReducePipeline::Run, owning the names and shapes they view.
class TestBucket {
 public:
  void Add(std::string name, int64_t count, const void* input, void* output) {
    names_.push_back(std::move(name));
    shapes_.push_back({count});
    tensors_.push_back({names_.back(), shapes_.back(), input, output});
  }
  // A tensor this rank joined for (Note [Join]): no input or output.
  void AddJoined(std::string name, int64_t count) {
    Add(std::move(name), count, nullptr, nullptr);
    tensors_.back().joined = true;
  }
  absl::Span<const AllReduceTensor> tensors() const { return tensors_; }

 private:
  // Deques: growing them leaves the viewed names and shapes in place.
  std::deque<std::string> names_;
  std::deque<std::vector<int64_t>> shapes_;
  std::vector<AllReduceTensor> tensors_;
};

// The fusion counters `ledger` gained since `before`.
FusionStats Since(const StatisticsLedger& ledger, const FusionStats& before) {
  FusionStats f = ledger.Report().fusion;
  f.buckets -= before.buckets;
  f.packed_buckets -= before.packed_buckets;
  f.packed_bytes -= before.packed_bytes;
  f.in_place_bytes -= before.in_place_bytes;
  return f;
}

// Packed: scattered tensors go through the fusion buffer; a tensor this rank joined for
// contributes the op's identity there, so the other rank's values come out alone (an
// average still divides by the world size).
TEST(AllReducePipelineTest, PacksScatteredTensorsWithAJoinedOne) {
  testing::RunLocalWorld(2, {}, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                        ReduceOp::kProduct}) {
      SCOPED_TRACE(ReduceOpName(op));
      std::vector<float> a(5), b(3, -7.0f), a_out(5), b_out(3, -7.0f);
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(rank + i);
      for (size_t i = 0; i < b.size(); ++i) b[i] = 2.0f + 0.5f * static_cast<float>(i);
      TestBucket bucket;
      bucket.Add("a", 5, a.data(), a_out.data());
      if (rank == 0) {
        bucket.Add("b", 3, b.data(), b_out.data());
      } else {
        bucket.AddJoined("b", 3);
      }
      const FusionStats before = ledger.Report().fusion;
      ASSERT_TRUE(pipeline.Run(1, stage.none(), DataType::kFloat32, op, bucket.tensors(), comm)
                      .ok());
      for (size_t i = 0; i < a.size(); ++i) {
        const float v = static_cast<float>(i);
        const float want = op == ReduceOp::kSum       ? 2 * v + 1
                           : op == ReduceOp::kAverage ? (2 * v + 1) / 2
                           : op == ReduceOp::kMin     ? v
                           : op == ReduceOp::kMax     ? v + 1
                                                      : v * (v + 1);
        EXPECT_EQ(a_out[i], want) << "a[" << i << "] rank " << rank;
      }
      if (rank == 0) {
        for (size_t i = 0; i < b.size(); ++i) {
          EXPECT_EQ(b_out[i], op == ReduceOp::kAverage ? b[i] / 2 : b[i]) << "b[" << i << "]";
        }
      }
      const FusionStats f = Since(ledger, before);
      EXPECT_EQ(f.packed_buckets, 1u);
      EXPECT_EQ(f.packed_bytes, 8u * 4);
    }
  });
}

// Converted: a float64 lone tensor under fp16 is packed as float32 (the cast compressor takes
// float32, not float64) and converted back; small integers stay exact.
TEST(AllReducePipelineTest, ConvertsALoneTensorTheCompressorDoesNotTake) {
  testing::RunLocalWorld(2, {}, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger);
    std::vector<double> x(6), out(6);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(rank + 2 * i);
    TestBucket bucket;
    bucket.Add("x", 6, x.data(), out.data());
    ASSERT_TRUE(pipeline.Run(2, *stage.Resolve("fp16").value(), DataType::kFloat64,
                             ReduceOp::kSum, bucket.tensors(), comm).ok());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], 1.0 + 4.0 * i) << i;
    EXPECT_EQ(ledger.Report().fusion.packed_bytes, 6u * 4) << "float32, 4 bytes each";
    EXPECT_GE(pipeline.buffer().capacity(), 6u * 4);
  });
}

// In place: a lone tensor is reduced in its output, the fusion buffer never allocated: read
// out of place from its input where the compressor can (none), else copied to its output
// first (fp4), with the bits of an in-place run either way; the input is left as it was.
TEST(AllReducePipelineTest, ReducesALoneTensorInItsOutput) {
  testing::RunLocalWorld(2, {}, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{}), twin(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger), reference(&twin, &ledger);
    for (const char* spec : {"none", "fp4"}) {
      SCOPED_TRACE(spec);
      std::vector<float> x(300), out(300, -1.0f);
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i) - rank;
      const std::vector<float> x0 = x;
      std::vector<float> in_place = x;
      TestBucket apart, together;
      apart.Add("x", 300, x.data(), out.data());
      together.Add("x", 300, in_place.data(), in_place.data());
      ASSERT_TRUE(pipeline.Run(3, *stage.Resolve(spec).value(), DataType::kFloat32,
                               ReduceOp::kSum, apart.tensors(), comm).ok());
      ASSERT_TRUE(reference.Run(3, *twin.Resolve(spec).value(), DataType::kFloat32,
                                ReduceOp::kSum, together.tensors(), comm).ok());
      EXPECT_EQ(out, in_place);
      EXPECT_EQ(x, x0) << "the input is read only";
    }
    EXPECT_EQ(pipeline.buffer().capacity(), 0u);
    EXPECT_EQ(reference.buffer().capacity(), 0u);
    EXPECT_EQ(ledger.Report().fusion.packed_buckets, 0u);
  });
}

// A bucket's timeline comes with the bucket: its phases go where that Run was told, and a
// later Run told nothing records nothing.
TEST(AllReducePipelineTest, RecordsPhasesOnTheTimelineItIsGiven) {
  const std::string path = ::testing::TempDir() + "/allreduce_pipeline_timeline.json";
  {
    auto timeline = Timeline::Open(path, 0);
    ASSERT_TRUE(timeline.ok()) << timeline.status();
    testing::RunLocalWorld(1, {}, [&](int, transport::Communicator& comm) {
      compression::CompressionStage stage(compression::StageOptions{});
      StatisticsLedger ledger;
      AllReducePipeline pipeline(&stage, &ledger);
      std::vector<float> a(4, 1.0f), b(4, 2.0f), c(4), d(4);
      TestBucket scattered;
      scattered.Add("ta", 4, a.data(), c.data());
      scattered.Add("tb", 4, b.data(), d.data());
      ASSERT_TRUE(pipeline.Run(41, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                               scattered.tensors(), comm, timeline->get()).ok());
      ASSERT_TRUE(pipeline.Run(42, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                               scattered.tensors(), comm).ok());
    });
    (*timeline)->Flush();
  }
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  const std::string json = text.str();
  for (const char* phase :
       {"ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"}) {
    EXPECT_TRUE(absl::StrContains(json, phase)) << phase << " in " << json;
  }
  EXPECT_TRUE(absl::StrContains(json, "\"bucket\":41")) << json;
  EXPECT_FALSE(absl::StrContains(json, "\"bucket\":42")) << json;
  std::remove(path.c_str());
}

// The element counts are common/limits.h's checked ones: a shape the ranks agreed on but
// ShapeElements refuses fails the bucket on every rank alike, naming it, before anything is
// packed or sent (the runtime never gets there: it checks every shape at enqueue).
TEST(AllReducePipelineTest, AShapeBeyondTheLimitsFailsTheBucketBeforeAnythingMoves) {
  testing::RunLocalWorld(2, {}, [](int, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger);
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    TestBucket bucket;
    bucket.Add("fine", 4, a.data(), a.data());
    bucket.Add("negative", -4, b.data(), b.data());
    absl::Status s = pipeline.Run(9, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                  bucket.tensors(), comm);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), "bucket 9, tensor 'negative': shape[0] is negative: -4");
    EXPECT_EQ(pipeline.buffer().capacity(), 0u);
    // Nothing was sent or aborted: the next bucket runs.
    TestBucket fine;
    fine.Add("fine", 4, a.data(), a.data());
    ASSERT_TRUE(pipeline.Run(10, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                             fine.tensors(), comm).ok());
    EXPECT_EQ(a[0], 2.0f);
  });
}

// The allocator seam of Note [Allocation failure]: one that always fails, counting its calls.
std::atomic<int> failed_allocations{0};
void* FailingAlloc(size_t, size_t) {
  ++failed_allocations;
  return nullptr;
}

TEST(FusionBufferTest, AFailedGrowthIsResourceExhaustedAndKeepsTheBuffer) {
  FusionBuffer buffer;
  absl::StatusOr<char*> first = buffer.Reserve(1000);
  ASSERT_TRUE(first.ok());
  const size_t capacity = buffer.capacity();
  EXPECT_GE(capacity, 1000u);
  // Beyond half the address space: refused before any allocation (no wrapped size).
  absl::StatusOr<char*> huge = buffer.Reserve(SIZE_MAX - 10);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_TRUE(absl::StrContains(huge.status().message(), absl::StrCat(SIZE_MAX - 10, " bytes")))
      << huge.status();
  EXPECT_EQ(buffer.capacity(), capacity);
  EXPECT_EQ(buffer.data(), *first);

  FusionBuffer failing(&FailingAlloc);
  failed_allocations = 0;
  absl::StatusOr<char*> none = failing.Reserve(100);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(none.status().message(),
            "cannot allocate a fusion buffer of 65536 bytes (100 needed, 0 held)");
  EXPECT_EQ(failed_allocations, 1);
  EXPECT_EQ(failing.capacity(), 0u);
  EXPECT_EQ(failing.data(), nullptr);
}

// Every rank fails to grow its fusion buffer: the bucket fails with ResourceExhausted naming
// it, nothing is booked, and the communicator is aborted with that error, so every later
// bucket fails with it too, one that needs no buffer included.
TEST(AllReducePipelineTest, AnAllocationFailureNamesTheBucketAndEndsTheDataPlane) {
  testing::RunLocalWorld(2, {}, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger, &FailingAlloc);
    std::vector<std::vector<float>> data(5, std::vector<float>(10, 1.0f));
    std::vector<std::vector<float>> out(5, std::vector<float>(10));
    TestBucket bucket;
    for (int t = 0; t < 5; ++t) {
      bucket.Add(absl::StrCat("grad", t), 10, data[t].data(), out[t].data());
    }
    absl::Status s = pipeline.Run(7, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                  bucket.tensors(), comm);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(s.message(),
              "all-reduce bucket 7 (5 tensors: 'grad0', 'grad1', 'grad2' and 2 more) needs 200 "
              "bytes of fusion buffer: cannot allocate a fusion buffer of 65536 bytes (200 "
              "needed, 0 held)");
    EXPECT_EQ(ledger.Report().fusion.buckets, 0u) << "nothing booked";
    TestBucket lone;
    lone.Add("lone", 10, data[0].data(), data[0].data());
    absl::Status later = pipeline.Run(8, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                      lone.tensors(), comm);
    EXPECT_EQ(later, s) << "rank " << rank;
  });
}

// Only rank 0 fails to allocate: rank 1, already in the bucket's collective, must not pair it
// with rank 0's next bucket (the same size here, so a pairing would succeed with wrong
// values): it fails at the data plane's timeout, and so does every later bucket of both.
TEST(AllReducePipelineTest, AOneSidedAllocationFailureNeverPairsTheNextBucket) {
  transport::CollectiveOptions options;
  options.timeout = absl::Seconds(1);
  testing::RunLocalWorld(2, options, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger, rank == 0 ? &FailingAlloc : nullptr);
    // 16 elements in all, read back to back but written apart: packed, one all-reduce of
    // 16 float32 under none.
    const std::vector<int64_t> counts = {3, 5, 8};
    std::vector<float> in(16, 1.0f + rank), next(16, 100.0f);
    std::vector<std::vector<float>> outs;
    TestBucket packed;
    size_t offset = 0;
    for (size_t t = 0; t < counts.size(); ++t) {
      outs.emplace_back(counts[t]);
      packed.Add(absl::StrCat("g", t), counts[t], in.data() + offset, outs[t].data());
      offset += counts[t];
    }
    absl::Status s = pipeline.Run(1, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                  packed.tensors(), comm);
    EXPECT_FALSE(s.ok()) << "rank " << rank << ": " << s;
    if (rank == 0) {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    }
    TestBucket lone;  // 16 float32 in place: the very all-reduce rank 1 waits in
    lone.Add("next", 16, next.data(), next.data());
    absl::Status later = pipeline.Run(2, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                      lone.tensors(), comm);
    EXPECT_FALSE(later.ok()) << "rank " << rank;
  });
}

}  // namespace
}  // namespace braid
