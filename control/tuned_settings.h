// The settings that may change during a job (proto TunedSettings, Note [Settings changes]
// in runtime/step_settings.h) as knobs: read, set and described the same way by the
// coordinator that changes them (coordinator/autotune.h), the ranks that apply them and
// braidctl that shows them.
#ifndef BRAID_CONTROL_TUNED_SETTINGS_H_
#define BRAID_CONTROL_TUNED_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/braid.pb.h"

namespace braid {

// The knobs, in the order the autotuner visits them.
enum class Knob { kFusionThreshold, kCycleTime, kRingChunk, kRingWindow };
constexpr Knob kKnobs[] = {Knob::kFusionThreshold, Knob::kCycleTime, Knob::kRingChunk,
                           Knob::kRingWindow};

int64_t KnobValue(const proto::TunedSettings& s, Knob knob);
void SetKnob(proto::TunedSettings* s, Knob knob, int64_t v);
// "fusion_threshold=16MiB", "cycle_time=2ms" ("own" for 0: each rank's), "ring_chunk=64KiB"
// ("auto" for 0: by topology), "ring_window=8".
std::string DescribeKnob(Knob knob, int64_t v);
// Every knob, as DescribeKnob, comma-separated.
std::string DescribeSettings(const proto::TunedSettings& s);

// The methods compression `auto` chooses from, least lossy first, as canonical specs (Note
// [Auto compression] in runtime/auto_compression.h): none, fp16, fp4:ef=1,
// powersgd:rank=4, scalecomp (ratio 100). Samples name them by place.
const std::vector<std::string>& AutoLadder();

}  // namespace braid

#endif  // BRAID_CONTROL_TUNED_SETTINGS_H_
