#include "control/fusion.h"

namespace braid::control {

std::vector<std::vector<int>> PlanBuckets(const std::vector<FusionItem>& items,
                                          int64_t threshold_bytes) {
  const int n = static_cast<int>(items.size());
  std::vector<bool> placed(n, false);
  std::vector<std::vector<int>> buckets;
  for (int i = 0; i < n; ++i) {
    if (placed[i]) continue;
    placed[i] = true;
    std::vector<int> bucket{i};
    int64_t bytes = items[i].bytes;
    const bool fusable = threshold_bytes > 0 && !items[i].key.empty() && bytes <= threshold_bytes;
    for (int j = i + 1; fusable && j < n; ++j) {
      if (placed[j] || items[j].key != items[i].key) continue;
      if (items[j].bytes > threshold_bytes) continue;  // travels alone: not in the run
      // The bucket is a run of consecutive items of its key (Note [Consecutive buckets]):
      // the first that does not fit closes it, even if a smaller one later would.
      if (bytes + items[j].bytes > threshold_bytes) break;
      placed[j] = true;
      bucket.push_back(j);
      bytes += items[j].bytes;
    }
    buckets.push_back(std::move(bucket));
  }
  return buckets;
}

}  // namespace braid::control
