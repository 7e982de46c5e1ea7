// Compression `auto` (Note [Auto compression], runtime/auto_compression.h): the coordinator's
// choice from measured figures, the rank's per-bucket rule, and whole jobs over a fast and a
// slow simulated link, whose ranks switch methods at the same step boundary.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "compression/stage.h"
#include "control/tuned_settings.h"
#include "coordinator/compression_choice.h"
#include "gtest/gtest.h"
#include "runtime/auto_compression.h"
#include "runtime/runtime.h"
#include "tests/testing/delegating_communicator.h"
#include "tests/testing/runtime_world.h"

namespace braid {
namespace {

using coordinator::ChoiceFigures;
using coordinator::ChoiceOptions;
using coordinator::CompressionChooser;

size_t Rung(const std::string& method) {
  const auto& ladder = AutoLadder();
  return static_cast<size_t>(std::find(ladder.begin(), ladder.end(), method) - ladder.begin());
}

TEST(CompressionChoiceTest, TheLeastLossyMethodWithinTheToleranceOfTheShortestStep) {
  ChoiceFigures f;
  f.link_bytes_per_second = 2e6;
  // Reductions: none, fp16, fp4:ef=1, powersgd, scalecomp.
  f.seconds = {0.2, 0.1, 0.03, 0.004, 0.005};
  f.computation_seconds = 0.15;  // steps 350, 250, 180, 154, 155 ms: 180 <= 1.25 * 154
  EXPECT_EQ(AutoLadder()[CompressionChooser::Choose(f, 0.25)], "fp4:ef=1");
  EXPECT_EQ(CompressionChooser::Reason(f, 2, 0.25),
            "auto: fp4:ef=1, link 2 MB/s, computation 150 ms: its step 180 ms is within 25% "
            "of powersgd:rank=4's 154 ms, the shortest; fp16's 250 ms is not");
  EXPECT_EQ(AutoLadder()[CompressionChooser::Choose(f, 0.1)], "powersgd:rank=4");
  EXPECT_EQ(CompressionChooser::Reason(f, 3, 0.1),
            "auto: powersgd:rank=4, link 2 MB/s, computation 150 ms: its step 154 ms is the "
            "shortest, fp4:ef=1's 180 ms is not within 10% of it");
  f.computation_seconds = 1.0;  // none's 1.2 s is within 25% of 1.004 s
  EXPECT_EQ(AutoLadder()[CompressionChooser::Choose(f, 0.25)], "none");
  f.computation_seconds = 0.5;  // none's 700 ms is not within 25% of 504, fp16's 600 is
  EXPECT_EQ(AutoLadder()[CompressionChooser::Choose(f, 0.25)], "fp16");
  f.computation_seconds = 0.001;  // the reductions dominate: powersgd, before scalecomp
  EXPECT_EQ(AutoLadder()[CompressionChooser::Choose(f, 0.25)], "powersgd:rank=4");
  f.seconds = {0.2, 0.1, 0.03, 0.009, 0.001};
  EXPECT_EQ(AutoLadder()[CompressionChooser::Choose(f, 0.25)], "scalecomp");
}

// A step of `dense` bytes whose data-plane time is `plane_us` and whose computation is
// `compute_us`; each ladder method sends dense / its rate.
proto::TuningSample Step(int64_t epoch, double dense, int64_t plane_us, int64_t compute_us) {
  const double rates[] = {1, 2, 7.5, 50, 50};
  proto::TuningSample s;
  s.set_epoch(epoch);
  s.set_auto_bytes(static_cast<int64_t>(dense));
  s.set_auto_micros(plane_us);
  s.set_micros(plane_us + compute_us);
  for (double r : rates) s.add_auto_wire_bytes(static_cast<int64_t>(dense / r));
  return s;
}

// A slow link (1 MB/s) behind 50 ms of computation: a step's 1 MB takes 1 s uncompressed,
// 133 ms under fp4:ef=1, 20 ms under powersgd:rank=4 and scalecomp: steps of 1050, 550, 183,
// 70 and 70 ms, and powersgd is the least lossy within 25% of the shortest; a fast link (1
// GB/s) keeps none (51 ms). Each after the warm-up and one window of every rank.
TEST(CompressionChoiceTest, AWindowOfEveryRankDecides) {
  ChoiceOptions o;  // 5 warm-up steps, windows of 5
  for (bool slow : {true, false}) {
    SCOPED_TRACE(slow ? "slow link" : "fast link");
    CompressionChooser chooser(o, 2, 0);
    const int64_t plane = slow ? 1000000 : 1000;
    for (int step = 0; step < 10; ++step) {
      EXPECT_FALSE(chooser.OnSample(0, Step(0, 1e6, plane, 50000))) << step;
      EXPECT_FALSE(chooser.OnSample(0, Step(7, 1e6, plane, 50000))) << "another epoch";
      if (step < 9) {
        EXPECT_FALSE(chooser.OnSample(1, Step(0, 1e6, plane, 50000))) << step;
      }
    }
    EXPECT_EQ(chooser.method(), "none") << "not before every rank's window";
    auto choice = chooser.OnSample(1, Step(0, 1e6, plane, 50000));
    ASSERT_TRUE(choice.has_value());
    EXPECT_EQ(choice->method, slow ? "powersgd:rank=4" : "none") << choice->reason;
    EXPECT_NEAR(chooser.figures().link_bytes_per_second, slow ? 1e6 : 1e9, 1);
    EXPECT_NEAR(chooser.figures().computation_seconds, 0.05, 1e-9);
  }
}

// After a choice, the first window under the new method sets the figures; later windows
// re-choose only when the link or the computation moves by more than the margin from them,
// and a change goes out only when the method differs.
TEST(CompressionChoiceTest, ItReChoosesWhenTheFiguresMove) {
  ChoiceOptions o;
  o.first_warmup_steps = 0;
  o.warmup_steps = 1;
  o.measured_steps = 2;
  CompressionChooser chooser(o, 1, 0);
  auto window = [&](int64_t epoch, const std::string& method, double link, int64_t compute_us) {
    // Under `method`, the plane time follows from what it sends and the link's rate.
    const double sent = 1e6 / std::vector<double>{1, 2, 7.5, 50, 50}[Rung(method)];
    const auto plane = static_cast<int64_t>(sent / link * 1e6);
    std::optional<CompressionChooser::Choice> out;
    for (int i = 0; i < 3; ++i) {
      auto c = chooser.OnSample(0, Step(epoch, 1e6, plane, compute_us));
      if (c) out = c;
    }
    return out;
  };
  // 10 MB/s, 300 ms: fp16's step (350 ms) is within 25% of the shortest (302 ms), none's
  // (400 ms) is not.
  auto first = chooser.OnSample(0, Step(0, 1e6, 100000, 300000));
  ASSERT_FALSE(first);
  first = chooser.OnSample(0, Step(0, 1e6, 100000, 300000));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->method, "fp16");
  chooser.Changed(1);
  EXPECT_FALSE(window(1, "fp16", 20e6, 300000))
      << "the first window under fp16 sets the figures, however far it moved";
  EXPECT_EQ(chooser.figures().link_bytes_per_second, 20e6);
  EXPECT_FALSE(window(1, "fp16", 10e6, 300000)) << "50% off: re-chosen, fp16 again";
  EXPECT_FALSE(window(1, "fp16", 11e6, 330000)) << "within the margin";
  auto faster = window(1, "fp16", 20e6, 300000);  // none's 350 ms is now within 25% of 301
  ASSERT_TRUE(faster);
  EXPECT_EQ(faster->method, "none");
  chooser.Changed(2);
  EXPECT_FALSE(window(1, "none", 1e6, 300000)) << "a stale epoch's samples are dropped";
  EXPECT_FALSE(window(2, "none", 20e6, 300000)) << "the first window under none";
  auto slower = window(2, "none", 1e6, 300000);  // 1 MB/s: powersgd's 320 ms, fp4's 433
  ASSERT_TRUE(slower);
  EXPECT_EQ(slower->method, "powersgd:rank=4");
}

// The rank's side: a bucket runs the method in force only where it pays by the plans'
// defaults, and a step's figures count what every ladder method would send.
TEST(AutoCompressionTest, ABucketRunsTheMethodInForceWhereItPays) {
  compression::CompressionStage stage{compression::StageOptions{}};
  AutoCompression auto_compression(&stage);
  const std::vector<int64_t> matrix = {256, 64}, small = {100}, vector = {4096};
  auto bucket = [](const std::vector<std::vector<int64_t>>& shapes) {
    std::vector<AllReduceTensor> t;
    for (const auto& s : shapes) t.push_back({"t", s, nullptr, nullptr});
    return t;
  };
  auto run = [&](const std::vector<std::vector<int64_t>>& shapes, DataType dtype, ReduceOp op) {
    auto m = auto_compression.ForBucket(bucket(shapes), dtype, op);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? (*m)->spec() : std::string();
  };
  EXPECT_EQ(run({matrix}, DataType::kFloat32, ReduceOp::kAverage), "none") << "none until chosen";
  ASSERT_TRUE(auto_compression.Apply("powersgd:rank=4").ok());
  EXPECT_EQ(run({matrix}, DataType::kFloat32, ReduceOp::kAverage), "powersgd:rank=4");
  EXPECT_EQ(run({small}, DataType::kFloat32, ReduceOp::kAverage), "none") << "< 1024 elements";
  EXPECT_EQ(run({vector}, DataType::kFloat32, ReduceOp::kAverage), "none") << "rate 1";
  EXPECT_EQ(run({matrix}, DataType::kInt32, ReduceOp::kSum), "none") << "does not apply";
  EXPECT_EQ(run({matrix}, DataType::kFloat32, ReduceOp::kMax), "none") << "does not apply";
  EXPECT_FALSE(auto_compression.Apply("fp4").ok()) << "not on the ladder";
  absl::SleepFor(absl::Milliseconds(3));
  auto_compression.Ran();  // the last bucket took 3 ms or more
  proto::TuningSample s;
  ASSERT_TRUE(auto_compression.TakeStep(&s));
  // Six buckets of 64 KiB, 400 B, 16 KiB, 64 KiB (int32), 64 KiB, 64 KiB.
  const int64_t m = 256 * 64 * 4, dense = 4 * m + 400 + 4096 * 4;
  EXPECT_EQ(s.auto_bytes(), dense);
  EXPECT_GE(s.auto_micros(), 3000);
  EXPECT_LT(s.auto_micros(), 3000000);
  ASSERT_EQ(s.auto_wire_bytes_size(), 5);
  EXPECT_EQ(s.auto_wire_bytes(0), dense);
  // fp16 halves the float32 averages of 1024 elements or more; the int32 sum, the max and
  // the 100 elements go as they are.
  EXPECT_EQ(s.auto_wire_bytes(1), 2 * (m / 2) + 2 * m + 400 + 4096 * 2);
  // powersgd rank 4 on 256 x 64: (256 + 64) * 4 float32 = 5120 B; on a vector, rate 1.
  EXPECT_EQ(s.auto_wire_bytes(3), 2 * 5120 + 2 * m + 400 + 4096 * 4);
  proto::TuningSample empty;
  EXPECT_FALSE(auto_compression.TakeStep(&empty)) << "zeroed at the boundary";
}

// A rank's data channel on a link of `bytes_per_second`: every call sleeps for the bytes it
// sent.
class SlowLink final : public testing::DelegatingCommunicator {
 public:
  SlowLink(std::unique_ptr<transport::Communicator> inner, double bytes_per_second)
      : DelegatingCommunicator(std::move(inner)), rate_(bytes_per_second) {}
  absl::Status AllReduce(const void* s, void* r, size_t n, DataType d, ReduceOp op) override {
    return Paced([&] { return inner().AllReduce(s, r, n, d, op); });
  }
  absl::Status AllReduceGathered(absl::Span<const transport::GatheredPiece> pieces,
                                 void* scratch, size_t n, DataType d, ReduceOp op) override {
    return Paced([&] { return inner().AllReduceGathered(pieces, scratch, n, d, op); });
  }
  absl::Status AllGather(const void* s, size_t n, void* r,
                         absl::Span<const size_t> recv_bytes) override {
    return Paced([&] { return inner().AllGather(s, n, r, recv_bytes); });
  }
  absl::Status Broadcast(void* buf, size_t bytes, int root) override {
    return Paced([&] { return inner().Broadcast(buf, bytes, root); });
  }
  absl::Status RunCollective(
      const std::function<absl::Status(transport::Context&)>& body) override {
    return Paced([&] { return inner().RunCollective(body); });
  }

 private:
  template <typename F>
  absl::Status Paced(F call) {
    const uint64_t before = inner().stats().bytes_sent;
    absl::Status s = call();
    absl::SleepFor(absl::Seconds(static_cast<double>(inner().stats().bytes_sent - before) / rate_));
    return s;
  }
  double rate_;
};

const std::vector<int64_t> kW1 = {256, 256}, kW2 = {128, 256};

double Input(int rank, int step, size_t i) {
  return std::sin(0.37 * static_cast<double>(i) + 1.3 * rank + 0.7 * step);
}

// Runs `steps` steps of two `auto` layers after `compute` of simulated computation each;
// returns, per step, rank 0's largest error against the exact average.
std::vector<double> RunAuto(testing::RuntimeWorld& world, int steps, absl::Duration compute) {
  std::vector<double> error(steps, 0);
  world.Run([&](int rank, Runtime& rt) {
    const std::vector<std::vector<int64_t>> shapes = {kW1, kW2};
    for (int step = 0; step < steps; ++step) {
      absl::SleepFor(compute);
      std::vector<std::vector<float>> in, out;
      std::vector<std::shared_ptr<Handle>> handles;
      rt.BeginGroup();
      for (size_t l = 0; l < shapes.size(); ++l) {
        const size_t n = static_cast<size_t>(shapes[l][0] * shapes[l][1]);
        in.emplace_back(n);
        out.emplace_back(n);
        for (size_t i = 0; i < n; ++i) in[l][i] = static_cast<float>(Input(rank, step, i + l));
        CollectiveRequest r;
        r.name = l == 0 ? "w1" : "w2";
        r.dtype = DataType::kFloat32;
        r.shape = shapes[l];
        r.input = in[l].data();
        r.output = out[l].data();
        r.op = ReduceOp::kAverage;
        r.compression = "auto";
        auto h = rt.Enqueue(r);
        ASSERT_TRUE(h.ok()) << h.status();
        handles.push_back(*h);
      }
      ASSERT_TRUE(rt.EndGroup().ok());
      for (auto& h : handles) ASSERT_TRUE(h->Wait(absl::Seconds(30)).ok()) << h->status();
      if (rank != 0) continue;
      for (size_t l = 0; l < shapes.size(); ++l) {
        for (size_t i = 0; i < out[l].size(); ++i) {
          const double exact = (Input(0, step, i + l) + Input(1, step, i + l)) / 2;
          error[step] = std::max(error[step], std::abs(out[l][i] - exact));
        }
      }
    }
  });
  return error;
}

// Over a slow link (2 MB/s: a step's 384 KiB take ~200 ms uncompressed) behind 180 ms of
// computation, `auto` chooses fp4:ef=1: its step (~210 ms) is within 25% of the shortest
// (scalecomp's or powersgd's, ~190 ms), fp16's (~280 ms) is not. Over the in-process link
// it keeps none. Every rank switches at the same step boundary: the steps before it are
// exact (none), the steps from it carry fp4's error, and every tensor of a step ran under
// one method.
TEST(AutoCompressionTest, FastAndSlowLinksGetTheExpectedMethodBetweenSteps) {
  for (bool slow : {false, true}) {
    SCOPED_TRACE(slow ? "slow link" : "fast link");
    testing::RuntimeWorldOptions o;
    o.size = 2;
    if (slow) {
      o.wrap_communicator = [](int, std::unique_ptr<transport::Communicator> comm)
          -> std::unique_ptr<transport::Communicator> {
        return std::make_unique<SlowLink>(std::move(comm), 2e6);
      };
    }
    testing::RuntimeWorld world(o);
    ASSERT_TRUE(world.InitOk());
    const int steps = slow ? 16 : 14;
    const std::vector<double> error = RunAuto(world, steps, absl::Milliseconds(180));
    std::vector<SettingsApplied> history[2];
    for (int r = 0; r < 2; ++r) {
      auto h = world[r].SettingsHistory();
      ASSERT_TRUE(h.ok()) << h.status();
      history[r] = *h;
    }
    ASSERT_EQ(history[0].size(), 1u) << "one choice, then steady figures";
    ASSERT_EQ(history[1].size(), 1u);
    const SettingsApplied& c = history[0][0];
    EXPECT_EQ(history[1][0].step, c.step);
    EXPECT_EQ(history[1][0].compression, c.compression);
    EXPECT_EQ(c.compression, slow ? "fp4:ef=1" : "none") << c.reason;
    EXPECT_TRUE(absl::StartsWith(c.reason, "auto: " + c.compression)) << c.reason;
    auto status = world.coordinator().Status();
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status->auto_compression(), c.reason);
    // After the first 5 warm-up steps and a window of 5, at a boundary on the way.
    EXPECT_GE(c.step, 11);
    ASSERT_LE(c.step, steps - 2) << "a few steps left under the choice";
    for (int step = 0; step < steps; ++step) {
      const bool compressed = slow && step + 1 >= c.step;  // steps count from 1
      if (compressed) {
        // fp4's levels are powers of 4 of the chunk's scale (compression/four_bit.h), and
        // error feedback carries each step's error into the next: far from exact, finite.
        EXPECT_GT(error[step], 1e-3) << "step " << step + 1 << " is fp4's";
        EXPECT_TRUE(std::isfinite(error[step])) << "step " << step + 1;
      } else {
        EXPECT_LT(error[step], 1e-6) << "step " << step + 1 << " is none's";
      }
    }
    for (int r = 0; r < 2; ++r) {
      auto report = world[r].compression_report();
      ASSERT_TRUE(report.ok());
      uint64_t none = 0, fp4 = 0;
      for (const auto& m : report->methods) {
        if (m.method == "none") none = m.bytes.reductions;
        if (m.method == "fp4:ef=1") fp4 = m.bytes.reductions;
      }
      const uint64_t before = slow ? static_cast<uint64_t>(c.step - 1) : steps;
      EXPECT_EQ(none, 2 * before) << "rank " << r;
      EXPECT_EQ(fp4, 2 * (steps - before)) << "rank " << r;
      // Note [Compression groups]: each method's bytes in the group that says auto chose it.
      for (const CompressionGroupStats& g : report->groups) {
        EXPECT_EQ(g.pattern, "(auto)") << g.method << " on rank " << r;
        EXPECT_EQ(g.bytes.reductions, g.method == "none" ? none : fp4) << g.method;
      }
      EXPECT_EQ(report->groups.size(), slow ? 2u : 1u) << "rank " << r;
    }
    world.Shutdown();
  }
}

}  // namespace
}  // namespace braid
