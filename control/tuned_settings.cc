// Knobs of the settings that change during a job (tuned_settings.h).
#include "control/tuned_settings.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace braid {

namespace {

std::string Bytes(int64_t v) {
  constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;
  if (v >= kMiB && v % kMiB == 0) return absl::StrCat(v / kMiB, "MiB");
  if (v >= kKiB && v % kKiB == 0) return absl::StrCat(v / kKiB, "KiB");
  return absl::StrCat(v);
}

}  // namespace

int64_t KnobValue(const proto::TunedSettings& s, Knob knob) {
  switch (knob) {
    case Knob::kFusionThreshold: return s.fusion_threshold_bytes();
    case Knob::kCycleTime: return s.cycle_time_us();
    case Knob::kRingChunk: return s.ring_chunk_bytes();
    case Knob::kRingWindow: return s.ring_window();
  }
  return 0;
}

void SetKnob(proto::TunedSettings* s, Knob knob, int64_t v) {
  switch (knob) {
    case Knob::kFusionThreshold: s->set_fusion_threshold_bytes(v); break;
    case Knob::kCycleTime: s->set_cycle_time_us(v); break;
    case Knob::kRingChunk: s->set_ring_chunk_bytes(v); break;
    case Knob::kRingWindow: s->set_ring_window(static_cast<int32_t>(v)); break;
  }
}

std::string DescribeKnob(Knob knob, int64_t v) {
  switch (knob) {
    case Knob::kFusionThreshold: return absl::StrCat("fusion_threshold=", Bytes(v));
    case Knob::kCycleTime:
      if (v == 0) return "cycle_time=own";  // each rank's BRAID_CYCLE_TIME_MS
      return absl::StrCat("cycle_time=", absl::StrFormat("%g", v / 1e3), "ms");
    case Knob::kRingChunk:
      return absl::StrCat("ring_chunk=", v == 0 ? "auto" : Bytes(v));
    case Knob::kRingWindow: return absl::StrCat("ring_window=", v);
  }
  return "";
}

std::string DescribeSettings(const proto::TunedSettings& s) {
  std::vector<std::string> parts;
  for (Knob k : kKnobs) parts.push_back(DescribeKnob(k, KnobValue(s, k)));
  if (!s.compression().empty()) parts.push_back(absl::StrCat("auto compression=", s.compression()));
  return absl::StrJoin(parts, ", ");
}

const std::vector<std::string>& AutoLadder() {
  static const auto* ladder = new std::vector<std::string>{
      "none", "fp16", "fp4:ef=1", "powersgd:rank=4", "scalecomp"};
  return *ladder;
}

}  // namespace braid
