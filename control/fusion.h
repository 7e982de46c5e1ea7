// Fusion planning: a pure function from ready tensors to buckets (after c10d's
// compute_bucket_assignment_by_size, kept apart from the stateful parts).
#ifndef BRAID_CONTROL_FUSION_H_
#define BRAID_CONTROL_FUSION_H_

#include <cstdint>
#include <string>
#include <vector>

namespace braid::control {

struct FusionItem {
  // Tensors fuse only with others of the same key (collective, dtype, reduce op, device,
  // compression, process set); an empty key never fuses.
  std::string key;
  int64_t bytes = 0;
};

// Groups `items` (in execution order) into buckets of at most `threshold_bytes`: each bucket
// starts at the first item not yet placed and takes the following items of the same key
// while they fit, looking past items of other keys and items larger than the threshold
// (which travel alone); the first item of its key that does not fit closes it. Threshold 0
// disables fusion. Buckets are ordered by their first item, and items keep their relative
// order inside a bucket. Returns indices into `items`.
//
// Note [Consecutive buckets]: a bucket is a run of consecutive tensors of its key, as c10d
// assigns buckets, rather than packed as full as later, smaller tensors could make it. So
// tensors a framework lays out back to back in the order it submits them (gradients as
// bucket views, one flat buffer per dtype) stay back to back in every bucket, and the
// runtime reduces the bucket where it lies (Note [In place], runtime/allreduce_pipeline.h)
// instead of copying it into its fusion buffer and back. The price: a bucket may close up
// to one tensor short of the threshold, which costs at most a few more buckets when a
// cycle's ready tensors exceed the threshold (64 MiB by default), and nothing otherwise.
std::vector<std::vector<int>> PlanBuckets(const std::vector<FusionItem>& items,
                                          int64_t threshold_bytes);

}  // namespace braid::control

#endif  // BRAID_CONTROL_FUSION_H_
