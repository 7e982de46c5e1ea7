// The autotuner's search (Note [Autotuning], coordinator/autotune.h), fed samples by hand:
// its path over the grids, the score it measures, and what it drops (warm-up steps, other
// epochs, ranks still to report).
#include "coordinator/autotune.h"

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace braid::coordinator {
namespace {

proto::TunedSettings Settings(int64_t fusion, int64_t cycle_us, int64_t chunk, int window) {
  proto::TunedSettings s;
  s.set_fusion_threshold_bytes(fusion);
  s.set_cycle_time_us(cycle_us);
  s.set_ring_chunk_bytes(chunk);
  s.set_ring_window(window);
  return s;
}

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kKiB = 1 << 10;

// One peak per knob on its grid: fusion 4 MiB, cycle 2 ms, chunk 64 KiB, window 8; each
// step away on a knob's grid costs 10%.
double Peaked(const proto::TunedSettings& s) {
  auto distance = [](Knob k, int64_t v, int64_t best) {
    const std::vector<int64_t>& g = Grid(k);
    auto index = [&](int64_t x) {
      for (size_t i = 0; i < g.size(); ++i) {
        if (g[i] == x) return static_cast<int>(i);
      }
      return -100;
    };
    return std::abs(index(v) - index(best));
  };
  const int d = distance(Knob::kFusionThreshold, s.fusion_threshold_bytes(), 4 * kMiB) +
                distance(Knob::kCycleTime, s.cycle_time_us(), 2000) +
                distance(Knob::kRingChunk, s.ring_chunk_bytes(), 64 * kKiB) +
                distance(Knob::kRingWindow, s.ring_window(), 8);
  return 1000.0 * std::pow(0.9, d);
}

// Feeds every rank a step under the epoch in force until the autotuner decides; the change.
proto::SettingsChange Measure(Autotuner& tuner, int ranks, int* steps_fed) {
  for (int step = 0; step < 100; ++step) {
    for (int r = 0; r < ranks; ++r) {
      proto::TuningSample s;
      s.set_epoch(tuner.epoch());
      s.set_bytes(1000);
      s.set_micros(1000);
      ++*steps_fed;
      if (auto c = tuner.OnSample(r, s)) return *c;
    }
  }
  ADD_FAILURE() << "no decision after 100 steps";
  return {};
}

TEST(AutotuneTest, FindsEachKnobsPeakAndSaysOnceWhenDone) {
  AutotuneOptions o;
  o.first_warmup_steps = 1;
  o.forced_score = Peaked;
  const proto::TunedSettings start = Settings(64 * kMiB, 1000, 256 * kKiB, 4);
  Autotuner tuner(o, start, 2);
  std::set<std::string> tried;
  int fed = 0, changes = 0, done = 0;
  while (!tuner.done()) {
    const proto::SettingsChange c = Measure(tuner, 2, &fed);
    ++changes;
    EXPECT_EQ(c.epoch(), changes);
    ASSERT_TRUE(c.has_measured());
    EXPECT_EQ(c.measured().epoch(), changes - 1);
    EXPECT_DOUBLE_EQ(c.measured().bytes_per_second(), Peaked(c.measured().settings()));
    // Never the same candidate twice.
    EXPECT_TRUE(tried.insert(DescribeSettings(c.measured().settings())).second)
        << DescribeSettings(c.measured().settings());
    done += c.tuning_done() ? 1 : 0;
    if (c.tuning_done()) {
      EXPECT_EQ(DescribeSettings(c.settings()), DescribeSettings(Settings(4 * kMiB, 2000, 64 * kKiB, 8)));
      EXPECT_NE(c.reason().find("autotuning done"), std::string::npos) << c.reason();
    } else {
      EXPECT_NE(c.reason().find("autotuning: trying"), std::string::npos) << c.reason();
    }
    ASSERT_LT(changes, 40) << "the search does not end";
  }
  EXPECT_EQ(done, 1);
  // One scan of each knob's grid: the start and 5 + 3 + 3 + 3 other values, of the grids'
  // 6 * 4 * 4 * 4 = 384 points.
  EXPECT_EQ(changes, 15);
  // Every candidate: one warm-up and five measured steps per rank, nothing more.
  EXPECT_EQ(fed, changes * 2 * 6);
  // Done: samples change nothing.
  proto::TuningSample s;
  s.set_epoch(tuner.epoch());
  EXPECT_FALSE(tuner.OnSample(0, s).has_value());
}

TEST(AutotuneTest, AFlatScoreKeepsTheJobsSettings) {
  AutotuneOptions o;
  o.forced_score = [](const proto::TunedSettings&) { return 5.0; };
  o.max_passes = 2;
  o.first_warmup_steps = 1;
  const proto::TunedSettings start = Settings(16 * kMiB, 1000, 256 * kKiB, 4);
  Autotuner tuner(o, start, 1);
  int fed = 0;
  proto::SettingsChange c;
  while (!tuner.done()) c = Measure(tuner, 1, &fed);
  EXPECT_TRUE(c.tuning_done());
  EXPECT_EQ(DescribeSettings(c.settings()), DescribeSettings(start));
  // No knob moved: one pass, however many are allowed.
  EXPECT_EQ(c.epoch(), 15);
}

// The score: the median step's bytes over the slowest rank's median step time; warm-up
// steps, other epochs and extra steps are dropped, and it waits for every rank.
TEST(AutotuneTest, ScoresTheMedianStepOfTheSlowestRank) {
  AutotuneOptions o;
  o.warmup_steps = 1;
  o.first_warmup_steps = 1;
  o.measured_steps = 3;
  Autotuner tuner(o, Settings(64 * kMiB, 1000, 256 * kKiB, 4), 2);
  auto sample = [](int64_t epoch, int64_t bytes, int64_t micros) {
    proto::TuningSample s;
    s.set_epoch(epoch);
    s.set_bytes(bytes);
    s.set_micros(micros);
    return s;
  };
  // Warm-up steps (the first of each rank) are slow and not counted.
  EXPECT_FALSE(tuner.OnSample(0, sample(0, 1, 900000)));
  EXPECT_FALSE(tuner.OnSample(1, sample(0, 1, 900000)));
  // Another epoch's steps: dropped.
  EXPECT_FALSE(tuner.OnSample(0, sample(7, 1, 1)));
  // Rank 0: 1000, 2000, 3000 us (median 2000); rank 1: 4000, 4000, 100 (median 4000).
  for (int64_t us : {1000, 2000, 3000}) EXPECT_FALSE(tuner.OnSample(0, sample(0, 8000, us)));
  EXPECT_FALSE(tuner.OnSample(0, sample(0, 8000, 1)));  // beyond measured_steps: dropped
  EXPECT_FALSE(tuner.OnSample(1, sample(0, 8000, 4000)));
  EXPECT_FALSE(tuner.OnSample(1, sample(0, 8000, 4000)));
  std::optional<proto::SettingsChange> c = tuner.OnSample(1, sample(0, 8000, 100));
  ASSERT_TRUE(c.has_value()) << "every rank has its steps";
  EXPECT_DOUBLE_EQ(c->measured().bytes_per_second(), 8000 * 1e6 / 4000);
  EXPECT_TRUE(c->measured().best());
  EXPECT_EQ(c->measured().steps(), 3);
  EXPECT_EQ(c->epoch(), 1);
  // The first candidate: the fusion threshold at the first value of its grid.
  EXPECT_EQ(c->settings().fusion_threshold_bytes(), 0);
  EXPECT_FALSE(tuner.OnSample(5, sample(1, 1, 1))) << "a rank outside the world";
}

// Every value of a knob's grid is tried, so a plateau (here every threshold of 16 MiB and
// more, as when a step's tensors fit in one bucket) does not hide a better value beyond it,
// and a start off the grid (BRAID_FUSION_THRESHOLD=10 MiB) is measured as it is.
TEST(AutotuneTest, APlateauDoesNotHideTheBestValue) {
  AutotuneOptions o;
  o.first_warmup_steps = 1;
  o.forced_score = [](const proto::TunedSettings& s) {
    return s.fusion_threshold_bytes() == 4 * kMiB ? 2.0
           : s.fusion_threshold_bytes() < 4 * kMiB ? 0.5
                                                   : 1.0;
  };
  Autotuner tuner(o, Settings(64 * kMiB, 1000, 256 * kKiB, 4), 1);
  int fed = 0;
  std::vector<int64_t> tried;
  proto::SettingsChange c;
  while (!tuner.done()) {
    c = Measure(tuner, 1, &fed);
    if (c.settings().cycle_time_us() == 1000 && c.settings().ring_window() == 4 &&
        c.settings().ring_chunk_bytes() == 256 * kKiB && !c.tuning_done()) {
      tried.push_back(c.settings().fusion_threshold_bytes());
    }
  }
  EXPECT_EQ(tried, (std::vector<int64_t>{0, 1 * kMiB, 4 * kMiB, 16 * kMiB, 256 * kMiB}));
  EXPECT_EQ(c.settings().fusion_threshold_bytes(), 4 * kMiB);
  Autotuner off_grid(o, Settings(10 * kMiB, 1000, 256 * kKiB, 4), 1);
  c = Measure(off_grid, 1, &fed);  // the start, measured as it is; then the grid from 0
  EXPECT_EQ(c.measured().settings().fusion_threshold_bytes(), 10 * kMiB);
  EXPECT_EQ(c.settings().fusion_threshold_bytes(), 0);
}

TEST(AutotuneTest, DescribesSettingsInTheirUnits) {
  EXPECT_EQ(DescribeSettings(Settings(16 * kMiB, 2500, 64 * kKiB, 8)),
            "fusion_threshold=16MiB, cycle_time=2.5ms, ring_chunk=64KiB, ring_window=8");
  EXPECT_EQ(DescribeKnob(Knob::kCycleTime, 0), "cycle_time=own");
  EXPECT_EQ(DescribeKnob(Knob::kFusionThreshold, 0), "fusion_threshold=0");
  EXPECT_EQ(DescribeKnob(Knob::kRingChunk, 0), "ring_chunk=auto");
}

}  // namespace
}  // namespace braid::coordinator
