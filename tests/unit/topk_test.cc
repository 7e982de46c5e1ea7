// Unit tests of the sparsifiers' pure parts: top-k selection against a full stable sort (on
// random and adversarial inputs, both algorithms), the bucket plan (k, offsets, index width),
// and the registry's scalecomp / topk / randomk specs and the 4-bit methods' beta.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/registry.h"
#include "compression/sparse.h"
#include "compression/topk.h"
#include "gtest/gtest.h"

namespace braid::compression {
namespace {

// The reference: indices sorted by |x| descending (compared in double), ties keeping index
// order (stable), the first k, ascending. Independent of MagnitudeKey.
std::vector<uint64_t> FullSortTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint64_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](uint64_t a, uint64_t b) {
    return std::fabs(static_cast<double>(x[a])) > std::fabs(static_cast<double>(x[b]));
  });
  idx.resize(std::min(k, x.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<uint64_t> Select(const std::vector<float>& x, size_t k, TopKAlgorithm a,
                             TopKAlgorithm* ran = nullptr, size_t pieces = 1) {
  // The same data as `pieces` segments (the first one empty when there are several).
  std::vector<FloatSegment> segs;
  if (pieces > 1) segs.push_back({x.data(), 0});
  for (size_t p = 0; p < pieces; ++p) {
    const size_t lo = x.size() * p / pieces, hi = x.size() * (p + 1) / pieces;
    segs.push_back({x.data() + lo, hi - lo});
  }
  TopKSelector sel;
  std::vector<uint64_t> out = {12345};  // replaced, not appended to
  EXPECT_TRUE(sel.Select(segs, k, &out, a));
  if (ran) *ran = sel.last_algorithm();
  return out;
}

void ExpectAgreesWithFullSort(const std::vector<float>& x, const std::string& what) {
  const size_t n = x.size();
  for (size_t k : {size_t{1}, size_t{2}, n / 100, n / 33, n / 10, n / 2, n - 1, n, n + 5}) {
    if (k == 0 && n > 0) continue;
    const std::vector<uint64_t> want = FullSortTopK(x, k);
    for (TopKAlgorithm a : {TopKAlgorithm::kAuto, TopKAlgorithm::kNthElement,
                            TopKAlgorithm::kSampledThreshold}) {
      for (size_t pieces : {1, 3}) {
        for (bool vector : {true, false}) {  // the AVX2 candidate scan and the portable one
          UseVectorSelection(vector);
          const std::vector<uint64_t> got = Select(x, k, a, nullptr, pieces);
          UseVectorSelection(true);
          ASSERT_EQ(got, want) << what << " n=" << n << " k=" << k << " algorithm="
                               << static_cast<int>(a) << " pieces=" << pieces
                               << " vector=" << vector;
        }
      }
    }
  }
}

TEST(TopKTest, AgreesWithAFullSortOnRandomInputs) {
  std::mt19937 gen(1);
  std::normal_distribution<float> d;
  for (size_t n : {1, 7, 100, 5000, 40000, 200000}) {
    std::vector<float> x(n);
    for (float& v : x) v = d(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 20) - 10);
    ExpectAgreesWithFullSort(x, "normal");
  }
}

TEST(TopKTest, AgreesWithAFullSortOnAdversarialInputs) {
  std::mt19937 gen(2);
  const size_t n = 50000;
  std::vector<float> x(n);
  // Every magnitude equal (signs alternate): the lowest indices win.
  for (size_t i = 0; i < n; ++i) x[i] = i % 2 ? -1.5f : 1.5f;
  ExpectAgreesWithFullSort(x, "all equal");
  EXPECT_EQ(Select(x, 3, TopKAlgorithm::kSampledThreshold), (std::vector<uint64_t>{0, 1, 2}));
  // Three magnitudes, many ties at each.
  for (float& v : x) v = static_cast<float>(static_cast<int>(gen() % 5) - 2);
  ExpectAgreesWithFullSort(x, "few distinct magnitudes");
  // Mostly zeros (+0 and -0, equal), a few spikes.
  for (size_t i = 0; i < n; ++i) x[i] = i % 2 ? -0.0f : 0.0f;
  for (int s = 0; s < 40; ++s) x[gen() % n] = static_cast<float>(s + 1);
  ExpectAgreesWithFullSort(x, "sparse spikes");
  // Sorted ascending (the largest at the end) and subnormals next to huge values.
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) * 1e-3f;
  ExpectAgreesWithFullSort(x, "ascending");
  for (size_t i = 0; i < n; ++i) {
    x[i] = i % 3 == 0 ? std::numeric_limits<float>::denorm_min() * static_cast<float>(i % 7)
                      : std::ldexp(1.0f, static_cast<int>(gen() % 250) - 125);
  }
  ExpectAgreesWithFullSort(x, "subnormals and extremes");
}

TEST(TopKTest, SampledThresholdRunsOnGradientsAndFallsBackOnTies) {
  std::mt19937 gen(3);
  std::normal_distribution<float> d;
  std::vector<float> x(200000);
  for (float& v : x) v = d(gen);
  TopKAlgorithm ran;
  Select(x, 2000, TopKAlgorithm::kAuto, &ran);
  EXPECT_EQ(ran, TopKAlgorithm::kSampledThreshold) << "1% of 200000 normals: sampled";
  Select(x, 100000, TopKAlgorithm::kAuto, &ran);
  EXPECT_EQ(ran, TopKAlgorithm::kNthElement) << "half of the elements: nth_element";
  std::fill(x.begin(), x.end(), 2.0f);
  Select(x, 2000, TopKAlgorithm::kSampledThreshold, &ran);
  EXPECT_EQ(ran, TopKAlgorithm::kNthElement) << "all ties: the sample's threshold takes too many";
}

TEST(TopKTest, MagnitudeKeysOrderAsMagnitudes) {
  EXPECT_EQ(MagnitudeKey(-INFINITY), kNonFiniteKey);
  EXPECT_GT(MagnitudeKey(NAN), kNonFiniteKey);
  EXPECT_LT(MagnitudeKey(3e38f), kNonFiniteKey);
  EXPECT_EQ(MagnitudeKey(-0.0f), MagnitudeKey(0.0f));
  EXPECT_LT(MagnitudeKey(-1.0f), MagnitudeKey(1.5f));
  EXPECT_LT(MagnitudeKey(std::numeric_limits<float>::denorm_min()), MagnitudeKey(1e-38f));
}

TEST(TopKTest, FusedKernelsMatchTheirDefinitions) {
  std::vector<float> g = {1.0f, -2.0f, 0.5f, -0.0f}, m = {0.25f, 2.0f, -4.0f, 0.0f};
  EXPECT_EQ(MaxKeyOfSum(g.data(), m.data(), 4), MagnitudeKey(-3.5f));
  EXPECT_EQ(MaxKeyOfSum(g.data(), nullptr, 4), MagnitudeKey(-2.0f));
  std::vector<float> big = {1.0f, 3e38f};
  EXPECT_EQ(MaxKeyOfSum(big.data(), big.data(), 2), kNonFiniteKey) << "overflow to infinity";
  EXPECT_GE(MaxKeyOfSum(std::vector<float>{0.0f, NAN}.data(), nullptr, 2), kNonFiniteKey);
  std::vector<float> mem = {1.0f, 2.0f}, q = {4.0f, -8.0f};
  AddFilterAndClear(mem.data(), q.data(), 2, 0.25f);  // p = {5, -6}
  EXPECT_EQ(mem, (std::vector<float>{0.75f * 1.0f + 0.25f * 5.0f, 0.75f * 2.0f - 0.25f * 6.0f}));
  EXPECT_EQ(q, (std::vector<float>{0.0f, 0.0f}));
  mem = {1.0f, 2.0f};
  q = {4.0f, -8.0f};
  AddFilterAndClear(mem.data(), q.data(), 2, 1.0f);
  EXPECT_EQ(mem, (std::vector<float>{5.0f, -6.0f}));
  EXPECT_EQ(q, (std::vector<float>{0.0f, 0.0f}));
}

// The selection of g + m formed on the fly equals the selection of the materialized sum, and a
// non-finite sum (even one overflowing from finite parts) is reported, never selected from.
TEST(TopKTest, SelectsFromTheSumAndRefusesNonFiniteInput) {
  std::mt19937 gen(4);
  std::normal_distribution<float> d;
  for (size_t n : {1000, 100000}) {
    std::vector<float> g(n), m(n), p(n);
    for (size_t i = 0; i < n; ++i) {
      g[i] = d(gen);
      m[i] = d(gen);
      p[i] = g[i] + m[i];
    }
    for (TopKAlgorithm a : {TopKAlgorithm::kNthElement, TopKAlgorithm::kSampledThreshold}) {
      const FloatSegment seg{g.data(), n, m.data()};
      TopKSelector sel;
      std::vector<uint64_t> got;
      ASSERT_TRUE(sel.Select(absl::MakeConstSpan(&seg, 1), n / 100, &got, a));
      EXPECT_EQ(got, FullSortTopK(p, n / 100)) << n;
      for (float bad : {NAN, INFINITY}) {
        g[n / 2] = bad;
        got = {1, 2, 3};
        EXPECT_FALSE(sel.Select(absl::MakeConstSpan(&seg, 1), n / 100, &got, a)) << bad;
        EXPECT_TRUE(got.empty());
        g[n / 2] = 0.0f;
      }
      g[7] = 3e38f;
      m[7] = 3e38f;
      EXPECT_FALSE(sel.Select(absl::MakeConstSpan(&seg, 1), n / 100, &got, a)) << "overflow";
      EXPECT_FALSE(sel.Select(absl::MakeConstSpan(&seg, 1), n, &got, a)) << "k = N: checked too";
      g[7] = m[7] = 1.0f;
    }
  }
}

TEST(SparsePlanTest, KIsDenseSizeOverRatioRoundedUp) {
  EXPECT_EQ(SparseK(4810, 50), 97u);
  EXPECT_EQ(SparseK(4810, 100), 49u);
  EXPECT_EQ(SparseK(10, 100), 1u) << "at least one element";
  EXPECT_EQ(SparseK(0, 100), 0u);
  EXPECT_EQ(SparseK(5, 1), 5u);
  EXPECT_EQ(SparseK(100, 1.5), 67u);
  EXPECT_EQ(SparseK(16777216, 100), 167773u);
}

TEST(SparsePlanTest, BucketAndTensorGranularity) {
  SparseOptions o;
  o.ratio = 100;
  const std::vector<size_t> counts = {300, 0, 7};
  SparsePlan b = PlanSparse(counts, o);
  EXPECT_EQ(b.offset, (std::vector<uint64_t>{0, 300, 300, 307}));
  EXPECT_EQ(b.k, (std::vector<size_t>{4}));
  EXPECT_EQ(b.total_k, 4u);
  EXPECT_EQ(b.index_bytes, 4u);
  o.granularity = SparseGranularity::kTensor;
  SparsePlan t = PlanSparse(counts, o);
  EXPECT_EQ(t.k, (std::vector<size_t>{3, 0, 1}));
  EXPECT_EQ(t.total_k, 4u);
  // int32 indices up to 2^31 - 1 elements, int64 from 2^31 (planned, not allocated).
  EXPECT_EQ(PlanSparse(std::vector<size_t>{(size_t{1} << 31) - 1}, o).index_bytes, 4u);
  EXPECT_EQ(PlanSparse(std::vector<size_t>{size_t{1} << 30, size_t{1} << 30}, o).index_bytes, 8u);
}

std::string Canon(const char* spec) {
  auto s = ParseCompressionSpec(spec);
  return s.ok() ? s->canonical : s.status().ToString();
}

TEST(SparseRegistryTest, SpecsAndCanonicalForms) {
  EXPECT_EQ(Canon("scalecomp"), "scalecomp");
  EXPECT_EQ(Canon("scalecomp:ratio=100,beta=1.0,start_step=0,leader=cyclic,granularity=bucket"),
            "scalecomp");
  EXPECT_EQ(Canon("scalecomp:ratio=50"), "scalecomp:ratio=50");
  EXPECT_EQ(Canon("scalecomp:granularity=tensor,leader=0,ratio=150.0,beta=0.1,start_step=5"),
            "scalecomp:beta=0.1,granularity=tensor,leader=0,ratio=150,start_step=5");
  EXPECT_EQ(Canon("topk:ratio=70"), "topk:ratio=70");
  EXPECT_EQ(Canon("randomk:ratio=2.5,granularity=tensor"), "randomk:granularity=tensor,ratio=2.5");
  EXPECT_EQ(Canon("fp4:ef=1,beta=0.5"), "fp4:beta=0.5,ef=1");
  EXPECT_EQ(Canon("int4:ef=1,beta=1.0"), "int4:ef=1");
  CompressionSpec s = ParseCompressionSpec("scalecomp:ratio=70,start_step=3").value();
  EXPECT_EQ(s.FloatOption("ratio"), 70.0);
  EXPECT_EQ(s.FloatOption("beta"), 1.0);
  EXPECT_EQ(s.start_step, 3);
  EXPECT_EQ(s.options.at("leader"), "cyclic");
  const std::vector<std::string> methods = CompressionMethods();
  for (const char* m : {"scalecomp", "topk", "randomk"}) {
    EXPECT_NE(std::find(methods.begin(), methods.end(), m), methods.end()) << m;
  }
  EXPECT_EQ(std::find(methods.begin(), methods.end(), "test_randomk"), methods.end());
  for (const char* spec : {"scalecomp", "topk", "randomk:ratio=3"}) {
    auto c = CreateCompressor(ParseCompressionSpec(spec).value());
    ASSERT_TRUE(c.ok()) << spec;
    EXPECT_EQ((*c)->spec(), Canon(spec));
  }
}

TEST(SparseRegistryTest, BadOptionsSayWhatIsValid) {
  EXPECT_EQ(Canon("scalecomp:ratio=0.5"),
            "INVALID_ARGUMENT: compression 'scalecomp:ratio=0.5': option 'ratio' must be a "
            "number in [1, 1e12], got '0.5'");
  EXPECT_EQ(Canon("scalecomp:ratio=inf"),
            "INVALID_ARGUMENT: compression 'scalecomp:ratio=inf': option 'ratio' must be a "
            "number in [1, 1e12], got 'inf'");
  EXPECT_EQ(Canon("scalecomp:beta=0"),
            "INVALID_ARGUMENT: compression 'scalecomp:beta=0': option 'beta' must be a number "
            "in (0, 1], got '0'");
  EXPECT_EQ(Canon("scalecomp:granularity=layer"),
            "INVALID_ARGUMENT: compression 'scalecomp:granularity=layer': option 'granularity' "
            "must be bucket or tensor, got 'layer'");
  EXPECT_EQ(Canon("scalecomp:leader=-1"),
            "INVALID_ARGUMENT: compression 'scalecomp:leader=-1': option 'leader' must be cyclic "
            "or a rank (an integer >= 0), got '-1'");
  EXPECT_EQ(Canon("topk:leader=0"),
            "INVALID_ARGUMENT: compression 'topk:leader=0': unknown option 'leader' for topk; "
            "valid options: ratio, beta, start_step, granularity");
  EXPECT_EQ(Canon("fp4:beta=0.5"),
            "INVALID_ARGUMENT: compression 'fp4:beta=0.5': option 'beta' filters the "
            "error-feedback memory: it needs ef=1");
}

}  // namespace
}  // namespace braid::compression
