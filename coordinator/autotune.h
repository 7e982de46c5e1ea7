// Note [Autotuning]: BRAID_AUTOTUNE=1 has the coordinator choose the settings that change
// during a job (proto TunedSettings: fusion threshold, cycle time, ring chunk and window) by
// measuring the job's own steps.
//
// The score of a candidate is the job's all-reduce throughput: bytes all-reduced per second
// of step, from the ranks' samples (proto TuningSample: one per rank per step, step boundary
// to step boundary, Note [Settings changes] in runtime/step_settings.h). For each candidate
// the first `warmup_steps` of each rank are dropped (the step in which the change landed may
// still have been fused under the old threshold; more for the job's first settings, whose
// first steps pay one-time costs), then `measured_steps` per rank are kept;
// the score is the median step's bytes over the slowest rank's median step time. A model
// reduces the same bytes every step, so the score orders candidates as the step time does.
//
// The search is a coordinate search over a small grid per knob (Grid), not Horovod's
// Bayesian optimisation: these four knobs act nearly independently, so each in turn is set
// to every value of its grid with the others at the best point so far, and a value replaces
// the best when its score is higher by more than `min_gain`: 16 candidates from the job's
// settings (6 + 4 + 4 + 4 values, less the start's own on the grids; its cycle time, each
// rank's own, is not on one), a fixed, known cost, where Bayesian
// optimisation spends its first samples exploring (horovod#2206: tuning that never ends its
// warm-up in a short job). Every value, not a line search that stops at the first value no
// better: a knob often has plateaus (every fusion threshold above the step's bytes fuses the
// same buckets), on which a line search stops short of a better value beyond. With
// `max_passes` > 1, another pass runs when one moved a knob (knobs may interact); no
// candidate is measured twice. Then the best settings stay, and the coordinator says so once
// (SettingsChange.tuning_done). The search does not follow a job whose behaviour changes
// later.
//
// Not thread-safe: the Job owns it, under the service's lock.
#ifndef BRAID_COORDINATOR_AUTOTUNE_H_
#define BRAID_COORDINATOR_AUTOTUNE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "control/tuned_settings.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

struct AutotuneOptions {
  int warmup_steps = 1;    // per candidate and rank, not measured
  // The same for the job's own settings, measured first: the job's first steps also pay
  // one-time costs (connections, buffers growing to their size, caches).
  int first_warmup_steps = 5;
  int measured_steps = 5;  // per candidate and rank
  // A candidate replaces the best when its score is higher by more than this fraction
  // (below, step-to-step noise on a shared machine decides).
  double min_gain = 0.03;
  int max_passes = 1;
  // Tests: the score of a candidate, instead of its measured one (the samples still decide
  // when it is done), so a search's path is known in advance.
  std::function<double(const proto::TunedSettings&)> forced_score;
};

// The values the search tries for `knob`, ascending (fusion threshold and ring chunk in
// bytes, cycle time in microseconds, the window in pieces).
const std::vector<int64_t>& Grid(Knob knob);

class Autotuner {
 public:
  // `start`: the job's settings (epoch 0), measured first.
  Autotuner(const AutotuneOptions& options, const proto::TunedSettings& start, int world_size);

  // A rank's sample. When it completes the measurement of the candidate in force, the
  // change that goes next (a new candidate, or the best with tuning_done), with the
  // measurement in `measured`; nullopt otherwise (samples of other epochs are dropped).
  std::optional<proto::SettingsChange> OnSample(int rank, const proto::TuningSample& sample);

  bool done() const { return done_; }
  int64_t epoch() const { return epoch_; }
  const proto::TunedSettings& current() const { return current_; }
  const proto::TunedSettings& best() const { return best_; }

 private:
  // The candidate after the one just measured; nullopt when the search is over.
  std::optional<proto::TunedSettings> Next();
  // The best point with the current knob at its next grid value; nullopt past the grid.
  std::optional<proto::TunedSettings> Step();
  double Score(const proto::TunedSettings& s) const;
  static std::string Key(const proto::TunedSettings& s);

  AutotuneOptions opts_;
  int world_size_;
  proto::TunedSettings start_;
  proto::TunedSettings current_;  // the candidate in force (epoch_)
  proto::TunedSettings best_;
  double best_score_ = -1;
  double start_score_ = -1;
  int64_t epoch_ = 0;
  bool done_ = false;
  size_t knob_ = 0;   // index into kKnobs
  size_t value_ = 0;  // the next index into the knob's Grid
  bool pass_moved_ = false;
  int pass_ = 1;
  std::map<std::string, double> measured_;  // Key -> score
  // The current epoch's samples, per rank: (bytes, micros) of the measured steps.
  std::vector<int> seen_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> samples_;
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_AUTOTUNE_H_
