#include "tools/bench/sparse_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "compression/sparse.h"

namespace braid::bench {

bool IsSparseMethod(const std::string& method) {
  return method == "scalecomp" || method == "topk" || method == "randomk";
}

size_t SparseLimit(const compression::CompressionSpec& spec, size_t count, int ranks) {
  const size_t k = compression::SparseK(count, spec.FloatOption("ratio"));
  return spec.method == "topk" ? std::min(count, k * static_cast<size_t>(ranks)) : k;
}

int64_t CheckSparseRoundTrip(const float* in, const float* out, size_t count, size_t limit,
                             bool by_magnitude, size_t* selected) {
  int64_t wrong = 0;
  size_t chosen = 0;
  float min_selected = INFINITY, max_unselected = 0;
  for (size_t i = 0; i < count; ++i) {
    if (out[i] != 0.0f) {
      ++chosen;
      wrong += out[i] != in[i] ? 1 : 0;
      min_selected = std::min(min_selected, std::fabs(in[i]));
    } else {
      max_unselected = std::max(max_unselected, std::fabs(in[i]));
    }
  }
  if (chosen > limit) wrong += static_cast<int64_t>(chosen - limit);
  if (by_magnitude && chosen > 0 && min_selected < max_unselected) ++wrong;
  *selected = chosen;
  return wrong;
}

double TimeSelection(compression::TopKSelector* selector, const float* x, size_t count, size_t k,
                     compression::TopKAlgorithm algorithm, std::vector<uint64_t>* indices) {
  const compression::FloatSegment seg{x, count};
  const auto t0 = std::chrono::steady_clock::now();
  selector->Select(absl::MakeConstSpan(&seg, 1), k, indices, algorithm);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace braid::bench
