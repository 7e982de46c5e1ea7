// Multi-process tests of compressed all-reduce through braid::Runtime: a real coordinator
// process, 2-4 real rank processes, real UCX. Every rank derives every rank's input from
// seeds, so the exact mean is computed here independently (in double) and each result is
// checked against the documented error bound of its method, element by element.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/quantize.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/runtime_job.h"

namespace braid {
namespace {

using braid::testing::AllReduceOf;
using braid::testing::Checker;
using braid::testing::RunJob;
using braid::testing::WaitFor;
using compression::ChunkScale;
using compression::FourBitFormat;

// Rank r's input for tensor `tag`: normal values whose magnitude varies by chunk (so scales
// differ across chunks and ranks), with exact zeros sprinkled in.
std::vector<float> Input(int rank, int tag, size_t n) {
  std::mt19937 gen(1000 * tag + rank);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const float mag = std::ldexp(1.0f, static_cast<int>((i / 128 + tag) % 9) - 4);
    x[i] = (i % 97 == 5) ? 0.0f : d(gen) * mag;
  }
  return x;
}

// Element-wise bound on |result - mean| for `method` (see compression/four_bit.h and
// compression/cast_compressor.cc), from every rank's input.
std::vector<double> Bound(const std::string& method, const std::vector<std::vector<float>>& in,
                          const std::vector<double>& mean) {
  const size_t n = mean.size();
  const int ranks = static_cast<int>(in.size());
  std::vector<double> bound(n, 0.0);
  if (method == "fp16" || method == "bf16") {
    const double u = method == "fp16" ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    for (size_t i = 0; i < n; ++i) {
      double abs_sum = 0;
      for (int r = 0; r < ranks; ++r) abs_sum += std::fabs(in[r][i]);
      bound[i] = (ranks + 1) * u * abs_sum / ranks + ranks * std::ldexp(1.0, -25);
    }
    return bound;
  }
  const bool fp4 = method.rfind("fp4", 0) == 0;
  const FourBitFormat f = fp4 ? FourBitFormat::kFp4 : FourBitFormat::kInt4;
  const double k = fp4 ? 0.75 : 1.0;  // max error of one quantization, in units of the scale
  for (size_t c = 0; c < n; c += 128) {
    const size_t len = std::min<size_t>(128, n - c);
    // First quantization: each rank's own chunk scale.
    double e1 = 0;
    for (int r = 0; r < ranks; ++r) e1 += k * ChunkScale(f, in[r].data() + c, len);
    e1 /= ranks;
    // Second: the reduced chunk's scale, bounded through its largest possible magnitude.
    float m = 0;
    for (size_t i = c; i < c + len; ++i) m = std::max(m, static_cast<float>(std::fabs(mean[i]) + e1));
    const double s_out = fp4 ? ChunkScale(f, &m, 1) : m / 7.0;
    for (size_t i = c; i < c + len; ++i) bound[i] = (e1 + k * s_out) * (1 + 1e-6);
  }
  return bound;
}

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Checks that every rank holds exactly `mine` by all-gathering it (uncompressed).
void ExpectIdenticalOnEveryRank(Runtime& rt, Checker& c, const std::string& name,
                                const std::vector<float>& mine) {
  const int size = *rt.size();
  std::vector<uint8_t> bytes = Bytes(mine), all(bytes.size() * size);
  CollectiveRequest r;
  r.name = name + "/identical";
  r.collective = Collective::kAllGather;
  r.dtype = DataType::kUInt8;
  r.shape = {static_cast<int64_t>(bytes.size())};
  r.input = bytes.data();
  r.output = all.data();
  r.output_capacity_bytes = all.size();
  if (!c.Ok(WaitFor(rt.Enqueue(r)), name + " all-gather")) return;
  for (int p = 0; p < size; ++p) {
    c.Expect(std::memcmp(all.data() + p * bytes.size(), bytes.data(), bytes.size()) == 0,
             absl::StrCat(name, ": rank ", p, "'s result differs from rank ", *rt.rank(), "'s"));
  }
}

class CompressionWorldTest : public ::testing::TestWithParam<int> {};

// fp16, bf16, fp4, int4 (and fp4 with error feedback, int4 with a small chunk): results
// within the bound, bit-identical on every rank, for a single tensor and for a fused bucket.
TEST_P(CompressionWorldTest, ResultsWithinBoundAndIdenticalOnEveryRank) {
  const int size = GetParam();
  RunJob(size, [size](int rank, Runtime& rt, Checker& c) {
    const std::vector<size_t> sizes = {100003, 1, 129, 4000};
    int tag = 0;
    for (const std::string method : {"fp16", "bf16", "fp4", "int4", "fp4:ef=1", "int4:chunk=128"}) {
      // Enqueue all tensors before waiting so the coordinator fuses them into one bucket.
      std::vector<std::vector<float>> outs(sizes.size());
      std::vector<std::vector<float>> inputs(sizes.size());
      std::vector<absl::StatusOr<std::shared_ptr<Handle>>> handles;
      for (size_t t = 0; t < sizes.size(); ++t) {
        inputs[t] = Input(rank, tag + static_cast<int>(t), sizes[t]);
        outs[t].assign(sizes[t], -1.0f);
        CollectiveRequest r = AllReduceOf(absl::StrCat(method, "/t", t), inputs[t].data(),
                                          outs[t].data(), sizes[t], ReduceOp::kAverage);
        r.compression = method;
        handles.push_back(rt.Enqueue(r));
      }
      for (size_t t = 0; t < sizes.size(); ++t) {
        const std::string what = absl::StrCat(method, " tensor ", t, " (", sizes[t], " elements)");
        if (!c.Ok(WaitFor(handles[t]), what)) continue;
        std::vector<std::vector<float>> all(size);
        for (int p = 0; p < size; ++p) all[p] = Input(p, tag + static_cast<int>(t), sizes[t]);
        std::vector<double> mean(sizes[t], 0.0);
        for (size_t i = 0; i < sizes[t]; ++i) {
          for (int p = 0; p < size; ++p) mean[i] += all[p][i];
          mean[i] /= size;
        }
        std::vector<double> bound = Bound(method, all, mean);
        int bad = 0;
        double err_sum = 0;
        for (size_t i = 0; i < sizes[t]; ++i) {
          const double err = std::fabs(outs[t][i] - mean[i]);
          err_sum += outs[t][i] - mean[i];
          if (!(err <= bound[i]) && ++bad <= 3) {
            c.Expect(false, absl::StrCat(what, ": element ", i, " = ", outs[t][i], ", mean ",
                                         mean[i], ", error ", err, " > bound ", bound[i]));
          }
        }
        c.Expect(bad == 0, absl::StrCat(what, ": ", bad, " elements outside the bound"));
        ExpectIdenticalOnEveryRank(rt, c, absl::StrCat(method, "/t", t), outs[t]);
      }
      tag += 10;
    }
  });
}

// A 1,000,000-element float32 tensor: payload and transport bytes of fp4 and int4 are at most
// 1/7 of an uncompressed all-reduce's (the latter measured on the same job).
TEST_P(CompressionWorldTest, FourBitSendsAtMostOneSeventhOfTheBytes) {
  const int size = GetParam();
  RunJob(size, [](int rank, Runtime& rt, Checker& c) {
    const int64_t n = 1000000;
    std::vector<float> in = Input(rank, 7, n), out(n);
    for (const std::string method : {"none", "fp4", "int4"}) {
      CollectiveRequest r = AllReduceOf("big/" + method, in.data(), out.data(), n, ReduceOp::kAverage);
      r.compression = method;
      c.Ok(WaitFor(rt.Enqueue(r)), method);
    }
    auto report = rt.compression_report();
    if (!c.Ok(report.status(), "compression_report")) return;
    std::map<std::string, ByteStats> by_name;
    for (const auto& t : report->tensors) by_name[t.name] = t.bytes;
    const ByteStats none = by_name["big/none"];
    c.Expect(none.uncompressed_bytes == 4 * n && none.payload_bytes == 4 * n,
             absl::StrCat("none: uncompressed ", none.uncompressed_bytes, " payload ", none.payload_bytes));
    c.Expect(none.transport_bytes > 0, "none: transport bytes measured");
    for (const std::string method : {"fp4", "int4"}) {
      const ByteStats b = by_name["big/" + method];
      // 7812 chunks of 128 (64 code bytes + 4 scale bytes) and one of 64 (32 + 4).
      c.Expect(b.payload_bytes == 7812u * 68 + 36,
               absl::StrCat(method, ": payload ", b.payload_bytes, " bytes"));
      c.Expect(b.uncompressed_bytes == 4 * n, absl::StrCat(method, ": uncompressed ", b.uncompressed_bytes));
      c.Expect(7 * b.payload_bytes <= none.payload_bytes,
               absl::StrCat(method, ": payload ", b.payload_bytes, " vs ", none.payload_bytes));
      c.Expect(7 * b.transport_bytes <= none.transport_bytes,
               absl::StrCat(method, ": transport ", b.transport_bytes, " vs uncompressed ",
                            none.transport_bytes));
      c.Expect(b.transport_bytes > 0, method + ": transport bytes measured");
    }
  });
}

// Fusion depends on timing (which requests reach the coordinator in one cycle), so a
// tensor's compressed result must not depend on its bucket: two jobs, fused and unfused,
// give bit-identical results over three steps (error feedback included).
TEST_P(CompressionWorldTest, FusedAndUnfusedResultsAreBitIdentical) {
  const int size = GetParam();
  const std::string dir = braid::testing::MakeTempDir("braid_fusion_eq");
  for (const char* threshold : {"67108864", "0"}) {
    RunJob(size, [&](int rank, Runtime& rt, Checker& c) {
      std::vector<uint8_t> all;
      for (int step = 0; step < 3; ++step) {
        for (const std::string method : {"fp4:ef=1", "int4", "fp16"}) {
          const std::vector<size_t> sizes = {3000, 129, 1};
          std::vector<std::vector<float>> in(sizes.size()), out(sizes.size());
          std::vector<absl::StatusOr<std::shared_ptr<Handle>>> handles;
          for (size_t t = 0; t < sizes.size(); ++t) {
            in[t] = Input(rank, 50 + 7 * step + static_cast<int>(t), sizes[t]);
            out[t].assign(sizes[t], 0.0f);
            CollectiveRequest r = AllReduceOf(absl::StrCat(method, "/", t), in[t].data(),
                                              out[t].data(), sizes[t], ReduceOp::kAverage);
            r.compression = method;
            handles.push_back(rt.Enqueue(r));  // all before waiting: a bucket when fusing
          }
          for (size_t t = 0; t < sizes.size(); ++t) {
            c.Ok(WaitFor(handles[t]), method);
            std::vector<uint8_t> b = Bytes(out[t]);
            all.insert(all.end(), b.begin(), b.end());
          }
        }
      }
      FILE* f = fopen(absl::StrCat(dir, "/", threshold, ".", rank).c_str(), "wb");
      c.Expect(f != nullptr && fwrite(all.data(), 1, all.size(), f) == all.size(), "write");
      if (f) fclose(f);
    }, absl::Seconds(120), 30, {{"BRAID_FUSION_THRESHOLD", threshold}});
  }
  auto read = [&](const std::string& name) {
    std::ifstream f(dir + "/" + name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  for (int rank = 0; rank < size; ++rank) {
    const std::string fused = read(absl::StrCat("67108864.", rank));
    EXPECT_FALSE(fused.empty());
    EXPECT_TRUE(fused == read(absl::StrCat("0.", rank))) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CompressionWorldTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat(i.param, "ranks");
                         });

// Averaging divides before summing: four ranks of 30000 would overflow fp16 (max 65504) if
// summed first; the mean is exact. Also float64 and float16 tensors through the stage.
TEST(CompressionTest, Fp16AverageDoesNotOverflowAndOtherDtypesConvert) {
  RunJob(4, [](int rank, Runtime& rt, Checker& c) {
    std::vector<float> in(64, 30000.0f), out(64);
    CollectiveRequest r = AllReduceOf("big_values", in.data(), out.data(), 64, ReduceOp::kAverage);
    r.compression = "fp16";
    if (c.Ok(WaitFor(rt.Enqueue(r)), "fp16 average")) {
      c.Expect(out[0] == 30000.0f && out[63] == 30000.0f, absl::StrCat("mean ", out[0]));
    }
    std::vector<double> d_in(10, 0.5 * (rank + 1)), d_out(10);
    CollectiveRequest rd = AllReduceOf("f64", nullptr, nullptr, 10, ReduceOp::kSum);
    rd.dtype = DataType::kFloat64;
    rd.input = d_in.data();
    rd.output = d_out.data();
    rd.compression = "bf16";
    if (c.Ok(WaitFor(rt.Enqueue(rd)), "float64 via bf16")) {
      c.Expect(d_out[9] == 5.0, absl::StrCat("0.5+1+1.5+2 = ", d_out[9]));  // exact in bf16
    }
  });
}

// Ranks asking for different compression get an error naming both, on every rank; the
// default (BRAID_COMPRESSION) skips integer tensors; an explicit method on one is refused.
TEST(CompressionTest, MismatchAndEligibility) {
  RunJob(2, [](int rank, Runtime& rt, Checker& c) {
    std::vector<float> in(8, 1.0f), out(8);
    CollectiveRequest r = AllReduceOf("mixed", in.data(), out.data(), 8, ReduceOp::kSum);
    r.compression = rank == 0 ? "fp4" : "fp16";
    absl::Status s = WaitFor(rt.Enqueue(r));
    c.Expect(absl::IsInvalidArgument(s) &&
                 s.message() == "tensor 'mixed': compression differs across ranks: fp4 on rank 0; "
                                "fp16 on rank 1",
             "mismatch error: " + s.ToString());
    // Same meaning, different spelling: canonical forms agree, so this one runs.
    r.name = "spelled";
    r.compression = rank == 0 ? "fp4" : "fp4:chunk=128,ef=0";
    c.Ok(WaitFor(rt.Enqueue(r)), "equivalent specs");

    std::vector<int32_t> i_in(5, rank + 1), i_out(5);
    CollectiveRequest ri = AllReduceOf("ints", nullptr, nullptr, 5, ReduceOp::kSum);
    ri.dtype = DataType::kInt32;
    ri.input = i_in.data();
    ri.output = i_out.data();
    if (c.Ok(WaitFor(rt.Enqueue(ri)), "int32 with default fp4")) {
      c.Expect(i_out[4] == 3, absl::StrCat("exact int sum ", i_out[4]));
    }
    ri.name = "ints_explicit";
    ri.compression = "int4";
    s = WaitFor(rt.Enqueue(ri));
    c.Expect(s.message() == absl::StrCat("allreduce 'ints_explicit' on rank ", rank,
                                         ": compression 'int4' applies only to allreduce of "
                                         "floating-point tensors with op sum or average, got "
                                         "int32 / sum"),
             "explicit int4 on int32: " + s.ToString());
    r.name = "unknown";
    r.compression = "fp4:chunk=1";
    s = WaitFor(rt.Enqueue(r));
    c.Expect(absl::IsInvalidArgument(s), "bad option: " + s.ToString());

    // The job default (BRAID_COMPRESSION=fp4) applies to a float tensor without a method.
    r.name = "defaulted";
    r.compression = "";
    c.Ok(WaitFor(rt.Enqueue(r)), "defaulted");
    auto report = rt.compression_report();
    bool found = false;
    for (const auto& t : report->tensors) {
      if (t.name == "defaulted") found = t.method == "fp4";
      if (t.name == "ints") c.Expect(t.method == "none", "ints uncompressed: " + t.method);
    }
    c.Expect(found, "defaulted tensor counted under fp4");
  }, absl::Seconds(120), 30, {{"BRAID_COMPRESSION", "fp4"}});
}

}  // namespace
}  // namespace braid
