// The coordinator's side of compression `auto` (Note [Auto compression] in
// runtime/auto_compression.h): the ladder method `auto` tensors run with, chosen from the
// ranks' step samples and changed through a SettingsChange (Note [Settings changes]).
//
// A window is measured_steps samples of every rank, all under one settings epoch, after
// warm-up steps (first_warmup_steps at the first window: the job's first steps pay one-time
// costs; warmup_steps after any change of the job's settings). Over the window's samples
// of every rank (medians, so one slow step does not decide):
//   link rate   = bytes sent under the method in force / the data plane's time for them;
//   computation = step time - the data plane's time for the step's `auto` buckets;
//   estimate(m) = bytes m sends for the step / link rate, for each ladder method m.
//   step(m)     = computation + estimate(m): the step under m, as if none of its reduction
//                 overlapped the computation.
// The choice is the least lossy m whose step(m) is within `tolerance` of the shortest step
// of any m: a lossier method must buy a shorter step than that. The first window always
// gives a choice (so the log and braidctl say why, `none` included); a later window
// re-chooses only when its link rate or computation is more than `margin` away from the
// figures of the choice in force, and a change goes out only when the method differs. After
// a change of method, the first window under the new one measures the figures later windows
// are compared with, and re-chooses nothing: a link measured under another method is not
// comparable (BENCHMARKS.md section 31 saw fp4:ef=1 and powersgd:rank=4 alternate without it).
#ifndef BRAID_COORDINATOR_COMPRESSION_CHOICE_H_
#define BRAID_COORDINATOR_COMPRESSION_CHOICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/braid.pb.h"

namespace braid::coordinator {

struct ChoiceOptions {
  int first_warmup_steps = 5;  // per rank, before the first window
  int warmup_steps = 2;        // per rank, after each change of the job's settings
  int measured_steps = 5;      // per rank, a window
  double margin = 0.25;        // relative move of link rate or computation that re-chooses
  double tolerance = 0.25;     // how much longer than the shortest a chosen step may be
};

// What one window measured.
struct ChoiceFigures {
  double link_bytes_per_second = 0;
  double computation_seconds = 0;
  std::vector<double> seconds;  // estimate per ladder method, AutoLadder()'s order
};

class CompressionChooser {
 public:
  struct Choice {
    std::string method;  // one of AutoLadder()
    std::string reason;  // "auto: fp4:ef=1, link 12.5 MB/s, computation 80 ms: ..."
  };

  // `epoch`: the job's settings epoch in force when the first `auto` sample came.
  CompressionChooser(const ChoiceOptions& options, int world_size, int64_t epoch);

  // `rank`'s sample. A sample of another epoch than the one in force, or without `auto`
  // figures, is dropped. When it completes a window whose choice goes out: that choice.
  std::optional<Choice> OnSample(int rank, const proto::TuningSample& sample);
  // The job's settings changed (this chooser's change or another): samples of `epoch` are
  // measured from now on, after warmup_steps per rank.
  void Changed(int64_t epoch);

  // The method in force ("none" before the first choice).
  const std::string& method() const { return method_; }
  // Why the method in force was chosen ("" before the first choice).
  const std::string& reason() const { return reason_; }
  // The figures of the choice in force (zeros before it).
  const ChoiceFigures& figures() const { return figures_; }
  // Chooses for `figures` (exposed for tests): the ladder index.
  static size_t Choose(const ChoiceFigures& figures, double tolerance);
  static std::string Reason(const ChoiceFigures& figures, size_t chosen, double tolerance);

 private:
  ChoiceFigures Measure() const;
  bool Moved(const ChoiceFigures& now) const;

  ChoiceOptions opts_;
  int world_size_;
  int64_t epoch_;
  int warmup_;
  bool chosen_ = false;
  bool rebase_ = false;  // the next window sets figures_ (a change of method went out)
  std::string method_ = "none";
  std::string reason_;
  ChoiceFigures figures_;
  // Per rank: samples seen in this epoch, and the window's samples.
  std::vector<int> seen_;
  std::vector<std::vector<proto::TuningSample>> window_;
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_COMPRESSION_CHOICE_H_
