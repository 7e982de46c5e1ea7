// A job's settings changed while it runs (Note [Settings changes] in runtime/step_settings.h):
// the ranks' step samples in, the autotuner's decisions out (Note [Autotuning],
// autotune.h).
#include <utility>

#include "common/limits.h"
#include "coordinator/job.h"
#include "glog/logging.h"

namespace braid::coordinator {

proto::TunedSettings Job::StartSettings() const {
  proto::TunedSettings s;
  s.set_fusion_threshold_bytes(settings_.fusion_threshold_bytes());
  // BRAID_CYCLE_TIME_MS is each rank's own, which the coordinator does not know: 0 keeps it
  // (TunedSettings.cycle_time_us), so the job's own settings are measured as they are.
  s.set_cycle_time_us(0);
  int64_t chunk = settings_.ring_chunk_bytes();
  if (chunk == 0) {
    // By topology, as every rank resolves it with its transport's defaults
    // (transport/ucx_communicator.h: PipelineChunkBytes).
    bool one_host = true;
    for (const Rank& r : ranks_) one_host &= r.host == ranks_.front().host;
    chunk = one_host ? kDefaultRingChunkBytes : kDefaultRingChunkBytesAcrossHosts;
  }
  s.set_ring_chunk_bytes(chunk);
  s.set_ring_window(static_cast<int32_t>(settings_.ring_window()));
  return s;
}

void Job::FillSettingsChange(proto::StatusResponse* out) const {
  if (settings_change_.epoch() > 0) *out->mutable_settings_change() = settings_change_;
  out->set_settings_since_step(settings_since_step_);
  out->set_autotune(autotuner_ == nullptr ? "off" : autotuner_->done() ? "done" : "searching");
  if (chooser_ != nullptr) {
    out->set_auto_compression(chooser_->reason().empty() ? "measuring" : chooser_->reason());
  }
}

void Job::OnSamples(int rank, const proto::RequestList& msg) {
  if (!abort_.ok() || phase_ != proto::JOB_RUNNING) return;  // no change after an abort
  for (const proto::TuningSample& sample : msg.samples()) {
    if (settings_since_step_ == 0 && settings_change_.epoch() > 0 &&
        sample.epoch() == settings_change_.epoch()) {
      settings_since_step_ = sample.step();
    }
    if (sample.auto_bytes() > 0) OnAutoSample(rank, sample);
    if (autotuner_ == nullptr) continue;
    std::optional<proto::SettingsChange> change = autotuner_->OnSample(rank, sample);
    if (!change) continue;
    table_->set_fusion_threshold(change->settings().fusion_threshold_bytes());
    // Autotuning leaves compression `auto`'s method as it is.
    if (chooser_ != nullptr) change->mutable_settings()->set_compression(chooser_->method());
    SendSettingsChange(*std::move(change));
  }
}

void Job::OnAutoSample(int rank, const proto::TuningSample& sample) {
  if (chooser_ == nullptr) {
    chooser_ = std::make_unique<CompressionChooser>(opts_.auto_compression, world_size_,
                                                    settings_change_.epoch());
  }
  // Autotuning measures its candidates with the method in force: the choice waits for it.
  if (autotuner_ != nullptr && !autotuner_->done()) return;
  std::optional<CompressionChooser::Choice> choice = chooser_->OnSample(rank, sample);
  if (!choice) return;
  proto::SettingsChange change;
  change.set_epoch(settings_change_.epoch() + 1);
  *change.mutable_settings() =
      settings_change_.epoch() > 0 ? settings_change_.settings() : StartSettings();
  change.mutable_settings()->set_compression(choice->method);
  change.set_reason(choice->reason);
  SendSettingsChange(std::move(change));
}

void Job::SendSettingsChange(proto::SettingsChange change) {
  LOG(INFO) << "braid-coordinator: job " << id() << ": settings epoch " << change.epoch()
            << ": " << DescribeSettings(change.settings()) << " (" << change.reason() << ")";
  if (chooser_ != nullptr) chooser_->Changed(change.epoch());
  settings_change_ = change;
  settings_since_step_ = 0;
  proto::ResponseList rl;
  *rl.mutable_settings_change() = std::move(change);
  Broadcast(std::move(rl));
}

}  // namespace braid::coordinator
