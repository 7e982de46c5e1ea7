// The all-reduce pipeline alone (runtime/allreduce_pipeline.h), with no runtime or
// coordinator: its ranks are threads over the in-process transport. The three layouts of
// Note [One pipeline] (packed, converted, joined; in place; a lone tensor read out of place),
// a bucket's timeline passed with the bucket, and Note [Allocation failure].
#include <atomic>
#include <cstring>
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
#include "common/half.h"
#include "compression/stage.h"
#include "gtest/gtest.h"
#include "runtime/allreduce_pipeline.h"
#include "runtime/statistics.h"
#include "runtime/timeline.h"
#include "tests/testing/local_world.h"
#include "tests/testing/test_device.h"

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
// later Run told nothing records nothing. A scattered bucket packed as three passes shows
// its copies; a gathered one (Note [Pipelined copy]) copies inside its ALLREDUCE.
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
      pipeline.set_pipelined_copy(false);
      ASSERT_TRUE(pipeline.Run(41, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                               scattered.tensors(), comm, timeline->get()).ok());
      ASSERT_TRUE(pipeline.Run(42, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                               scattered.tensors(), comm).ok());
      pipeline.set_pipelined_copy(true);
      ASSERT_TRUE(pipeline.Run(43, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                               scattered.tensors(), comm, timeline->get()).ok());
      EXPECT_EQ(d, std::vector<float>(4, 2.0f));
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
  EXPECT_TRUE(absl::StrContains(json, "\"bucket\":43,\"bytes\":32,\"pipelined_copy\":true"))
      << json;
  // Bucket 41's two tensors alone copied in as a phase of their own.
  size_t copies = 0;
  for (size_t at = json.find("MEMCPY_IN_FUSION_BUFFER\",\"ph\":\"B\""); at != std::string::npos;
       at = json.find("MEMCPY_IN_FUSION_BUFFER\",\"ph\":\"B\"", at + 1)) {
    ++copies;
  }
  EXPECT_EQ(copies, 2u) << json;
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

// Note [Devices]: a bucket on a device is packed in that device's own fusion buffer, and
// every byte the pipeline moves goes through the device: each tensor's bytes in and out,
// the op's identity for a joined tensor; the host's fusion buffer stays untouched.
TEST(AllReducePipelineTest, ADeviceBucketMovesItsBytesOnlyThroughTheDevice) {
  testing::RunLocalWorld(2, {}, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    testing::TestDevice gpu(DeviceRef{DeviceType::kCUDA, rank});  // outlives its buffer
    AllReducePipeline pipeline(&stage, &ledger);
    std::vector<float> a(4, 1.0f + rank), a_out(4), b(6, 5.0f), b_out(6, -1.0f);
    TestBucket bucket;
    bucket.Add("a", 4, a.data(), a_out.data());
    if (rank == 0) {
      bucket.Add("b", 6, b.data(), b_out.data());
    } else {
      bucket.AddJoined("b", 6);
    }
    ASSERT_TRUE(pipeline.Run(3, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                             bucket.tensors(), comm, nullptr, BucketPlace{&gpu}).ok());
    EXPECT_EQ(a_out, std::vector<float>(4, 3.0f));
    if (rank == 0) {
      EXPECT_EQ(b_out, std::vector<float>(6, 5.0f));
    }
    EXPECT_EQ(gpu.copied_bytes + gpu.converted_bytes, rank == 0 ? 2 * 40 : 2 * 16);
    EXPECT_EQ(gpu.filled_bytes, rank == 0 ? 0 : 24);
    EXPECT_EQ(gpu.allocations, 1);
    EXPECT_GE(pipeline.buffer(&gpu).capacity(), 40u);
    EXPECT_EQ(pipeline.buffer().capacity(), 0u) << "the host's fusion buffer is not used";
  });
}

// The allocation seam of Note [Allocation failure]: a host-backed device (reporting itself
// as the CPU, so the messages are the host's) whose allocations fail, counting them.
std::unique_ptr<testing::TestDevice> FailingDevice() {
  auto device = std::make_unique<testing::TestDevice>(DeviceRef{});
  device->fail_allocations = true;
  return device;
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

  auto device = FailingDevice();
  FusionBuffer failing(device.get());
  absl::StatusOr<char*> none = failing.Reserve(100);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(none.status().message(),
            "cannot allocate a fusion buffer of 65536 bytes (100 needed, 0 held)");
  EXPECT_EQ(device->failed_allocations, 1);
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
    AllReducePipeline pipeline(&stage, &ledger);
    auto device = FailingDevice();
    const BucketPlace failing{device.get()};
    std::vector<std::vector<float>> data(5, std::vector<float>(10, 1.0f));
    std::vector<std::vector<float>> out(5, std::vector<float>(10));
    TestBucket bucket;
    for (int t = 0; t < 5; ++t) {
      bucket.Add(absl::StrCat("grad", t), 10, data[t].data(), out[t].data());
    }
    absl::Status s = pipeline.Run(7, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                  bucket.tensors(), comm, nullptr, failing);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(s.message(),
              "all-reduce bucket 7 (5 tensors: 'grad0', 'grad1', 'grad2' and 2 more) needs 200 "
              "bytes of fusion buffer: cannot allocate a fusion buffer of 65536 bytes (200 "
              "needed, 0 held)");
    EXPECT_EQ(ledger.Report().fusion.buckets, 0u) << "nothing booked";
    TestBucket lone;
    lone.Add("lone", 10, data[0].data(), data[0].data());
    absl::Status later = pipeline.Run(8, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                      lone.tensors(), comm, nullptr, failing);
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
    AllReducePipeline pipeline(&stage, &ledger);
    auto device = FailingDevice();
    BucketPlace place;
    if (rank == 0) place.device = device.get();
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
                                  packed.tensors(), comm, nullptr, place);
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

// Note [Pipelined copy]: a scattered bucket reduced with the copies pipelined has the bits of
// the same bucket packed and unpacked as three passes, on every rank, whichever of the two
// each rank uses; tensors in place and out of place, every dtype none takes in a float
// format, sums of values whose rounding depends on the order. Small pieces and a low ring
// threshold put most pieces within one tensor and many across two (Note [Gathered
// all-reduce]), and an empty tensor in the middle, whose null pointers must not split the
// gathered bucket into collectives of its own. A bucket where one tensor's output is
// another's input is packed as before.
TEST(AllReducePipelineTest, PipelinedCopyGivesTheBitsOfTheCopiesAsThreePasses) {
  transport::CollectiveOptions o;
  o.ring_threshold_bytes = 512;
  o.chunk_bytes = 256;
  o.ring_window = 3;
  for (const int n : {2, 3}) {
    testing::RunLocalWorld(n, o, [&](int rank, transport::Communicator& comm) {
      compression::CompressionStage stage(compression::StageOptions{}),
          twin(compression::StageOptions{});
      StatisticsLedger ledger;
      AllReducePipeline pipelined(&stage, &ledger), copied(&twin, &ledger);
      copied.set_pipelined_copy(false);
      for (const DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                DataType::kBFloat16}) {
        for (const bool mixed : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DataTypeName(dt), mixed ? " mixed" : "", " n=", n,
                                    " rank ", rank));
          const size_t elem = DataTypeSize(dt);
          constexpr int kTensors = 12;
          std::vector<std::vector<char>> in(kTensors), out(kTensors), in2, out2;
          TestBucket a, b;
          uint64_t x = 12345 + static_cast<uint64_t>(rank);
          for (int t = 0; t < kTensors; ++t) {
            // Tensor 4 is empty, its pointers null (as PyTorch's are).
            const size_t count = t == 4 ? 0 : (t * 37 + 11) % 300 + 1;
            in[t].resize(count * elem);
            for (size_t i = 0; i < count; ++i) {
              x = x * 6364136223846793005ull + 1442695040888963407ull;
              const float v = static_cast<float>(x >> 40) / (1 << 20) - 4.0f;
              if (dt == DataType::kFloat32) std::memcpy(&in[t][i * 4], &v, 4);
              if (dt == DataType::kFloat64) {
                const double d = v / 3.0;
                std::memcpy(&in[t][i * 8], &d, 8);
              }
              if (elem == 2) {
                const uint16_t h =
                    dt == DataType::kFloat16 ? FloatToFloat16(v) : FloatToBFloat16(v);
                std::memcpy(&in[t][i * 2], &h, 2);
              }
            }
            out[t].assign(count * elem, '\x7f');
          }
          in2 = in;
          out2 = out;
          for (int t = 0; t < kTensors; ++t) {
            const std::string name = absl::StrCat("t", t);
            const bool in_place = t % 3 == 0;
            a.Add(name, static_cast<int64_t>(in[t].size() / elem), in[t].data(),
                  in_place ? in[t].data() : out[t].data());
            b.Add(name, static_cast<int64_t>(in2[t].size() / elem), in2[t].data(),
                  in_place ? in2[t].data() : out2[t].data());
          }
          AllReducePipeline& first = mixed && rank % 2 == 1 ? copied : pipelined;
          ASSERT_TRUE(first.Run(7, (&first == &pipelined ? stage : twin).none(), dt,
                                ReduceOp::kSum, a.tensors(), comm).ok());
          ASSERT_TRUE(copied.Run(8, twin.none(), dt, ReduceOp::kSum, b.tensors(), comm).ok());
          for (int t = 0; t < kTensors; ++t) {
            const bool in_place = t % 3 == 0;
            EXPECT_EQ(in_place ? in[t] : out[t], in_place ? in2[t] : out2[t]) << "tensor " << t;
            if (!in_place && !out[t].empty()) {
              EXPECT_NE(out[t], std::vector<char>(out[t].size(), '\x7f')) << "tensor " << t;
            }
          }
        }
      }
      // Tensor y's output is x's input: gathered, y's result could overwrite x's input
      // before x's last piece was read; packed, every input is read first.
      std::vector<float> x(200), y(200), x_out(200), y_out(200);
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = 0.5f * static_cast<float>(i + rank);
        y[i] = 1.0f;
      }
      TestBucket aliased;
      aliased.Add("x", 200, x.data(), x_out.data());
      aliased.Add("y", 200, y.data(), x.data());
      ASSERT_TRUE(pipelined.Run(9, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                                aliased.tensors(), comm).ok());
      for (size_t i = 0; i < x.size(); ++i) {
        const float want_x = 0.5f * static_cast<float>(n * i) + 0.5f * n * (n - 1) / 2;
        ASSERT_EQ(x_out[i], want_x) << i;
        ASSERT_EQ(x[i], static_cast<float>(n)) << i;
      }
    });
  }
}

}  // namespace
}  // namespace braid
