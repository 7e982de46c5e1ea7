// Note [Settings changes]: settings that change while a job runs (proto TunedSettings: the
// fusion threshold, the cycle time, the ring's pipeline piece and window, the method of
// compression `auto`), decided in one
// place and applied by every rank at the same step boundary, never inside a step.
//
// Who decides: the coordinator (its autotuner, Note [Autotuning] in coordinator/autotune.h,
// and compression `auto`'s chooser, Note [Auto compression] in auto_compression.h). It sends a ResponseList that carries only a SettingsChange, in the
// one order every rank receives (never merged with another list: Note [Coalesced writes] in
// coordinator/server.cc); under the fast path the ranks apply it at the round they agree on,
// like any list (Note [Fast path]). So every rank meets the change at the same place in its
// sequence of buckets, which is the same on every rank (Note [Execution step]).
//
// Where it applies: at the first step boundary after that place. braid has no step call, so
// a rank finds steps in the buckets of the whole world (process set 0) it runs: a step ends
// where a bucket names a tensor already reduced since the last boundary (a model reduces
// each gradient once per step; the parameters' first broadcast is part of step 1). Error
// buckets do not count (some go to one rank alone). Every rank runs the same other buckets, so every rank counts the same steps and applies the change at
// the same one. A step of more than kMaxStepNames tensors is cut there. A job that names its
// tensors anew every step therefore changes settings only every kMaxStepNames tensors.
//
// What applies where: the cycle time and the fast path's fusion threshold (the controller),
// the pipeline piece and window (the world's data channel; a process set's channels keep the
// job's, BRAID_RING_*), the method `auto` buckets run with (AutoCompression). The coordinator fuses with the new threshold from the list on: the
// rest of that step may already be fused under it. Fusion never changes the result of an
// uncompressed or per-tensor method (every element is reduced alone, in the canonical
// order); methods that select over a whole bucket (ScaleComp, top-k and random-k with
// granularity=bucket) do change their selection with the threshold (docs/configuration.md).
//
// Measured: under BRAID_AUTOTUNE each rank sends the coordinator one TuningSample per step
// (bytes of the world's all-reduces in it, its wall time boundary to boundary, the epoch in
// force), until the search is done. Rank 0 logs each change (LOG(INFO)) and, with
// BRAID_AUTOTUNE_LOG, writes one CSV row per measured candidate.
#ifndef BRAID_RUNTIME_STEP_SETTINGS_H_
#define BRAID_RUNTIME_STEP_SETTINGS_H_

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/bucket.h"
#include "proto/braid.pb.h"
#include "runtime/runtime.h"

namespace braid {

class StepSettings {
 public:
  static constexpr size_t kMaxStepNames = 1 << 16;

  struct Hooks {
    int rank = 0;
    bool sample = false;   // BRAID_AUTOTUNE: a TuningSample per step
    std::string log_path;  // BRAID_AUTOTUNE_LOG (rank 0 writes it)
    std::function<void(const proto::TunedSettings&)> apply;
    std::function<void(const proto::TuningSample&)> report;
    // Note [Auto compression]: the step's `auto` figures into the sample; false when no
    // `auto` bucket ran in it (a step that ran one is sampled even after autotuning ends).
    std::function<bool(proto::TuningSample*)> auto_step;
    // Bytes of `name`'s tensor on this rank when it is an all-reduce in flight, else 0.
    std::function<int64_t(const std::string&)> all_reduce_bytes;
    std::function<absl::Time()> clock;  // null: absl::Now
  };

  explicit StepSettings(Hooks hooks);

  // braid-loop, before running `bucket`: false when the bucket only carries a settings
  // change (kept until the next boundary), true when the executor runs it.
  bool Before(const Bucket& bucket);

  // Thread-safe: the changes applied in this job, in order.
  std::vector<SettingsApplied> history() const;
  // braid-loop: the step being run (1 from the first bucket; 0 before).
  int64_t step() const { return step_; }

 private:
  void Boundary(absl::Time now);
  void Apply(const proto::SettingsChange& change);
  void WriteLogRow(const proto::SettingsChange& change);
  absl::Time Now() const { return hooks_.clock ? hooks_.clock() : absl::Now(); }

  const Hooks hooks_;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  absl::Time step_start_;
  int64_t step_bytes_ = 0;
  absl::flat_hash_set<std::string> seen_;
  std::shared_ptr<const proto::SettingsChange> pending_;
  int64_t last_sampled_step_ = -1;  // set once tuning is done: no samples after it
  std::ofstream log_;
  bool log_failed_ = false;
  mutable absl::Mutex mu_;
  std::vector<SettingsApplied> history_ ABSL_GUARDED_BY(mu_);
};

}  // namespace braid

#endif  // BRAID_RUNTIME_STEP_SETTINGS_H_
