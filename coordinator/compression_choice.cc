// Compression `auto`'s choice (compression_choice.h).
#include "coordinator/compression_choice.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "control/tuned_settings.h"

namespace braid::coordinator {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

size_t LadderIndex(const std::string& method) {
  const std::vector<std::string>& ladder = AutoLadder();
  return static_cast<size_t>(std::find(ladder.begin(), ladder.end(), method) - ladder.begin());
}

// Three significant digits, without an exponent from 1000 on ("1234", not "1.23e+03").
std::string Figure(double v) {
  return v >= 1000 ? absl::StrFormat("%.0f", v) : absl::StrFormat("%.3g", v);
}

std::string Millis(double seconds) { return Figure(seconds * 1e3) + " ms"; }

// The ladder index of the shortest reduction, so of the shortest step.
size_t Shortest(const ChoiceFigures& f) {
  return static_cast<size_t>(std::min_element(f.seconds.begin(), f.seconds.end()) -
                             f.seconds.begin());
}

}  // namespace

CompressionChooser::CompressionChooser(const ChoiceOptions& options, int world_size,
                                       int64_t epoch)
    : opts_(options),
      world_size_(world_size),
      epoch_(epoch),
      warmup_(options.first_warmup_steps),
      seen_(static_cast<size_t>(world_size), 0),
      window_(static_cast<size_t>(world_size)) {}

void CompressionChooser::Changed(int64_t epoch) {
  epoch_ = epoch;
  warmup_ = opts_.warmup_steps;
  std::fill(seen_.begin(), seen_.end(), 0);
  for (auto& w : window_) w.clear();
}

std::optional<CompressionChooser::Choice> CompressionChooser::OnSample(
    int rank, const proto::TuningSample& sample) {
  const size_t ladder = AutoLadder().size();
  if (rank < 0 || rank >= world_size_ || sample.epoch() != epoch_ || sample.auto_bytes() <= 0 ||
      static_cast<size_t>(sample.auto_wire_bytes_size()) != ladder) {
    return std::nullopt;
  }
  if (++seen_[rank] <= warmup_) return std::nullopt;
  if (static_cast<int>(window_[rank].size()) < opts_.measured_steps) {
    window_[rank].push_back(sample);
  }
  for (const auto& w : window_) {
    if (static_cast<int>(w.size()) < opts_.measured_steps) return std::nullopt;
  }
  const ChoiceFigures now = Measure();
  for (auto& w : window_) w.clear();
  if (rebase_) {
    // The first window under a method this chooser just chose: the link rate it measures
    // is that method's (small messages ride a rate limiter's burst, or pay latency more than
    // bandwidth), not comparable with the previous method's. It becomes the figures later
    // windows are compared with; comparing it would switch back and forth between methods
    // whose steps are close.
    rebase_ = false;
    figures_ = now;
    return std::nullopt;
  }
  if (chosen_ && !Moved(now)) return std::nullopt;
  const size_t pick = Choose(now, opts_.tolerance);
  const bool first = !chosen_;
  const bool differs = AutoLadder()[pick] != method_;
  chosen_ = true;
  figures_ = now;
  if (!first && !differs) return std::nullopt;
  method_ = AutoLadder()[pick];
  reason_ = Reason(now, pick, opts_.tolerance);
  rebase_ = true;
  return Choice{method_, reason_};
}

ChoiceFigures CompressionChooser::Measure() const {
  const size_t in_force = LadderIndex(method_);
  std::vector<double> link, computation;
  std::vector<std::vector<double>> wire(AutoLadder().size());
  for (const auto& w : window_) {
    for (const proto::TuningSample& s : w) {
      const double plane = static_cast<double>(std::max<int64_t>(s.auto_micros(), 1)) / 1e6;
      link.push_back(static_cast<double>(s.auto_wire_bytes(static_cast<int>(in_force))) / plane);
      computation.push_back(std::max(0.0, static_cast<double>(s.micros()) / 1e6 - plane));
      for (size_t i = 0; i < wire.size(); ++i) {
        wire[i].push_back(static_cast<double>(s.auto_wire_bytes(static_cast<int>(i))));
      }
    }
  }
  ChoiceFigures f;
  f.link_bytes_per_second = Median(link);
  f.computation_seconds = Median(computation);
  for (const auto& w : wire) f.seconds.push_back(Median(w) / f.link_bytes_per_second);
  return f;
}

bool CompressionChooser::Moved(const ChoiceFigures& now) const {
  auto moved = [this](double a, double b) {
    return b <= 0 ? a > 0 : std::abs(a / b - 1.0) > opts_.margin;
  };
  return moved(now.link_bytes_per_second, figures_.link_bytes_per_second) ||
         moved(now.computation_seconds, figures_.computation_seconds);
}

size_t CompressionChooser::Choose(const ChoiceFigures& f, double tolerance) {
  const double shortest = f.computation_seconds + f.seconds[Shortest(f)];
  for (size_t i = 0; i < f.seconds.size(); ++i) {
    if (f.computation_seconds + f.seconds[i] <= (1 + tolerance) * shortest) return i;
  }
  return f.seconds.size() - 1;  // unreachable: the shortest itself qualifies
}

std::string CompressionChooser::Reason(const ChoiceFigures& f, size_t chosen, double tolerance) {
  const std::vector<std::string>& ladder = AutoLadder();
  const auto step = [&f](size_t i) { return Millis(f.computation_seconds + f.seconds[i]); };
  const size_t shortest = Shortest(f);
  const std::string within = absl::StrFormat("within %.0f%% of", tolerance * 100);
  std::string out = absl::StrFormat("auto: %s, link %s MB/s, computation %s: its step %s",
                                    ladder[chosen], Figure(f.link_bytes_per_second / 1e6),
                                    Millis(f.computation_seconds), step(chosen));
  if (f.seconds[chosen] <= f.seconds[shortest]) {
    absl::StrAppend(&out, " is the shortest");
    if (chosen > 0) {
      absl::StrAppend(&out, ", ", ladder[chosen - 1], "'s ", step(chosen - 1), " is not ",
                      within, " it");
    }
    return out;
  }
  absl::StrAppend(&out, " is ", within, " ", ladder[shortest], "'s ", step(shortest),
                  ", the shortest");
  if (chosen > 0) {
    absl::StrAppend(&out, "; ", ladder[chosen - 1], "'s ", step(chosen - 1), " is not");
  }
  return out;
}

}  // namespace braid::coordinator
