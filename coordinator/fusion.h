// Fusion planning: a pure function from ready tensors to buckets (after c10d's
// compute_bucket_assignment_by_size, kept apart from the stateful parts).
#ifndef BRAID_COORDINATOR_FUSION_H_
#define BRAID_COORDINATOR_FUSION_H_

#include <cstdint>
#include <string>
#include <vector>

namespace braid::coordinator {

struct FusionItem {
  // Tensors fuse only with others of the same key (collective, dtype, reduce op, device,
  // compression, process set); an empty key never fuses.
  std::string key;
  int64_t bytes = 0;
};

// Groups `items` (in execution order) into buckets of at most `threshold_bytes`: each bucket
// starts at the first item not yet placed and takes later items of the same key that still
// fit, looking past items of other keys. An item larger than the threshold travels alone;
// threshold 0 disables fusion. Buckets are ordered by their first item, and items keep their
// relative order inside a bucket. Returns indices into `items`.
std::vector<std::vector<int>> PlanBuckets(const std::vector<FusionItem>& items,
                                          int64_t threshold_bytes);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_FUSION_H_
