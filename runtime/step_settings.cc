// Settings applied at step boundaries (Note [Settings changes], step_settings.h).
#include "runtime/step_settings.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "control/tuned_settings.h"
#include "glog/logging.h"

namespace braid {

StepSettings::StepSettings(Hooks hooks) : hooks_(std::move(hooks)) {}

bool StepSettings::Before(const Bucket& bucket) {
  if (bucket.settings_change != nullptr) {
    // The latest wins: two changes before one boundary apply as the second.
    pending_ = bucket.settings_change;
    if (hooks_.rank == 0 && pending_->has_measured()) WriteLogRow(*pending_);
    return false;
  }
  // An error bucket runs no collective, and some go to one rank alone (a local refusal's
  // reply, Note [Failure reports]): counted, they would move that rank's boundaries.
  if (bucket.process_set_id != 0 || bucket.names.empty() || !bucket.error.ok()) return true;
  const absl::Time now = Now();
  if (step_ == 0) {
    step_ = 1;
    step_start_ = now;
  }
  bool repeated = seen_.size() >= kMaxStepNames;
  for (const std::string& name : bucket.names) repeated |= seen_.contains(name);
  if (repeated) Boundary(now);
  for (const std::string& name : bucket.names) {
    seen_.insert(name);
    if (hooks_.all_reduce_bytes) step_bytes_ += hooks_.all_reduce_bytes(name);
  }
  return true;
}

void StepSettings::Boundary(absl::Time now) {
  proto::TuningSample s;
  const bool auto_ran = hooks_.auto_step && hooks_.auto_step(&s);
  const bool tuning = hooks_.sample && (last_sampled_step_ < 0 || step_ <= last_sampled_step_);
  if ((tuning || auto_ran) && hooks_.report) {
    s.set_epoch(epoch_);
    s.set_step(step_);
    s.set_bytes(step_bytes_);
    s.set_micros(absl::ToInt64Microseconds(now - step_start_));
    hooks_.report(s);
  }
  ++step_;
  step_start_ = now;
  step_bytes_ = 0;
  seen_.clear();
  if (pending_ != nullptr) {
    Apply(*pending_);
    pending_.reset();
  }
}

void StepSettings::Apply(const proto::SettingsChange& change) {
  if (change.epoch() <= epoch_) return;
  epoch_ = change.epoch();
  if (hooks_.apply) hooks_.apply(change.settings());
  // One more sample after the search ends: the coordinator learns the step it applied from.
  if (change.tuning_done()) last_sampled_step_ = step_;
  const std::string line =
      absl::StrFormat("braid: settings epoch %d from step %d: %s (%s)", epoch_, step_,
                      DescribeSettings(change.settings()), change.reason());
  if (hooks_.rank == 0) {
    LOG(INFO) << line;
  } else {
    VLOG(1) << line;
  }
  const proto::TunedSettings& s = change.settings();
  absl::MutexLock lock(&mu_);
  history_.push_back({epoch_, step_, s.fusion_threshold_bytes(), s.cycle_time_us(),
                      s.ring_chunk_bytes(), s.ring_window(), change.reason(),
                      change.tuning_done(), s.compression()});
}

void StepSettings::WriteLogRow(const proto::SettingsChange& change) {
  if (hooks_.log_path.empty() || log_failed_) return;
  if (!log_.is_open()) {
    log_.open(hooks_.log_path, std::ios::out | std::ios::trunc);
    if (!log_) {
      log_failed_ = true;
      LOG(WARNING) << "braid: cannot write the autotuning log " << hooks_.log_path
                   << " (BRAID_AUTOTUNE_LOG); tuning goes on without it";
      return;
    }
    log_ << "epoch,step,fusion_threshold_bytes,cycle_time_ms,ring_chunk_bytes,ring_window,"
            "measured_steps,bytes_per_second,best\n";
  }
  const proto::TuningScore& m = change.measured();
  const proto::TunedSettings& s = m.settings();
  log_ << absl::StrFormat("%d,%d,%d,%g,%d,%d,%d,%.0f,%d\n", m.epoch(), step_,
                          s.fusion_threshold_bytes(), s.cycle_time_us() / 1e3,
                          s.ring_chunk_bytes(), s.ring_window(), m.steps(),
                          m.bytes_per_second(), m.best() ? 1 : 0);
  log_.flush();
}

std::vector<SettingsApplied> StepSettings::history() const {
  absl::MutexLock lock(&mu_);
  return history_;
}

}  // namespace braid
