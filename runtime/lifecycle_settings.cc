// The runtime's side of settings changed during a job (Note [Settings changes],
// step_settings.h): what a change touches on this rank, and what it reports.
#include <utility>

#include "glog/logging.h"
#include "runtime/runtime_impl.h"

namespace braid {

StepSettings* Runtime::Impl::MakeStepSettings(const proto::JobSettings& job) {
  transport::Communicator* data = channels_.data.get();
  // The job's own (epoch 0); 0 keeps the piece the data plane chose by topology.
  data->SetPipeline(static_cast<size_t>(job.ring_chunk_bytes()),
                    static_cast<int>(job.ring_window()));
  StepSettings::Hooks h;
  h.rank = rank_;
  h.sample = job.autotune() != 0;
  h.log_path = config_.autotune_log_path;
  // braid-loop, between buckets: nothing else touches these meanwhile.
  AutoCompression* chooser = auto_compression_.get();
  h.apply = [this, data, chooser](const proto::TunedSettings& s) {
    // Cycle time 0: each rank keeps its own (BRAID_CYCLE_TIME_MS).
    controller_.Retune(absl::Microseconds(s.cycle_time_us()), s.fusion_threshold_bytes());
    data->SetPipeline(static_cast<size_t>(s.ring_chunk_bytes()), s.ring_window());
    // Every rank runs the same code on the same change: a refusal keeps every rank's method.
    absl::Status st = chooser->Apply(s.compression());
    LOG_IF(ERROR, !st.ok()) << "braid: " << st;
  };
  h.auto_step = [chooser](proto::TuningSample* s) { return chooser->TakeStep(s); };
  h.report = [this](const proto::TuningSample& s) { controller_.SendSample(s); };
  h.all_reduce_bytes = [this](const std::string& name) {
    return controller_.AllReduceBytes(name);
  };
  absl::MutexLock lock(&parts_mu_);
  step_settings_ = std::make_unique<StepSettings>(std::move(h));
  return step_settings_.get();
}

absl::StatusOr<std::vector<SettingsApplied>> Runtime::Impl::SettingsHistory() const {
  absl::MutexLock lock(&parts_mu_);
  if (step_settings_ == nullptr) return absl::FailedPreconditionError("braid is not initialized");
  return step_settings_->history();
}

absl::StatusOr<std::vector<SettingsApplied>> Runtime::SettingsHistory() const {
  return impl_->SettingsHistory();
}

}  // namespace braid
