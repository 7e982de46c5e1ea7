// Unit tests of the compression stage's math: 4-bit codecs against values worked out by hand,
// stochastic rounding against its definition, the 4-bit all-reduce's layout, error feedback,
// spec parsing, and the stage's plan and reduction, warm-up, byte counts and native 16-bit
// path over a one-rank fake communicator.
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/half.h"
#include "compression/error_feedback.h"
#include "compression/four_bit.h"
#include "compression/half_convert.h"
#include "compression/quantize.h"
#include "compression/registry.h"
#include "compression/stage.h"
#include "gtest/gtest.h"

namespace braid::compression {
namespace {

std::vector<float> RoundTrip(FourBitFormat f, const std::vector<float>& x, uint32_t seed,
                             float* scale_out = nullptr) {
  const float s = ChunkScale(f, x.data(), x.size());
  std::vector<uint8_t> packed(PackedBytes(x.size()));
  Encode(f, x.data(), x.size(), s, seed, 0, packed.data());
  std::vector<float> out(x.size());
  Decode(f, packed.data(), x.size(), s, out.data());
  if (scale_out) *scale_out = s;
  return out;
}

TEST(PackTest, RoundTripIsExactForOddAndEvenCounts) {
  std::mt19937 gen(7);
  for (size_t n : {0, 1, 2, 3, 128, 255, 1001}) {
    std::vector<uint8_t> codes(n), back(n, 0xff), packed(PackedBytes(n), 0xee);
    for (auto& c : codes) c = gen() % 16;
    PackCodes(codes.data(), n, packed.data());
    UnpackCodes(packed.data(), n, back.data());
    EXPECT_EQ(codes, back) << n;
    if (n >= 2) {  // element 2i in the low nibble, 2i+1 in the high nibble
      EXPECT_EQ(packed[0], codes[0] | (codes[1] << 4));
    }
    if (n % 2) {
      EXPECT_EQ(packed.back() >> 4, 0) << "odd tail leaves the high nibble zero";
    }
  }
}

TEST(Fp4Test, EveryRepresentableValueIsExact) {
  // 2^-130 is a denormal scale (the codec rescales such chunks internally).
  for (float s : {1.0f, 0.125f, 8.0f, std::ldexp(1.0f, -20), std::ldexp(1.0f, -130)}) {
    // The chunk holds every level of both signs plus zero; s itself fixes the scale.
    std::vector<float> x = {0.0f};
    for (int m = 1; m <= 7; ++m) {
      x.push_back(std::ldexp(s, 2 * (m - 7)));
      x.push_back(-std::ldexp(s, 2 * (m - 7)));
    }
    for (uint32_t seed : {0u, 1u, 12345u}) {
      float scale = 0;
      std::vector<float> y = RoundTrip(FourBitFormat::kFp4, x, seed, &scale);
      EXPECT_EQ(scale, s);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i]) << "s=" << s << " i=" << i;
    }
  }
}

TEST(Fp4Test, CodesFollowTheDocumentedFormat) {
  // s = 1: 1 -> m=7 (0b0111); -1/4 -> sign|m=6 (0b1110); 4^-6 -> m=1; 0 -> 0.
  std::vector<float> x = {1.0f, -0.25f, std::ldexp(1.0f, -12), 0.0f, -0.0f};
  std::vector<uint8_t> packed(PackedBytes(x.size())), codes(x.size());
  Encode(FourBitFormat::kFp4, x.data(), x.size(), 1.0f, 0, 0, packed.data());
  UnpackCodes(packed.data(), x.size(), codes.data());
  EXPECT_EQ(codes, (std::vector<uint8_t>{0x7, 0xE, 0x1, 0x0, 0x0}));
}

TEST(Int4Test, EveryRepresentableValueIsExact) {
  const float s = 0.25f;  // max = 7 * 0.25 = 1.75 gives scale exactly 0.25
  std::vector<float> x;
  for (int k = -7; k <= 7; ++k) x.push_back(k * s);
  float scale = 0;
  std::vector<float> y = RoundTrip(FourBitFormat::kInt4, x, 99, &scale);
  EXPECT_EQ(scale, s);
  EXPECT_EQ(y, x);
  std::vector<uint8_t> packed(PackedBytes(x.size())), codes(x.size());
  Encode(FourBitFormat::kInt4, x.data(), x.size(), s, 0, 0, packed.data());
  UnpackCodes(packed.data(), x.size(), codes.data());
  EXPECT_EQ(codes[0], 0x9);   // -7 in two's complement
  EXPECT_EQ(codes[7], 0x0);   // 0
  EXPECT_EQ(codes[14], 0x7);  // 7
}

TEST(ScaleTest, Fp4ScaleIsTheSmallestPowerOfTwoAtOrAboveTheMax) {
  auto scale = [](std::vector<float> x) {
    return ChunkScale(FourBitFormat::kFp4, x.data(), x.size());
  };
  EXPECT_EQ(scale({0.5f, -1.0f}), 1.0f);           // exact power of two: itself
  EXPECT_EQ(scale({0.75f, 0.1f}), 1.0f);
  EXPECT_EQ(scale({-1.5f}), 2.0f);
  EXPECT_EQ(scale({1.0000001f}), 2.0f);
  EXPECT_EQ(scale({3e-5f}), std::ldexp(1.0f, -15));  // 2^-15 = 3.05e-5
  EXPECT_EQ(scale({0.0f, -0.0f}), 0.0f);
  EXPECT_TRUE(std::isnan(scale({1.0f, NAN})));
  EXPECT_TRUE(std::isnan(scale({1.0f, -INFINITY})));
  // The max always lands in the top interval (s/4, s], in fact in (s/2, s].
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  for (int i = 0; i < 1000; ++i) {
    std::vector<float> x(17);
    float m = 0;
    for (float& v : x) {
      v = d(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 40) - 20);
      m = std::max(m, std::fabs(v));
    }
    const float s = scale(x);
    EXPECT_GT(m, s / 2);
    EXPECT_LE(m, s);
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of two";
  }
  std::vector<float> x = {0.5f, -3.5f};
  EXPECT_EQ(ChunkScale(FourBitFormat::kInt4, x.data(), 2), 0.5f);  // max / 7
}

TEST(ScaleTest, NonFiniteChunkDecodesToNaN) {
  for (FourBitFormat f : {FourBitFormat::kFp4, FourBitFormat::kInt4}) {
    std::vector<float> y = RoundTrip(f, {1.0f, INFINITY, 0.0f}, 1);
    for (float v : y) EXPECT_TRUE(std::isnan(v));
  }
}

// Levels of the grid for scale s, sorted: the two neighbours of x must bracket every result.
std::vector<float> Levels(FourBitFormat f, float s) {
  float table[16];
  DecodeTable(f, s, table);
  std::vector<float> v(table, table + 16);
  std::sort(v.begin(), v.end());
  return v;
}

void CheckUnbiased(FourBitFormat f, float scale_setter, float x) {
  // The chunk is {scale_setter, x}: element 1 is quantized 100,000 times with 100,000 seeds.
  std::vector<float> chunk = {scale_setter, x};
  const float s = ChunkScale(f, chunk.data(), 2);
  std::vector<float> levels = Levels(f, s);
  auto hi_it = std::lower_bound(levels.begin(), levels.end(), x);
  ASSERT_NE(hi_it, levels.end());
  const float hi = *hi_it;
  const float lo = hi == x ? x : *(hi_it - 1);
  constexpr int kTrials = 100000;
  double sum = 0;
  std::vector<uint8_t> packed(1);
  for (int t = 0; t < kTrials; ++t) {
    float y[2];
    Encode(f, chunk.data(), 2, s, static_cast<uint32_t>(Mix64(t)), 0, packed.data());
    Decode(f, packed.data(), 2, s, y);
    ASSERT_TRUE(y[1] == lo || y[1] == hi) << x << " -> " << y[1] << " not in {" << lo << ", " << hi << "}";
    sum += y[1];
  }
  const double p = hi == lo ? 0.0 : (static_cast<double>(x) - lo) / (hi - lo);
  const double se = (hi - lo) * std::sqrt(p * (1 - p) / kTrials);
  const double mean = sum / kTrials;
  EXPECT_LE(std::fabs(mean - x), 4 * se + 1e-12 * std::fabs(x))
      << "x=" << x << " mean=" << mean << " se=" << se << " lo=" << lo << " hi=" << hi;
}

TEST(StochasticRoundingTest, Fp4IsUnbiasedAndStaysBetweenNeighbours) {
  for (float x : {0.3f, -0.3f, 0.9f, 0.0625f * 1.7f, 1e-4f, -2e-4f, 0.26f}) {
    CheckUnbiased(FourBitFormat::kFp4, 1.0f, x);
  }
}

TEST(StochasticRoundingTest, Int4IsUnbiasedAndStaysBetweenNeighbours) {
  for (float x : {0.3f, -0.3f, 0.99f, 1e-3f, -0.51f}) CheckUnbiased(FourBitFormat::kInt4, 1.0f, x);
}

// The AVX2 kernels (encode, decode) must give exactly the portable kernels' bytes and values.
TEST(KernelTest, VectorAndPortableKernelsAgreeBitForBit) {
  std::mt19937 gen(23);
  std::normal_distribution<float> d;
  for (FourBitFormat f : {FourBitFormat::kFp4, FourBitFormat::kInt4}) {
    for (size_t n : {1, 15, 16, 17, 128, 300, 4099}) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) {
        // Magnitudes over 2^-20..2^10 of the max, zeros and negative zeros included.
        x[i] = (i % 11 == 3) ? 0.0f : (i % 13 == 5) ? -0.0f
                                    : d(gen) * std::ldexp(1.0f, -static_cast<int>(gen() % 30));
      }
      const float s = ChunkScale(f, x.data(), n);
      std::vector<uint8_t> fast(PackedBytes(n)), slow(PackedBytes(n));
      std::vector<float> fast_out(n, 5.0f), slow_out(n, 5.0f);
      Encode(f, x.data(), n, s, 77, 1000, fast.data());
      Decode(f, fast.data(), n, s, fast_out.data());
      DecodeAdd(f, fast.data(), n, s, fast_out.data());
      UseVectorKernels(false);
      Encode(f, x.data(), n, s, 77, 1000, slow.data());
      Decode(f, slow.data(), n, s, slow_out.data());
      DecodeAdd(f, slow.data(), n, s, slow_out.data());
      UseVectorKernels(true);
      EXPECT_EQ(fast, slow) << "n=" << n;
      EXPECT_EQ(fast_out, slow_out) << "n=" << n;
    }
  }
}

TEST(StochasticRoundingTest, SameSeedSameBytes) {
  std::mt19937 gen(5);
  std::normal_distribution<float> d;
  std::vector<float> x(1000);
  for (float& v : x) v = d(gen);
  EXPECT_EQ(RoundTrip(FourBitFormat::kFp4, x, 42), RoundTrip(FourBitFormat::kFp4, x, 42));
  EXPECT_NE(RoundTrip(FourBitFormat::kFp4, x, 42), RoundTrip(FourBitFormat::kFp4, x, 43));
}

TEST(FourBitLayoutTest, ChunksStayInsideTensorsAndShardsAreContiguous) {
  const std::vector<size_t> counts = {300, 5, 0, 1000};
  FourBitLayout L = PlanFourBit(counts, 128, 3);
  // 300 -> 128,128,44; 5 -> 5; 0 -> none; 1000 -> 7x128 + 104.
  ASSERT_EQ(L.chunks.size(), 3u + 1u + 8u);
  EXPECT_EQ(L.chunks[2].count, 44u);
  EXPECT_EQ(L.chunks[3].tensor, 1u);
  EXPECT_EQ(L.chunks[3].count, 5u);
  EXPECT_EQ(L.chunks[11].count, 104u);
  EXPECT_EQ(L.tensor_payload_bytes,
            (std::vector<uint64_t>{3 * 4 + 64 + 64 + 22, 4 + 3, 0, 8 * 4 + 7 * 64 + 52}));
  ASSERT_EQ(L.shard_first_chunk.size(), 4u);
  EXPECT_EQ(L.shard_first_chunk[0], 0u);
  EXPECT_EQ(L.shard_first_chunk[3], L.chunks.size());
  size_t bytes_total = 0;
  for (int p = 0; p < 3; ++p) {
    size_t expect = 0;
    for (size_t i = L.shard_first_chunk[p]; i < L.shard_first_chunk[p + 1]; ++i) {
      EXPECT_EQ(L.chunks[i].shard, p);
      EXPECT_EQ(L.chunks[i].scale_index, i - L.shard_first_chunk[p]);
      expect += 4 + PackedBytes(L.chunks[i].count);
    }
    EXPECT_EQ(L.shard_bytes[p], expect);
    EXPECT_EQ(L.shard_offset[p], bytes_total);
    bytes_total += expect;
  }
  // Balanced by elements: 1305 elements, each shard within one chunk of 435.
  for (int p = 0; p < 3; ++p) {
    size_t elems = 0;
    for (size_t i = L.shard_first_chunk[p]; i < L.shard_first_chunk[p + 1]; ++i) elems += L.chunks[i].count;
    EXPECT_NEAR(static_cast<double>(elems), 435.0, 128.0) << p;
  }
  // More ranks than chunks: the extra shards are empty, not an error.
  FourBitLayout tiny = PlanFourBit(std::vector<size_t>{3}, 128, 4);
  EXPECT_EQ(tiny.shard_bytes[0] + tiny.shard_bytes[1] + tiny.shard_bytes[2] + tiny.shard_bytes[3], 4u + 2u);
}

TEST(ErrorFeedbackTest, SentPlusNewResidualEqualsInputPlusOldResidual) {
  // Inputs are multiples of 2^-10 so every sum below is exact in float32: the identity must
  // then hold bit for bit, element for element, over several steps.
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> d(-4096, 4096);
  ErrorFeedback ef;
  const size_t n = 1000;
  std::vector<float> old_residual(n, 0.0f);
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g(n);
    for (float& v : g) v = std::ldexp(static_cast<float>(d(gen)), -10);
    std::vector<float> p = g;
    ef.Apply("w", p.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], g[i] + old_residual[i]);
    std::vector<float> sent(n);
    for (size_t c = 0; c < n; c += 128) {
      const size_t len = std::min<size_t>(128, n - c);
      const float s = ChunkScale(FourBitFormat::kFp4, p.data() + c, len);
      std::vector<uint8_t> packed(PackedBytes(len));
      Encode(FourBitFormat::kFp4, p.data() + c, len, s, step, c, packed.data());
      Decode(FourBitFormat::kFp4, packed.data(), len, s, sent.data() + c);
    }
    ef.Update("w", p.data(), sent.data(), n);
    const std::vector<float>& e = ef.residual("w");
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(sent[i] + e[i], g[i] + old_residual[i]) << "step " << step << " i " << i;
    }
    old_residual = e;
  }
}

TEST(ErrorFeedbackTest, LowPassBetaBlendsTheOldResidual) {
  ErrorFeedback ef(0.25f);
  std::vector<float> g = {1.0f, 2.0f}, sent = {0.0f, 2.0f};
  ef.Apply("t", g.data(), 2);  // residual starts at zero
  ef.Update("t", g.data(), sent.data(), 2);
  EXPECT_EQ(ef.residual("t"), (std::vector<float>{0.25f, 0.0f}));  // 0.75*0 + 0.25*(1-0)
  std::vector<float> g2 = {1.0f, 1.0f}, sent2 = {0.0f, 0.0f};
  ef.Apply("t", g2.data(), 2);  // p = {1.25, 1}
  EXPECT_EQ(g2, (std::vector<float>{1.25f, 1.0f}));
  ef.Update("t", g2.data(), sent2.data(), 2);
  // 0.75*0.25 + 0.25*1.25 = 0.5; 0.75*0 + 0.25*1 = 0.25
  EXPECT_EQ(ef.residual("t"), (std::vector<float>{0.5f, 0.25f}));
  std::vector<float> g3 = {1.0f, 2.0f, 3.0f};
  ef.Apply("t", g3.data(), 3);  // size change: starts again from zero
  EXPECT_EQ(ef.residual("t"), (std::vector<float>{0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(g3, (std::vector<float>{1.0f, 2.0f, 3.0f}));
}

TEST(ErrorFeedbackTest, NonFiniteStepDoesNotPoisonLaterSteps) {
  for (float beta : {1.0f, 0.5f}) {
    ErrorFeedback ef(beta);
    std::vector<float> p = {1.0f, NAN, 2.0f}, sent = {0.5f, NAN, INFINITY};
    ef.Apply("t", p.data(), 3);
    ef.Update("t", p.data(), sent.data(), 3);
    EXPECT_EQ(ef.residual("t"), (std::vector<float>{0.5f * beta, 0.0f, 0.0f})) << beta;
  }
}

TEST(RegistryTest, CanonicalFormsAndDefaults) {
  auto canon = [](const char* spec) { return ParseCompressionSpec(spec).value().canonical; };
  EXPECT_EQ(canon(""), "none");
  EXPECT_EQ(canon("none"), "none");
  EXPECT_EQ(canon("fp4"), "fp4");
  EXPECT_EQ(canon("fp4:chunk=128"), "fp4");
  EXPECT_EQ(canon("fp4:chunk=0128,ef=0"), "fp4");
  EXPECT_EQ(canon("fp4:start_step=5,ef=1"), "fp4:ef=1,start_step=5");
  EXPECT_EQ(canon("fp4:ef=true,start_step=5"), "fp4:ef=1,start_step=5");
  EXPECT_EQ(canon("int4:chunk=64"), "int4:chunk=64");
  EXPECT_EQ(canon(" bf16 "), "bf16");
  EXPECT_EQ(canon("fp4: chunk = 64 , ef=1"), "fp4:chunk=64,ef=1");
  CompressionSpec s = ParseCompressionSpec("int4:chunk=64,start_step=3").value();
  EXPECT_EQ(s.IntOption("chunk"), 64);
  EXPECT_EQ(s.IntOption("ef"), 0);
  EXPECT_EQ(s.start_step, 3);
}

TEST(RegistryTest, ErrorsListWhatIsValid) {
  EXPECT_EQ(ParseCompressionSpec("fp5").status().message(),
            "compression 'fp5': unknown method 'fp5'; valid methods: none, auto, fp16, bf16, fp4, "
            "int4, powersgd, scalecomp, topk, randomk");
  EXPECT_EQ(ParseCompressionSpec("fp4:chnk=3").status().message(),
            "compression 'fp4:chnk=3': unknown option 'chnk' for fp4; valid options: chunk, ef, "
            "beta, start_step");
  EXPECT_EQ(ParseCompressionSpec("none:x=1").status().message(),
            "compression 'none:x=1': unknown option 'x' for none; it takes no options");
  EXPECT_EQ(ParseCompressionSpec("fp4:chunk=1").status().message(),
            "compression 'fp4:chunk=1': option 'chunk' must be an integer in [2, 2^30], got '1'");
  EXPECT_EQ(ParseCompressionSpec("int4:ef=yes").status().message(),
            "compression 'int4:ef=yes': option 'ef' must be 0 or 1 (or false / true), got 'yes'");
  EXPECT_EQ(ParseCompressionSpec("fp4:ef=1,ef=0").status().message(),
            "compression 'fp4:ef=1,ef=0': option 'ef' given twice");
  EXPECT_EQ(ParseCompressionSpec("fp4:").status().message(),
            "compression 'fp4:': empty option; write method:option=value,option=value");
  EXPECT_EQ(ParseCompressionSpec("fp4:chunk=64,").status().message(),
            "compression 'fp4:chunk=64,': empty option; write method:option=value,option=value");
  EXPECT_EQ(ParseCompressionSpec("test_randomk").status().message(),
            "compression 'test_randomk': unknown method 'test_randomk'; valid methods: none, "
            "auto, fp16, bf16, fp4, int4, powersgd, scalecomp, topk, randomk (test-only methods need "
            "BRAID_TEST_COMPRESSORS=1)");
  // Test-only methods exist only when asked for.
  EXPECT_FALSE(ParseCompressionSpec("test_randomk").ok());
  RegistryOptions with_tests;
  with_tests.test_methods = true;
  EXPECT_EQ(ParseCompressionSpec("test_randomk:keep=0.5", with_tests).value().canonical,
            "test_randomk:keep=0.5");
  EXPECT_EQ(ParseCompressionSpec("test_randomk:keep=2", with_tests).status().message(),
            "compression 'test_randomk:keep=2': option 'keep' must be a number in (0, 1], got '2'");
}

// A one-rank communicator: every collective is a copy. Enough to drive the stage's logic.
class SelfCommunicator : public transport::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override {
    ++all_reduces;
    if (send != recv) std::memcpy(recv, send, count * DataTypeSize(dtype));
    return absl::OkStatus();
  }
  absl::Status ReduceScatter(const void*, void*, absl::Span<const size_t>, DataType,
                             ReduceOp) override {
    return absl::UnimplementedError("unused");
  }
  absl::Status AllGather(const void* send, size_t send_bytes, void* recv,
                         absl::Span<const size_t>) override {
    ++all_gathers;
    std::memcpy(recv, send, send_bytes);
    return absl::OkStatus();
  }
  absl::Status AllToAll(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                        absl::Span<const size_t>) override {
    ++all_to_alls;
    std::memcpy(recv, send, send_bytes[0]);
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, size_t, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort(absl::Status) override {}
  transport::TransportStats stats() const override { return {}; }
  std::string Describe() const override { return "self"; }
  int all_reduces = 0, all_gathers = 0, all_to_alls = 0;
};

TEST(StageTest, WarmUpRunsPlainThenCompressesAndCountsBytes) {
  CompressionStage stage(StageOptions{});
  SelfCommunicator comm;
  const CompressionMethod& method = *stage.Resolve("fp4:start_step=2").value();
  EXPECT_EQ(method.spec(), "fp4:start_step=2");
  std::vector<float> a(1000), b(7);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.001f * static_cast<float>(i) + 0.0003f;
  const std::vector<float> a0 = a;
  std::vector<int64_t> shape_a = {1000}, shape_b = {7};
  std::vector<TensorView> bucket = {{"a", shape_a, a.data(), a.size()},
                                    {"b", shape_b, b.data(), b.size()}};
  std::vector<TensorBytes> bytes(2);
  uint64_t payload_a = 0, payload_b = 0;
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(stage.Reduce(method, bucket, ReduceOp::kAverage, comm, absl::MakeSpan(bytes)).ok());
    EXPECT_EQ(a, a0) << "warm-up step " << step << " is a plain all-reduce";
    EXPECT_TRUE(bytes[0].warm_up && bytes[1].warm_up);
    payload_a += bytes[0].payload_bytes;
    payload_b += bytes[1].payload_bytes;
  }
  EXPECT_EQ(comm.all_reduces, 4);
  EXPECT_EQ(comm.all_to_alls, 0);
  ASSERT_TRUE(stage.Reduce(method, bucket, ReduceOp::kAverage, comm, absl::MakeSpan(bytes)).ok());
  EXPECT_EQ(comm.all_to_alls, 1) << "one all-to-all for the whole bucket";
  EXPECT_EQ(comm.all_gathers, 1);
  EXPECT_NE(a, a0) << "quantized";
  EXPECT_FALSE(bytes[0].warm_up || bytes[1].warm_up);
  payload_a += bytes[0].payload_bytes;
  payload_b += bytes[1].payload_bytes;
  // Two warm-up steps at full size, then 1000 -> 7x(64+4) + (52+4) and 7 -> 4+4 bytes.
  EXPECT_EQ(payload_a, 2u * 4000 + 7 * 68 + 56);
  EXPECT_EQ(payload_b, 2u * 28 + 8);
  // The step counts travel in the checkpoint: 3 reductions of each tensor.
  const std::string state = stage.SaveState(0, 1).value();
  EXPECT_NE(state.find(std::string("\x03\0\0\0\0\0\0\0", 8)), std::string::npos);
}

// Note [Bucket reduction]: the caller sequences plan -> pack -> reduce; the stage never calls
// back. The plan says each tensor's step, warm-up and view dtype; a planned bucket dropped
// without a reduction, or reduced with views other than planned, advances no step count;
// the stage's state lock is held from the plan until the reduction, so a checkpoint taken
// meanwhile waits for it.
TEST(StageTest, PlanThenReduceWithNoCallback) {
  CompressionStage stage(StageOptions{});
  SelfCommunicator comm;
  const CompressionMethod& method = *stage.Resolve("fp16:start_step=1").value();
  std::vector<int64_t> shape = {4};
  const std::vector<BucketTensor> tensors = {{"h", shape, DataType::kFloat16, 4},
                                             {"f", shape, DataType::kFloat32, 4}};
  std::vector<float> h(4, 1.5f), f(4, 2.5f);
  const std::vector<TensorView> views = {{"h", shape, h.data(), 4}, {"f", shape, f.data(), 4}};
  {
    absl::StatusOr<PlannedBucket> planned = stage.Plan(method, tensors);
    ASSERT_TRUE(planned.ok()) << planned.status();
    ASSERT_EQ(planned->plans().size(), 2u);
    for (const TensorPlan& p : planned->plans()) {
      EXPECT_EQ(p.step, 0);
      EXPECT_TRUE(p.warm_up);
      EXPECT_EQ(p.work_dtype, DataType::kFloat32) << "a warm-up step runs in float32";
      EXPECT_TRUE(p.separate_input);
    }
  }  // dropped unreduced: the lock is released and nothing advanced
  absl::StatusOr<PlannedBucket> first = stage.Plan(method, tensors);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->plans()[0].step, 0);
  std::vector<TensorBytes> bytes(2);
  ASSERT_TRUE(stage.Reduce(*std::move(first), views, ReduceOp::kSum, comm,
                           absl::MakeSpan(bytes)).ok());
  EXPECT_TRUE(bytes[0].warm_up && bytes[1].warm_up);
  EXPECT_GT(comm.all_reduces, 0);
  absl::StatusOr<PlannedBucket> second = stage.Plan(method, tensors);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->plans()[0].step, 1);
  EXPECT_FALSE(second->plans()[0].warm_up);
  EXPECT_EQ(second->plans()[0].work_dtype, DataType::kFloat16) << "fp16 takes it natively";
  EXPECT_EQ(second->plans()[1].work_dtype, DataType::kFloat32);
  // A checkpoint waits for the planned bucket.
  absl::Notification saved;
  std::thread saver([&] {
    stage.SaveState(0, 1).value();
    saved.Notify();
  });
  EXPECT_FALSE(saved.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  // float32 where float16 was planned: refused, no step advanced, the lock released.
  absl::Status s = stage.Reduce(*std::move(second), views, ReduceOp::kSum, comm);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(s.message(), "compression 'fp16:start_step=1': tensor 'h' was packed as 4 x "
                         "float32, planned 4 x float16");
  saved.WaitForNotification();
  saver.join();
  absl::StatusOr<PlannedBucket> third = stage.Plan(method, tensors);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->plans()[0].step, 1);
}

TEST(StageTest, ForgottenTensorsStartOverAsInAFreshStage) {
  // Two steps of "a" (warm-up, then 4-bit with error feedback), ForgetTensors, two more
  // steps: bit for bit what a fresh stage gives for its first two steps.
  auto two_steps = [](CompressionStage& stage, std::vector<float>* out) {
    SelfCommunicator comm;
    const CompressionMethod& method = *stage.Resolve("fp4:ef=1,start_step=1").value();
    std::vector<int64_t> shape = {1000};
    for (int step = 0; step < 2; ++step) {
      out->resize(1000);
      for (size_t i = 0; i < out->size(); ++i) (*out)[i] = 0.001f * static_cast<float>(i) + 0.0003f;
      std::vector<TensorView> bucket = {{"a", shape, out->data(), out->size()}};
      std::vector<TensorBytes> bytes(1);
      ASSERT_TRUE(stage.Reduce(method, bucket, ReduceOp::kAverage, comm, absl::MakeSpan(bytes)).ok());
      EXPECT_EQ(bytes[0].warm_up, step == 0) << "step " << step;
    }
  };
  CompressionStage fresh(StageOptions{}), reused(StageOptions{});
  std::vector<float> want, got;
  two_steps(fresh, &want);
  two_steps(reused, &got);
  const std::vector<std::string> names = {"a", "never_reduced"};
  EXPECT_EQ(reused.ForgetTensors(names), 1);
  two_steps(reused, &got);
  EXPECT_EQ(got, want);
  EXPECT_EQ(reused.SaveState(0, 1).value(), fresh.SaveState(0, 1).value());
}

TEST(StageTest, CastCompressorRoundsThroughHalfPrecision) {
  CompressionStage stage(StageOptions{});
  SelfCommunicator comm;
  std::vector<float> x = {1.0f, 1.0f + std::ldexp(1.0f, -12), 3.14159265f};
  std::vector<int64_t> shape = {3};
  std::vector<TensorView> bucket = {{"x", shape, x.data(), x.size()}};
  std::vector<TensorBytes> bytes(1);
  ASSERT_TRUE(stage.Reduce(*stage.Resolve("fp16").value(), bucket, ReduceOp::kSum, comm,
                           absl::MakeSpan(bytes)).ok());
  EXPECT_EQ(x, (std::vector<float>{1.0f, 1.0f, 3.140625f}));
  EXPECT_EQ(bytes[0].payload_bytes, 6u);
  std::vector<float> y = {3.14159265f};
  std::vector<TensorView> one = {{"y", shape, y.data(), 1}};
  ASSERT_TRUE(stage.Reduce(*stage.Resolve("bf16").value(), one, ReduceOp::kSum, comm,
                           absl::MakeSpan(bytes)).ok());
  EXPECT_EQ(y[0], 3.140625f);
  EXPECT_EQ(bytes[0].payload_bytes, 2u);
}

// Two ranks holding the same values: a sum doubles them (exact in every float format here).
class TwinCommunicator : public SelfCommunicator {
 public:
  int size() const override { return 2; }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override {
    ++all_reduces;
    if (send != recv) std::memcpy(recv, send, count * DataTypeSize(dtype));
    if (dtype == DataType::kFloat32) {
      for (size_t i = 0; i < count; ++i) static_cast<float*>(recv)[i] *= 2.0f;
      return absl::OkStatus();
    }
    const bool bf16 = dtype == DataType::kBFloat16;
    std::vector<float> f(count);
    FromHalf(static_cast<uint16_t*>(recv), count, bf16, f.data());
    for (float& v : f) v *= 2.0f;
    ToHalf(f.data(), count, 1.0f, bf16, static_cast<uint16_t*>(recv));
    return absl::OkStatus();
  }
};

// Note [Native 16-bit tensors]: a float16 or bfloat16 tensor reaches the cast compressor as
// it is, and ends with exactly the bits the float32 route gives (convert, reduce, convert
// back), for both wire formats, sum and average, back to back or in separate buffers.
TEST(StageTest, HalfTensorsTakeTheNativePathWithTheFloat32RoutesBits) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(1500);
  for (float& v : x) v = std::ldexp(u(gen), static_cast<int>(gen() % 20) - 10);
  std::vector<int64_t> s1 = {1000}, s2 = {500};
  for (const char* method : {"fp16", "bf16"}) {
    for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
      const bool bf16 = dtype == DataType::kBFloat16;
      std::vector<uint16_t> half(x.size());
      ToHalf(x.data(), x.size(), 1.0f, bf16, half.data());
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        // The float32 route: convert, reduce, convert back.
        std::vector<float> f(x.size());
        FromHalf(half.data(), half.size(), bf16, f.data());
        std::vector<TensorView> fviews = {{"a", s1, f.data(), 1000},
                                          {"b", s2, f.data() + 1000, 500}};
        CompressionStage stage32(StageOptions{});
        TwinCommunicator comm32;
        ASSERT_TRUE(stage32.Reduce(*stage32.Resolve(method).value(), fviews, op, comm32).ok());
        std::vector<uint16_t> want(f.size());
        ToHalf(f.data(), f.size(), 1.0f, bf16, want.data());
        for (bool back_to_back : {true, false}) {
          std::vector<uint16_t> first(half.begin(), half.begin() + (back_to_back ? 1500 : 1000));
          std::vector<uint16_t> second(half.begin() + 1000, half.end());
          uint16_t* b = back_to_back ? first.data() + 1000 : second.data();
          std::vector<TensorView> views = {{"a", s1, first.data(), 1000, dtype},
                                           {"b", s2, b, 500, dtype}};
          CompressionStage stage(StageOptions{});
          TwinCommunicator comm;
          ASSERT_TRUE(stage.Reduce(*stage.Resolve(method).value(), views, op, comm).ok());
          std::vector<uint16_t> got(first.begin(), first.begin() + 1000);
          got.insert(got.end(), b, b + 500);
          EXPECT_EQ(got, want) << method << " " << DataTypeName(dtype) << " " << ReduceOpName(op)
                               << (back_to_back ? " back to back" : " apart");
          EXPECT_EQ(comm.all_reduces, 1) << "one all-reduce per bucket";
        }
      }
    }
  }
}

// A lone tensor read out of place (TensorView::input): the result lands in `data`, the input
// is left as it was, and the bits are those of the in-place route, for every dtype the cast
// compressors take.
TEST(StageTest, CastCompressorReadsALoneTensorOutOfPlace) {
  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.37f * static_cast<float>(i) - 40.0f;
  std::vector<int64_t> shape = {300};
  for (const char* method : {"fp16", "bf16"}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        const size_t bytes = x.size() * DataTypeSize(dtype);
        std::vector<char> in(bytes), inplace(bytes), out(bytes, 0x55);
        if (dtype == DataType::kFloat32) {
          std::memcpy(in.data(), x.data(), bytes);
        } else {
          ToHalf(x.data(), x.size(), 1.0f, dtype == DataType::kBFloat16,
                 reinterpret_cast<uint16_t*>(in.data()));
        }
        const std::vector<char> before = in;
        inplace = in;
        CompressionStage a(StageOptions{}), b(StageOptions{});
        TwinCommunicator ca, cb;
        std::vector<TensorView> v1 = {{"x", shape, inplace.data(), x.size(), dtype}};
        ASSERT_TRUE(a.Reduce(*a.Resolve(method).value(), v1, op, ca).ok());
        std::vector<TensorView> v2 = {{"x", shape, out.data(), x.size(), dtype, in.data()}};
        ASSERT_TRUE(b.Reduce(*b.Resolve(method).value(), v2, op, cb).ok());
        EXPECT_EQ(out, inplace) << method << " " << DataTypeName(dtype) << " " << ReduceOpName(op);
        EXPECT_EQ(in, before) << "the input is read only";
      }
    }
  }
}

// beta= reaches the 4-bit methods' error feedback: the first step (zero memory) is the same
// with or without it, the second differs, since the memory it adds was filtered.
TEST(StageTest, FourBitBetaFiltersTheErrorFeedbackMemory) {
  std::vector<std::vector<float>> results;
  for (const char* spec : {"fp4:ef=1", "fp4:ef=1,beta=0.5"}) {
    CompressionStage stage(StageOptions{});
    SelfCommunicator comm;
    std::vector<int64_t> shape = {300};
    for (int step = 0; step < 2; ++step) {
      std::vector<float> x(300);
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i + step));
      std::vector<TensorView> bucket = {{"x", shape, x.data(), x.size()}};
      ASSERT_TRUE(stage.Reduce(*stage.Resolve(spec).value(), bucket, ReduceOp::kSum, comm).ok());
      results.push_back(x);
    }
  }
  EXPECT_EQ(results[0], results[2]) << "step 0: no memory yet";
  EXPECT_NE(results[1], results[3]) << "step 1: the memory was filtered by beta";
}

// The vector conversion path (F16C where the CPU has it, 8 at a time) must agree bit for bit
// with the scalar reference of common/half.h: normals, fp16 subnormals, overflow, zeros.
TEST(StageTest, HalfConversionMatchesTheScalarReference) {
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::vector<float> x(10007);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::ldexp(mant(gen), static_cast<int>(gen() % 50) - 30);  // 2^-30 .. 2^19
  }
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 65504.0f;
  x[3] = 65520.0f;  // rounds to infinity
  x[4] = std::ldexp(1.0f, -24);
  x[5] = std::ldexp(1.0f, -25);  // ties to even: zero
  for (const char* method : {"fp16", "bf16"}) {
    CompressionStage stage(StageOptions{});
    SelfCommunicator comm;
    std::vector<float> y = x;
    std::vector<int64_t> shape = {static_cast<int64_t>(y.size())};
    std::vector<TensorView> bucket = {{"x", shape, y.data(), y.size()}};
    ASSERT_TRUE(stage.Reduce(*stage.Resolve(method).value(), bucket, ReduceOp::kSum, comm).ok());
    const bool fp16 = std::string(method) == "fp16";
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = fp16 ? Float16ToFloat(FloatToFloat16(x[i]))
                              : BFloat16ToFloat(FloatToBFloat16(x[i]));
      ASSERT_EQ(FloatBits(y[i]), FloatBits(want)) << method << " x=" << x[i] << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace braid::compression
