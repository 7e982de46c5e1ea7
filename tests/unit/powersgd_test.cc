// Unit tests of PowerSGD (compression/powersgd.h) against a reference written here with plain
// loops in double precision, over an in-process world of threads whose all-reduce sums in
// rank order. The reference follows the paper's Algorithm 1 with error feedback: P = Σ_w M_w·Q,
// P̂ = Gram–Schmidt(P) (classical here; braid uses the modified form), Q̂ = mean_w M_wᵀ·P̂,
// result P̂·Q̂ᵀ, residual M_w − P̂·Q̂ᵀ.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/powersgd.h"
#include "compression/registry.h"
#include "compression/stage.h"
#include "gtest/gtest.h"

namespace braid::compression {
namespace {

// ---- An in-process world: N threads, an all-reduce that sums in rank order ----------------

class Hub {
 public:
  explicit Hub(int n) : n_(n), inputs_(n) {}

  absl::Status AllReduce(int rank, const float* send, float* recv, size_t count, ReduceOp op) {
    std::unique_lock<std::mutex> lock(mu_);
    inputs_[rank] = send;
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      result_.assign(count, 0.0f);
      for (int r = 0; r < n_; ++r) {
        for (size_t k = 0; k < count; ++k) result_[k] += inputs_[r][k];
      }
      if (op == ReduceOp::kAverage) {
        for (float& v : result_) v /= static_cast<float>(n_);
      }
      history_.push_back(result_);
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, std::chrono::seconds(30),
                             [&] { return generation_ != gen; })) {
      return absl::DeadlineExceededError("a rank never reached the all-reduce");
    }
    std::copy(result_.begin(), result_.end(), recv);
    return absl::OkStatus();
  }
  // Every all-reduce's result, in order.
  std::vector<std::vector<float>> history() {
    std::lock_guard<std::mutex> lock(mu_);
    return history_;
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<const float*> inputs_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<float> result_;
  std::vector<std::vector<float>> history_;
};

class HubCommunicator : public transport::Communicator {
 public:
  HubCommunicator(Hub* hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override {
    ++all_reduces;
    if (dtype != DataType::kFloat32) return absl::UnimplementedError("float32 only");
    return hub_->AllReduce(rank_, static_cast<const float*>(send), static_cast<float*>(recv),
                           count, op);
  }
  absl::Status ReduceScatter(const void*, void*, absl::Span<const size_t>, DataType,
                             ReduceOp) override {
    return absl::UnimplementedError("unused");
  }
  absl::Status AllGather(const void*, size_t, void*, absl::Span<const size_t>) override {
    return absl::UnimplementedError("unused");
  }
  absl::Status AllToAll(const void*, absl::Span<const size_t>, void*,
                        absl::Span<const size_t>) override {
    return absl::UnimplementedError("unused");
  }
  absl::Status Broadcast(void*, size_t, int) override { return absl::UnimplementedError("unused"); }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort(absl::Status) override {}
  transport::TransportStats stats() const override { return {}; }
  std::string Describe() const override { return "threads"; }
  int all_reduces = 0;

 private:
  Hub* hub_;
  int rank_, size_;
};

// Runs body(rank, comm) on `n` threads, one world.
void RunWorld(int n, const std::function<void(int, HubCommunicator&)>& body, Hub* hub = nullptr) {
  Hub own(n);
  if (hub == nullptr) hub = &own;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      HubCommunicator comm(hub, r, n);
      body(r, comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

// ---- Inputs, the reference, and the documented state format -------------------------------

std::vector<float> Gaussian(uint32_t seed, size_t n, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d;
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(scale * d(gen));
  return x;
}

std::unique_ptr<Compressor> Make(const std::string& spec) {
  return CreateCompressor(ParseCompressionSpec(spec).value()).value();
}

using Mat = std::vector<double>;  // row-major

struct Reference {
  Mat p_sum, p_hat, q_mean, out;  // rows × R, rows × R, cols × R, rows × cols
  std::vector<Mat> residual;      // per rank, rows × cols
};

// One PowerSGD step of the mean of m[w] (rows × cols, float inputs, error feedback already
// added) from q (cols × R), in double, classical Gram–Schmidt.
Reference RefStep(const std::vector<std::vector<float>>& m, const std::vector<float>& q,
                  int rows, int cols, int R) {
  const int W = static_cast<int>(m.size());
  Reference ref;
  ref.p_sum.assign(rows * R, 0.0);
  for (int w = 0; w < W; ++w) {
    for (int i = 0; i < rows; ++i) {
      for (int c = 0; c < R; ++c) {
        double s = 0;
        for (int j = 0; j < cols; ++j) s += double(m[w][i * cols + j]) * q[j * R + c];
        ref.p_sum[i * R + c] += s;
      }
    }
  }
  ref.p_hat = ref.p_sum;
  for (int c = 0; c < R; ++c) {
    Mat v(rows);
    for (int i = 0; i < rows; ++i) v[i] = ref.p_sum[i * R + c];
    for (int k = 0; k < c; ++k) {
      double dot = 0;
      for (int i = 0; i < rows; ++i) dot += ref.p_hat[i * R + k] * ref.p_sum[i * R + c];
      for (int i = 0; i < rows; ++i) v[i] -= dot * ref.p_hat[i * R + k];
    }
    double norm = 0;
    for (double x : v) norm += x * x;
    norm = std::sqrt(norm);
    for (int i = 0; i < rows; ++i) ref.p_hat[i * R + c] = norm > 0 ? v[i] / norm : 0.0;
  }
  ref.q_mean.assign(cols * R, 0.0);
  for (int w = 0; w < W; ++w) {
    for (int j = 0; j < cols; ++j) {
      for (int c = 0; c < R; ++c) {
        double s = 0;
        for (int i = 0; i < rows; ++i) s += double(m[w][i * cols + j]) * ref.p_hat[i * R + c];
        ref.q_mean[j * R + c] += s / W;
      }
    }
  }
  ref.out.assign(rows * cols, 0.0);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double s = 0;
      for (int c = 0; c < R; ++c) s += ref.p_hat[i * R + c] * ref.q_mean[j * R + c];
      ref.out[i * cols + j] = s;
    }
  }
  for (int w = 0; w < W; ++w) {
    Mat e(rows * cols);
    for (size_t k = 0; k < e.size(); ++k) e[k] = m[w][k] - ref.out[k];
    ref.residual.push_back(e);
  }
  return ref;
}

template <typename A, typename B>
void ExpectClose(const A& got, const B& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (auto v : want) scale = std::max(scale, std::fabs(double(v)));
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_NEAR(double(got[k]), double(want[k]), tol * (scale + 1e-30)) << what << " [" << k << "]";
  }
}

// The per-tensor state of a PowerSGD SaveState blob, read with the format of powersgd.h.
struct SavedTensor {
  int64_t rows = 0, cols = 0;
  uint32_t rank = 0;
  std::vector<float> q, residual;
};
template <typename T>
T Take(const std::string& b, size_t* at) {
  T v;
  std::memcpy(&v, b.data() + *at, sizeof v);
  *at += sizeof v;
  return v;
}
std::vector<float> TakeFloats(const std::string& b, size_t* at) {
  const uint64_t n = Take<uint64_t>(b, at);
  std::vector<float> v(n);
  std::memcpy(v.data(), b.data() + *at, n * sizeof(float));
  *at += n * sizeof(float);
  return v;
}
std::map<std::string, SavedTensor> ParseState(const std::string& b) {
  std::map<std::string, SavedTensor> out;
  EXPECT_EQ(b.substr(0, 4), "PSGD");
  size_t at = 4;
  EXPECT_EQ(Take<uint32_t>(b, &at), 1u);
  const uint32_t n = Take<uint32_t>(b, &at);
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t len = Take<uint64_t>(b, &at);
    std::string name = b.substr(at, len);
    at += len;
    SavedTensor t;
    t.rows = Take<int64_t>(b, &at);
    t.cols = Take<int64_t>(b, &at);
    t.rank = Take<uint32_t>(b, &at);
    t.q = TakeFloats(b, &at);
    t.residual = TakeFloats(b, &at);
    out[name] = t;
  }
  EXPECT_EQ(at, b.size());
  return out;
}
std::map<std::string, SavedTensor> StateOf(const Compressor& c) {
  std::string b;
  EXPECT_TRUE(c.SaveState(&b).ok());
  return ParseState(b);
}

absl::Status ReduceOnce(Compressor& c, transport::Communicator& comm,
                        std::vector<TensorView> views, int64_t step,
                        std::vector<uint64_t>* payload = nullptr, ReduceOp op = ReduceOp::kAverage) {
  std::vector<int64_t> steps(views.size(), step);
  std::vector<uint64_t> own;
  if (payload == nullptr) payload = &own;
  payload->assign(views.size(), 0);
  StepContext ctx;
  ctx.op = op;
  ctx.seed = 7;
  ctx.steps = steps;
  ctx.payload_bytes = absl::MakeSpan(*payload);
  return c.Reduce(views, comm, ctx);
}

// ---- Planning: which tensors are compressed, and the payload --------------------------------

// ResNet-18 for CIFAR-10 (3×3 first convolution, no max-pool, 10 classes): its 62 gradient
// tensors in torchvision's order (conv weights out × in × kh × kw, batch-norm weight and
// bias, the classifier 10 × 512 and its bias).
std::vector<std::vector<int64_t>> ResNet18Cifar10() {
  std::vector<std::vector<int64_t>> s = {{64, 3, 3, 3}, {64}, {64}};
  const struct { int64_t in, out; bool down; } blocks[] = {
      {64, 64, false},   {64, 64, false},   {64, 128, true},  {128, 128, false},
      {128, 256, true},  {256, 256, false}, {256, 512, true}, {512, 512, false}};
  for (const auto& b : blocks) {
    s.push_back({b.out, b.in, 3, 3});
    s.push_back({b.out});
    s.push_back({b.out});
    s.push_back({b.out, b.out, 3, 3});
    s.push_back({b.out});
    s.push_back({b.out});
    if (b.down) {
      s.push_back({b.out, b.in, 1, 1});
      s.push_back({b.out});
      s.push_back({b.out});
    }
  }
  s.push_back({10, 512});
  s.push_back({10});
  return s;
}

double ResNetRatio(int rank, double min_rate, std::vector<PowerSgdPlan>* plans = nullptr) {
  PowerSgdOptions o;
  o.rank = rank;
  o.min_compression_rate = min_rate;
  uint64_t raw = 0, payload = 0;
  for (const auto& shape : ResNet18Cifar10()) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    raw += 4 * n;
    PowerSgdPlan p = PlanPowerSgd(shape, o);
    payload += p.payload_bytes;
    if (plans) plans->push_back(p);
  }
  return static_cast<double>(raw) / static_cast<double>(payload);
}

TEST(PowerSgdPlanTest, ResNet18Cifar10PayloadRatios) {
  const auto shapes = ResNet18Cifar10();
  ASSERT_EQ(shapes.size(), 62u);
  int64_t params = 0;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    params += n;
  }
  ASSERT_EQ(params, 11173962);
  EXPECT_NEAR(ResNetRatio(1, 2), 243.3, 0.05);
  EXPECT_NEAR(ResNetRatio(2, 2), 135.8, 0.05);
  EXPECT_NEAR(ResNetRatio(4, 2), 72.1, 0.05);
  std::vector<PowerSgdPlan> plans;
  EXPECT_NEAR(ResNetRatio(8, 2, &plans), 37.1, 0.05);
  // At rank 8 the classifier's (10 + 512)·8·2 >= 5120: sent uncompressed.
  EXPECT_FALSE(plans[60].compressed);
  EXPECT_EQ(plans[60].payload_bytes, 4u * 5120);
  EXPECT_TRUE(plans[57].compressed);  // layer4.1.conv2: 512 × 4608
  EXPECT_NEAR(ResNetRatio(4, 4), 70.75, 0.005);
}

TEST(PowerSgdPlanTest, MatrixViewAndWhatStaysUncompressed) {
  PowerSgdOptions o;
  o.rank = 2;
  PowerSgdPlan p = PlanPowerSgd(std::vector<int64_t>{8, 3, 3, 3}, o);  // 8 × 27
  EXPECT_TRUE(p.compressed);
  EXPECT_EQ(p.rows, 8);
  EXPECT_EQ(p.cols, 27);
  EXPECT_EQ(p.payload_bytes, (8u + 27u) * 2 * 4);
  // (8 + 8)·2·2 = 64 is not below 64: uncompressed.
  EXPECT_FALSE(PlanPowerSgd(std::vector<int64_t>{8, 8}, o).compressed);
  EXPECT_TRUE(PlanPowerSgd(std::vector<int64_t>{8, 9}, o).compressed);
  EXPECT_FALSE(PlanPowerSgd(std::vector<int64_t>{1000}, o).compressed);
  EXPECT_EQ(PlanPowerSgd(std::vector<int64_t>{1000}, o).payload_bytes, 4000u);
  EXPECT_FALSE(PlanPowerSgd(std::vector<int64_t>{}, o).compressed);
  EXPECT_FALSE(PlanPowerSgd(std::vector<int64_t>{1, 1000}, o).compressed);
  EXPECT_FALSE(PlanPowerSgd(std::vector<int64_t>{0, 5}, o).compressed);
  EXPECT_EQ(PlanPowerSgd(std::vector<int64_t>{0, 5}, o).payload_bytes, 0u);
}

// The element count is common/limits.h's checked one: a shape whose product overflows (or a
// negative dimension) plans as an empty tensor, never as a wrapped count.
TEST(PowerSgdPlanTest, AShapeBeyondTheLimitsPlansAsEmpty) {
  PowerSgdOptions o;
  o.rank = 2;
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{(int64_t{1} << 40) + 1, int64_t{1} << 30},
        std::vector<int64_t>{-4, 5}}) {
    const PowerSgdPlan p = PlanPowerSgd(shape, o);
    EXPECT_FALSE(p.compressed) << shape[0];
    EXPECT_EQ(p.payload_bytes, 0u) << shape[0];
  }
}

// ---- Orthogonalization ------------------------------------------------------------------------

TEST(PowerSgdOrthogonalizeTest, ColumnsBecomeOrthonormal) {
  const size_t rows = 50, cols = 4;
  std::vector<float> p = Gaussian(3, rows * cols, 1e3);
  Orthogonalize(p.data(), rows, cols, 0.0);
  for (size_t a = 0; a < cols; ++a) {
    for (size_t b = 0; b < cols; ++b) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += double(p[i * cols + a]) * p[i * cols + b];
      EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5) << a << "," << b;
    }
  }
}

TEST(PowerSgdOrthogonalizeTest, ZeroColumnStaysZeroForAnyEpsilon) {
  for (double eps : {0.0, 1e-8, 1.0}) {
    const size_t rows = 6, cols = 3;
    std::vector<float> p = Gaussian(4, rows * cols);
    for (size_t i = 0; i < rows; ++i) p[i * cols + 1] = 0.0f;  // the middle column
    Orthogonalize(p.data(), rows, cols, eps);
    for (size_t i = 0; i < rows; ++i) {
      EXPECT_EQ(p[i * cols + 1], 0.0f) << "eps " << eps;
      for (size_t c = 0; c < cols; ++c) EXPECT_TRUE(std::isfinite(p[i * cols + c]));
    }
  }
  std::vector<float> zeros(12, 0.0f);
  Orthogonalize(zeros.data(), 4, 3, 0.0);
  for (float v : zeros) EXPECT_EQ(v, 0.0f);
}

TEST(PowerSgdOrthogonalizeTest, TinyColumnStillNormalizes) {
  // Squares of 1e-30 underflow in float32; the column must still get unit norm.
  std::vector<float> p = {1e-30f, -2e-30f, 2e-30f};
  Orthogonalize(p.data(), 3, 1, 0.0);
  EXPECT_NEAR(p[0], 1.0 / 3, 1e-6);
  EXPECT_NEAR(p[1], -2.0 / 3, 1e-6);
  EXPECT_NEAR(p[2], 2.0 / 3, 1e-6);
}

// ---- The algorithm against the reference ----------------------------------------------------

TEST(PowerSgdTest, OneStepOnTwoRanksMatchesTheReference) {
  // A matrix, a conv kernel (8 × 27), and a bias that travels uncompressed.
  const int R = 2;
  const std::vector<std::vector<int64_t>> shapes = {{20, 12}, {8, 3, 3, 3}, {7}};
  const int rows[2] = {20, 8}, cols[2] = {12, 27};
  std::vector<std::vector<std::vector<float>>> in(2), out(2);  // [rank][tensor]
  for (int w = 0; w < 2; ++w) {
    for (size_t t = 0; t < shapes.size(); ++t) {
      int64_t n = 1;
      for (int64_t d : shapes[t]) n *= d;
      in[w].push_back(Gaussian(100 * w + t, n));
    }
  }
  std::vector<std::map<std::string, SavedTensor>> saved(2);
  std::vector<std::vector<uint64_t>> payload(2);
  std::vector<int> all_reduces(2);
  Hub hub(2);
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    auto c = Make("powersgd:rank=2");
    out[w] = in[w];
    std::vector<TensorView> views;
    const char* names[] = {"fc.weight", "conv.weight", "fc.bias"};
    for (size_t t = 0; t < shapes.size(); ++t) {
      views.push_back({names[t], shapes[t], out[w][t].data(), out[w][t].size()});
    }
    ASSERT_TRUE(ReduceOnce(*c, comm, views, 0, &payload[w]).ok());
    all_reduces[w] = comm.all_reduces;
    saved[w] = StateOf(*c);
  }, &hub);
  EXPECT_EQ(all_reduces[0], 2) << "one all-reduce of P (and the bias), one of Q";
  EXPECT_EQ(payload[0], (std::vector<uint64_t>{(20 + 12) * R * 4, (8 + 27) * R * 4, 7 * 4}));
  const auto history = hub.history();
  ASSERT_EQ(history.size(), 2u);
  size_t p_at = 0, q_at = 0;
  const char* names[] = {"fc.weight", "conv.weight"};
  for (int t = 0; t < 2; ++t) {
    std::vector<float> q(cols[t] * R);
    DrawQ(7, names[t], 0, q.data(), q.size());  // the first step's draw (seed 7, step 0)
    const Reference ref = RefStep({in[0][t], in[1][t]}, q, rows[t], cols[t], R);
    const std::string tag = names[t];
    ExpectClose(std::vector<float>(history[0].begin() + p_at, history[0].begin() + p_at + rows[t] * R),
                ref.p_sum, 1e-5, tag + " P = Σ M_w·Q");
    ExpectClose(std::vector<float>(history[1].begin() + q_at, history[1].begin() + q_at + cols[t] * R),
                ref.q_mean, 1e-5, tag + " Q = mean M_wᵀ·P̂");
    p_at += rows[t] * R;
    q_at += cols[t] * R;
    for (int w = 0; w < 2; ++w) {
      ExpectClose(out[w][t], ref.out, 1e-5, tag + " P̂·Q̂ᵀ on rank " + std::to_string(w));
      ExpectClose(saved[w][tag].residual, ref.residual[w], 1e-5, tag + " residual");
      ExpectClose(saved[w][tag].q, ref.q_mean, 1e-5, tag + " warm-start Q");
    }
    EXPECT_EQ(out[0][t], out[1][t]) << tag << ": ranks differ";
  }
  // The bias: exactly averaged, after P in the same all-reduce.
  for (int k = 0; k < 7; ++k) {
    EXPECT_EQ(out[0][2][k], (in[0][2][k] + in[1][2][k]) / 2.0f);
    EXPECT_EQ(out[1][2][k], out[0][2][k]);
  }
}

// Ranks above 4 take sgemm instead of one sgemv per column: the same algorithm.
TEST(PowerSgdTest, LargeRankMatchesTheReference) {
  const int rows = 40, cols = 36, R = 6;
  std::vector<int64_t> shape = {rows, cols};
  std::vector<std::vector<float>> in(2), out(2);
  std::vector<std::map<std::string, SavedTensor>> saved(2);
  for (int w = 0; w < 2; ++w) in[w] = Gaussian(300 + w, rows * cols);
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    auto c = Make("powersgd:rank=6");
    out[w] = in[w];
    ASSERT_TRUE(ReduceOnce(*c, comm, {{"big", shape, out[w].data(), out[w].size()}}, 0).ok());
    saved[w] = StateOf(*c);
  });
  std::vector<float> q(cols * R);
  DrawQ(7, "big", 0, q.data(), q.size());
  const Reference ref = RefStep(in, q, rows, cols, R);
  for (int w = 0; w < 2; ++w) {
    ExpectClose(out[w], ref.out, 1e-5, "rank 6 result");
    ExpectClose(saved[w]["big"].residual, ref.residual[w], 1e-5, "rank 6 residual");
  }
}

TEST(PowerSgdTest, SumIsWorldSizeTimesTheAverageAndKeepsTheSameResidual) {
  std::vector<std::vector<float>> avg(2), sum(2);
  std::vector<std::map<std::string, SavedTensor>> s_avg(2), s_sum(2);
  std::vector<int64_t> shape = {16, 10};
  for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kSum}) {
    RunWorld(2, [&](int w, HubCommunicator& comm) {
      auto c = Make("powersgd:rank=2");
      std::vector<float> x = Gaussian(w + 1, 160);
      ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", shape, x.data(), x.size()}}, 0, nullptr, op).ok());
      (op == ReduceOp::kSum ? sum : avg)[w] = x;
      (op == ReduceOp::kSum ? s_sum : s_avg)[w] = StateOf(*c);
    });
  }
  for (size_t k = 0; k < 160; ++k) EXPECT_EQ(sum[0][k], 2.0f * avg[0][k]);
  EXPECT_EQ(s_sum[1]["w"].residual, s_avg[1]["w"].residual);
}

TEST(PowerSgdTest, MatrixOfExactRankIsRecoveredInOneStep) {
  // Both ranks' matrices share one column space of dimension R, so P spans it and
  // P̂·P̂ᵀ·mean(M) = mean(M).
  const int rows = 30, cols = 24, R = 3;
  const std::vector<float> u = Gaussian(11, rows * R);
  std::vector<std::vector<float>> m(2), out(2);
  for (int w = 0; w < 2; ++w) {
    const std::vector<float> v = Gaussian(20 + w, cols * R);
    m[w].assign(rows * cols, 0.0f);
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        double s = 0;
        for (int c = 0; c < R; ++c) s += double(u[i * R + c]) * v[j * R + c];
        m[w][i * cols + j] = static_cast<float>(s);
      }
    }
  }
  std::vector<int64_t> shape = {rows, cols};
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    auto c = Make("powersgd:rank=3,ef=0");
    out[w] = m[w];
    ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", shape, out[w].data(), out[w].size()}}, 0).ok());
  });
  std::vector<double> mean(rows * cols);
  for (size_t k = 0; k < mean.size(); ++k) mean[k] = (double(m[0][k]) + m[1][k]) / 2;
  ExpectClose(out[0], mean, 1e-5, "rank-3 mean recovered");
}

// Orthonormal columns (rows × k) by Gram–Schmidt in double, from Gaussian draws.
Mat Orthonormal(uint32_t seed, int rows, int k) {
  std::vector<float> g = Gaussian(seed, rows * k);
  Mat a(g.begin(), g.end());
  for (int c = 0; c < k; ++c) {
    for (int p = 0; p < c; ++p) {
      double dot = 0;
      for (int i = 0; i < rows; ++i) dot += a[i * k + p] * a[i * k + c];
      for (int i = 0; i < rows; ++i) a[i * k + c] -= dot * a[i * k + p];
    }
    double n = 0;
    for (int i = 0; i < rows; ++i) n += a[i * k + c] * a[i * k + c];
    for (int i = 0; i < rows; ++i) a[i * k + c] /= std::sqrt(n);
  }
  return a;
}

TEST(PowerSgdTest, WarmStartReachesTheBestRankRApproximation) {
  // M = U·diag(σ)·Vᵀ, full rank, σ_k = 10·0.85^k: the best rank-2 error (Eckart–Young) is
  // sqrt(Σ_{k>=2} σ_k²). Without error feedback, warm-started steps are subspace iteration.
  const int rows = 40, cols = 30, R = 2;
  const Mat u = Orthonormal(1, rows, cols), v = Orthonormal(2, cols, cols);
  std::vector<double> sigma(cols);
  double best = 0;
  for (int k = 0; k < cols; ++k) {
    sigma[k] = 10 * std::pow(0.85, k);
    if (k >= R) best += sigma[k] * sigma[k];
  }
  best = std::sqrt(best);
  std::vector<float> m(rows * cols);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double s = 0;
      for (int k = 0; k < cols; ++k) s += u[i * cols + k] * sigma[k] * v[j * cols + k];
      m[i * cols + j] = static_cast<float>(s);
    }
  }
  std::vector<int64_t> shape = {rows, cols};
  std::vector<double> errors;
  RunWorld(1, [&](int, HubCommunicator& comm) {
    auto c = Make("powersgd:rank=2,ef=0");
    for (int step = 0; step < 30; ++step) {
      std::vector<float> x = m;
      ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", shape, x.data(), x.size()}}, step).ok());
      double e = 0;
      for (size_t k = 0; k < x.size(); ++k) e += (double(m[k]) - x[k]) * (double(m[k]) - x[k]);
      errors.push_back(std::sqrt(e));
    }
  });
  EXPECT_LE(errors.back(), 1.01 * best) << "after 30 steps; best rank-2 error " << best;
  EXPECT_GE(errors.back(), 0.999 * best) << "no rank-2 matrix does better";
  EXPECT_GT(errors.front(), 1.01 * best) << "a random start is not already optimal";
}

TEST(PowerSgdTest, ZeroGradientGivesZeroAndTheWarmStartRecovers) {
  std::vector<int64_t> shape = {12, 9};
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    auto c = Make("powersgd:rank=2");
    std::vector<float> zero(108, 0.0f);
    ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", shape, zero.data(), zero.size()}}, 0).ok());
    for (float v : zero) ASSERT_EQ(v, 0.0f);
    const SavedTensor s = StateOf(*c)["w"];
    for (float v : s.residual) ASSERT_EQ(v, 0.0f);
    for (float v : s.q) ASSERT_TRUE(std::isfinite(v));
    // The next, non-zero gradient is not stuck at zero: its Q was redrawn.
    std::vector<float> x = Gaussian(5, 108);
    ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", shape, x.data(), x.size()}}, 1).ok());
    double norm = 0;
    for (float v : x) norm += double(v) * v;
    EXPECT_GT(norm, 1.0);
  });
}

// ---- Non-finite input, state, layout ----------------------------------------------------------

TEST(PowerSgdTest, NonFiniteInputFailsEveryRankAndKeepsTheState) {
  std::vector<int64_t> sa = {10, 8}, sb = {6, 7}, sc = {5};
  // Reference run: steps 0 and 1 only. Faulty run: step 0, a NaN on rank 1 in 'b', step 1.
  std::vector<std::vector<float>> good(2), after(2);
  std::vector<std::string> errors(2);
  auto step_input = [](int w, int step, int t, size_t n) { return Gaussian(1000 * step + 10 * w + t, n); };
  for (bool faulty : {false, true}) {
    RunWorld(2, [&](int w, HubCommunicator& comm) {
      auto c = Make("powersgd:rank=2");
      auto run = [&](int step, bool poison, std::vector<float>* keep) {
        std::vector<float> a = step_input(w, step, 0, 80), b = step_input(w, step, 1, 42),
                           d = step_input(w, step, 2, 5);
        if (poison && w == 1) b[3] = std::numeric_limits<float>::quiet_NaN();
        absl::Status s = ReduceOnce(*c, comm, {{"a", sa, a.data(), 80}, {"b", sb, b.data(), 42},
                                                {"c", sc, d.data(), 5}}, step);
        if (keep) *keep = a;
        return s;
      };
      ASSERT_TRUE(run(0, false, nullptr).ok());
      if (faulty) {
        std::string before;
        ASSERT_TRUE(c->SaveState(&before).ok());
        absl::Status s = run(1, true, nullptr);
        errors[w] = std::string(s.message());
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        std::string now;
        ASSERT_TRUE(c->SaveState(&now).ok());
        EXPECT_EQ(now, before) << "the failed step changed the state";
      }
      ASSERT_TRUE(run(1, false, faulty ? &after[w] : &good[w]).ok());
    });
  }
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(errors[w],
              "powersgd:rank=2: tensor(s) 'b' hold NaN or infinite values (rank(s) 1); this "
              "bucket of 3 tensor(s) is not reduced and their PowerSGD state (Q, error-feedback "
              "residual) is kept from the previous step");
    EXPECT_EQ(after[w], good[w]) << "rank " << w << ": the bad step left a trace";
  }
}

TEST(PowerSgdTest, OverflowingSumIsReportedOnEveryRank) {
  std::vector<int64_t> shape = {3};
  std::vector<std::string> errors(2);
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    auto c = Make("powersgd");
    std::vector<float> x = {3e38f, 1.0f, 1.0f};
    errors[w] = std::string(ReduceOnce(*c, comm, {{"bias", shape, x.data(), 3}}, 0).message());
  });
  for (const std::string& e : errors) {
    EXPECT_EQ(e, "powersgd: tensor(s) 'bias' hold NaN or infinite values (no rank's own values: "
                 "their sum over the ranks overflowed); this bucket of 1 tensor(s) is not reduced "
                 "and their PowerSGD state (Q, error-feedback residual) is kept from the previous "
                 "step");
  }
}

TEST(PowerSgdTest, ResultDoesNotDependOnTheBucketLayout) {
  std::vector<int64_t> sa = {16, 12}, sb = {9, 14};
  std::vector<std::vector<float>> fused(2), split(2);
  for (bool separate : {false, true}) {
    RunWorld(2, [&](int w, HubCommunicator& comm) {
      auto c = Make("powersgd:rank=2");
      std::vector<float> last;
      for (int step = 0; step < 3; ++step) {
        std::vector<float> a = Gaussian(50 * step + w, 192), b = Gaussian(50 * step + w + 9, 126);
        if (separate && step > 0) {
          ASSERT_TRUE(ReduceOnce(*c, comm, {{"b", sb, b.data(), 126}}, step).ok());
          ASSERT_TRUE(ReduceOnce(*c, comm, {{"a", sa, a.data(), 192}}, step).ok());
        } else {
          ASSERT_TRUE(
              ReduceOnce(*c, comm, {{"a", sa, a.data(), 192}, {"b", sb, b.data(), 126}}, step).ok());
        }
        last = a;
        last.insert(last.end(), b.begin(), b.end());
      }
      (separate ? split : fused)[w] = last;
    });
  }
  EXPECT_EQ(split[0], fused[0]);
  EXPECT_EQ(split[1], fused[1]);
}

TEST(PowerSgdTest, ShapeChangeRestartsTheTensorsState) {
  std::vector<int64_t> before = {10, 10}, after = {20, 10};
  std::vector<float> restarted, fresh;
  RunWorld(1, [&](int, HubCommunicator& comm) {
    auto c = Make("powersgd:rank=2");
    std::vector<float> x = Gaussian(1, 100);
    ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", before, x.data(), 100}}, 0).ok());
    restarted = Gaussian(2, 200);
    ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", after, restarted.data(), 200}}, 1).ok());
    auto d = Make("powersgd:rank=2");
    fresh = Gaussian(2, 200);
    ASSERT_TRUE(ReduceOnce(*d, comm, {{"w", after, fresh.data(), 200}}, 1).ok());
  });
  EXPECT_EQ(restarted, fresh);
}

TEST(PowerSgdTest, LoadStateRejectsWhatItCannotUse) {
  auto c = Make("powersgd:rank=2");
  std::string good;
  {
    RunWorld(1, [&](int, HubCommunicator& comm) {
      std::vector<int64_t> shape = {12, 10};
      std::vector<float> x = Gaussian(1, 120);
      ASSERT_TRUE(ReduceOnce(*c, comm, {{"w", shape, x.data(), 120}}, 0).ok());
    });
    ASSERT_TRUE(c->SaveState(&good).ok());
  }
  EXPECT_EQ(std::string(Make("powersgd:rank=3")->LoadState(good).message()),
            "PowerSGD state for 'powersgd:rank=3': tensor 'w': saved with rank 2, but this "
            "compressor's rank is 3 (at byte 617)");
  EXPECT_EQ(std::string(Make("powersgd:rank=2")->LoadState(good.substr(0, 40)).message()),
            "PowerSGD state for 'powersgd:rank=2': tensor count 1 declared, but the 28 bytes "
            "left hold at most 0 (at byte 12)");
  EXPECT_EQ(Make("powersgd:rank=2")->LoadState("PSGX").message(),
            "PowerSGD state for 'powersgd:rank=2': does not start with \"PSGD\" (at byte 4)");
  EXPECT_EQ(Make("powersgd:rank=2,ef=0")->LoadState(good).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Make("powersgd:rank=2")->LoadState(good).ok());
  EXPECT_EQ(Make("fp4")->LoadState(good).message(),
            "compression 'fp4' keeps no state, but a non-empty one was given");
}

// ---- The stage: checkpoint at step 10, restore, bit-identical steps 11-15 --------------------

TEST(PowerSgdStageTest, CheckpointRestoresBitIdentically) {
  // start_step=3: the warm-up counters are part of the state too.
  const std::string spec_text = "powersgd:rank=2,start_step=3";
  std::vector<int64_t> sa = {24, 18}, sb = {18}, sc = {6, 3, 3, 3};
  auto step_inputs = [](int w, int step) {
    return std::vector<std::vector<float>>{Gaussian(7000 + 100 * step + w, 432),
                                           Gaussian(8000 + 100 * step + w, 18),
                                           Gaussian(9000 + 100 * step + w, 162)};
  };
  std::vector<std::vector<std::vector<float>>> first(2), resumed(2);  // [rank][step 11..15]
  std::vector<std::string> saved(2);
  auto run_steps = [&](CompressionStage& stage, transport::Communicator& comm, int w, int from,
                       int to, std::vector<std::vector<float>>* record) {
    const CompressionMethod& method = *stage.Resolve(spec_text).value();
    for (int step = from; step <= to; ++step) {
      auto x = step_inputs(w, step);
      std::vector<TensorView> views = {{"a", sa, x[0].data(), 432},
                                       {"b", sb, x[1].data(), 18},
                                       {"c", sc, x[2].data(), 162}};
      ASSERT_TRUE(stage.Reduce(method, views, ReduceOp::kAverage, comm).ok());
      if (record) {
        std::vector<float> all = x[0];
        all.insert(all.end(), x[1].begin(), x[1].end());
        all.insert(all.end(), x[2].begin(), x[2].end());
        record->push_back(all);
      }
    }
  };
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    CompressionStage stage(StageOptions{});
    run_steps(stage, comm, w, 1, 10, nullptr);
    saved[w] = stage.SaveState(w, 2).value();
    run_steps(stage, comm, w, 11, 15, &first[w]);
  });
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    CompressionStage stage(StageOptions{});  // a new job
    ASSERT_TRUE(stage.LoadState(saved[w], w, 2).ok());
    run_steps(stage, comm, w, 11, 15, &resumed[w]);
  });
  for (int w = 0; w < 2; ++w) {
    ASSERT_EQ(resumed[w].size(), 5u);
    for (int s = 0; s < 5; ++s) EXPECT_EQ(resumed[w][s], first[w][s]) << "rank " << w << " step " << 11 + s;
  }
  EXPECT_EQ(first[0], first[1]);
  // Without the state the same steps differ (the check above can fail).
  std::vector<std::vector<float>> cold;
  RunWorld(2, [&](int w, HubCommunicator& comm) {
    CompressionStage stage(StageOptions{});
    std::vector<std::vector<float>> rec;
    run_steps(stage, comm, w, 11, 15, &rec);
    if (w == 0) cold = rec;
  });
  EXPECT_NE(cold[4], first[0][4]);
}

TEST(PowerSgdStageTest, LoadStateValidatesBeforeChangingAnything) {
  CompressionStage stage(StageOptions{});
  EXPECT_EQ(stage.LoadState("BRDCMPST", 0, 1).message(),
            "compression state: truncated at byte 8 (4 more bytes expected, 0 left)");
  EXPECT_EQ(stage.LoadState("hello, world!", 0, 1).message(),
            "compression state: does not start with \"BRDCMPST\" (not a braid compression "
            "state) (at byte 8)");
  // A well-formed state naming an unknown method.
  std::string s = "BRDCMPST";
  auto u32 = [&](uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); };
  u32(1), u32(0), u32(1), u32(1);
  u64(4), s += "fp5:";
  u32(0), u64(0);
  EXPECT_EQ(stage.LoadState(s, 0, 1).message(),
            absl::StrCat("compression state: compression 'fp5:': unknown method 'fp5'; valid "
                         "methods: ", absl::StrJoin(CompressionMethods(), ", ")));
  EXPECT_EQ(stage.SaveState(0, 1).value().size(), 8u + 4 * 4 + 8) << "nothing was loaded";
}

// ---- Spec parsing ------------------------------------------------------------------------------

TEST(PowerSgdRegistryTest, CanonicalFormsAndErrors) {
  auto spec = ParseCompressionSpec("powersgd").value();
  EXPECT_EQ(spec.canonical, "powersgd");
  EXPECT_EQ(spec.IntOption("rank"), 1);
  EXPECT_EQ(spec.FloatOption("min_compression_rate"), 2.0);
  EXPECT_EQ(spec.IntOption("ef"), 1);
  EXPECT_EQ(spec.IntOption("warm_start"), 1);
  EXPECT_EQ(spec.FloatOption("orthogonalization_epsilon"), 0.0);
  EXPECT_EQ(spec.start_step, 0);
  EXPECT_EQ(ParseCompressionSpec("powersgd:rank=1,min_compression_rate=2.0").value().canonical,
            "powersgd");
  EXPECT_EQ(ParseCompressionSpec("powersgd:warm_start=0,rank=4,orthogonalization_epsilon=1e-8")
                .value()
                .canonical,
            "powersgd:orthogonalization_epsilon=1e-08,rank=4,warm_start=0");
  EXPECT_EQ(ParseCompressionSpec("powersgd:orthogonalization_epsilon=0.1234567891234")
                .value()
                .FloatOption("orthogonalization_epsilon"),
            0.1234567891234);
  EXPECT_EQ(ParseCompressionSpec("powersgd:rank=0").status().message(),
            "compression 'powersgd:rank=0': option 'rank' must be an integer in [1, 2^30], got '0'");
  EXPECT_EQ(ParseCompressionSpec("powersgd:min_compression_rate=0.5").status().message(),
            "compression 'powersgd:min_compression_rate=0.5': option 'min_compression_rate' must "
            "be a finite number >= 1, got '0.5'");
  EXPECT_EQ(ParseCompressionSpec("powersgd:orthogonalization_epsilon=nan").status().message(),
            "compression 'powersgd:orthogonalization_epsilon=nan': option "
            "'orthogonalization_epsilon' must be a finite number >= 0, got 'nan'");
  EXPECT_EQ(ParseCompressionSpec("powersgd:r=2").status().message(),
            "compression 'powersgd:r=2': unknown option 'r' for powersgd; valid options: rank, "
            "min_compression_rate, ef, warm_start, orthogonalization_epsilon, start_step");
}

}  // namespace
}  // namespace braid::compression
