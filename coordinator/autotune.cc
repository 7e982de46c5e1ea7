// The autotuner's search (Note [Autotuning], autotune.h).
#include "coordinator/autotune.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace braid::coordinator {

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

template <typename T>
T Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

const std::vector<int64_t>& Grid(Knob knob) {
  static const std::vector<int64_t> kFusion = {0, 1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB,
                                               256 * kMiB};
  // Whole milliseconds, as BRAID_CYCLE_TIME_MS takes them (so a result can be kept), and at
  // least 1 ms, the fast path's shortest round.
  static const std::vector<int64_t> kCycle = {1000, 2000, 5000, 10000};
  static const std::vector<int64_t> kChunk = {16 * kKiB, 64 * kKiB, 256 * kKiB, 1 * kMiB};
  static const std::vector<int64_t> kWindow = {1, 2, 4, 8};
  switch (knob) {
    case Knob::kFusionThreshold: return kFusion;
    case Knob::kCycleTime: return kCycle;
    case Knob::kRingChunk: return kChunk;
    case Knob::kRingWindow: return kWindow;
  }
  return kWindow;
}

Autotuner::Autotuner(const AutotuneOptions& options, const proto::TunedSettings& start,
                     int world_size)
    : opts_(options),
      world_size_(std::max(world_size, 1)),
      start_(start),
      current_(start),
      best_(start),
      seen_(world_size_, 0),
      samples_(world_size_) {
  opts_.measured_steps = std::max(opts_.measured_steps, 1);
  opts_.warmup_steps = std::max(opts_.warmup_steps, 0);
}

std::string Autotuner::Key(const proto::TunedSettings& s) {
  return absl::StrCat(s.fusion_threshold_bytes(), "/", s.cycle_time_us(), "/",
                      s.ring_chunk_bytes(), "/", s.ring_window());
}

double Autotuner::Score(const proto::TunedSettings& s) const {
  if (opts_.forced_score) return opts_.forced_score(s);
  std::vector<int64_t> bytes;
  int64_t slowest = 1;
  for (const auto& rank : samples_) {
    std::vector<int64_t> micros;
    for (const auto& [b, us] : rank) {
      bytes.push_back(b);
      micros.push_back(us);
    }
    slowest = std::max(slowest, Median(micros));
  }
  return static_cast<double>(Median(bytes)) * 1e6 / static_cast<double>(slowest);
}

std::optional<proto::SettingsChange> Autotuner::OnSample(int rank,
                                                         const proto::TuningSample& sample) {
  if (done_ || sample.epoch() != epoch_ || rank < 0 || rank >= world_size_) return std::nullopt;
  if (++seen_[rank] <= (epoch_ == 0 ? opts_.first_warmup_steps : opts_.warmup_steps)) {
    return std::nullopt;
  }
  auto& mine = samples_[rank];
  if (static_cast<int>(mine.size()) < opts_.measured_steps) {
    mine.emplace_back(sample.bytes(), sample.micros());
  }
  for (const auto& r : samples_) {
    if (static_cast<int>(r.size()) < opts_.measured_steps) return std::nullopt;
  }
  const double score = Score(current_);
  measured_[Key(current_)] = score;
  proto::SettingsChange change;
  proto::TuningScore* m = change.mutable_measured();
  *m->mutable_settings() = current_;
  m->set_epoch(epoch_);
  m->set_steps(opts_.measured_steps);
  m->set_bytes_per_second(score);
  if (best_score_ < 0) {  // the job's own settings
    best_score_ = start_score_ = score;
  } else if (score > best_score_ * (1 + opts_.min_gain)) {
    best_ = current_;
    best_score_ = score;
    pass_moved_ = true;
  }
  m->set_best(Key(best_) == Key(current_));
  std::optional<proto::TunedSettings> next = Next();
  change.set_epoch(++epoch_);
  std::fill(seen_.begin(), seen_.end(), 0);
  for (auto& r : samples_) r.clear();
  if (next) {
    current_ = *next;
    change.set_reason(
        absl::StrCat("autotuning: trying ", DescribeKnob(kKnobs[knob_], KnobValue(*next, kKnobs[knob_]))));
  } else {
    done_ = true;
    current_ = best_;
    change.set_tuning_done(true);
    change.set_reason(absl::StrFormat(
        "autotuning done after %d candidates: the best, %.1f MB/s all-reduced per second of "
        "step, %.2fx the job's settings",
        measured_.size(), best_score_ / 1e6, start_score_ > 0 ? best_score_ / start_score_ : 1.0));
  }
  *change.mutable_settings() = current_;
  return change;
}

std::optional<proto::TunedSettings> Autotuner::Step() {
  const Knob knob = kKnobs[knob_];
  const std::vector<int64_t>& grid = Grid(knob);
  if (value_ >= grid.size()) return std::nullopt;
  proto::TunedSettings s = best_;
  SetKnob(&s, knob, grid[value_++]);
  return s;
}

std::optional<proto::TunedSettings> Autotuner::Next() {
  constexpr size_t kKnobCount = sizeof(kKnobs) / sizeof(kKnobs[0]);
  while (true) {
    if (knob_ >= kKnobCount) {
      if (!pass_moved_ || pass_ >= opts_.max_passes) return std::nullopt;
      ++pass_;  // the knobs may interact: another pass from the new best
      pass_moved_ = false;
      knob_ = 0;
      value_ = 0;
    }
    std::optional<proto::TunedSettings> c = Step();
    if (!c) {
      ++knob_;  // this knob's scan is over
      value_ = 0;
      continue;
    }
    if (measured_.count(Key(*c)) == 0) return c;  // the best itself, or measured already
  }
}

}  // namespace braid::coordinator
