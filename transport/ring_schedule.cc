#include "transport/ring_schedule.h"

#include <algorithm>

namespace braid::transport {
namespace {
int Mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

std::vector<Span1D> PartitionEven(size_t count, int parts) {
  std::vector<Span1D> out(parts > 0 ? parts : 0);
  if (parts <= 0) return out;
  size_t base = count / parts, extra = count % parts, offset = 0;
  for (int i = 0; i < parts; ++i) {
    size_t n = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    out[i] = {offset, n};
    offset += n;
  }
  return out;
}

std::vector<Span1D> PartitionByCounts(const std::vector<size_t>& counts) {
  std::vector<Span1D> out(counts.size());
  size_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    out[i] = {offset, counts[i]};
    offset += counts[i];
  }
  return out;
}

// Reduce-scatter step s: rank r sends segment (r - s + shift) and receives (r - s - 1 + shift)
// from r-1, reducing it into its own copy; after size-1 steps rank r holds the full reduction
// of segment (r + 1 + shift). All-gather step s: rank r sends (r + 1 - s + shift), the segment
// it completed last, and receives (r - s + shift).
std::vector<RingStep> RingSchedule(int rank, int size, int owned_shift) {
  std::vector<RingStep> steps;
  if (size <= 1) return steps;
  steps.reserve(2 * (size - 1));
  for (int s = 0; s < size - 1; ++s) {
    steps.push_back({RingStep::kReduceScatter, s, Mod(rank - s + owned_shift, size),
                     Mod(rank - s - 1 + owned_shift, size)});
  }
  for (int s = 0; s < size - 1; ++s) {
    steps.push_back({RingStep::kAllGather, s, Mod(rank + 1 - s + owned_shift, size),
                     Mod(rank - s + owned_shift, size)});
  }
  return steps;
}

int RingOwnedSegment(int rank, int size, int owned_shift) {
  return Mod(rank + 1 + owned_shift, size);
}

std::vector<Span1D> SplitSpan(const Span1D& segment, int pieces) {
  std::vector<Span1D> out = PartitionEven(segment.count, pieces);
  for (auto& p : out) p.offset += segment.offset;
  return out;
}

int RingPieces(size_t max_segment_bytes, size_t chunk_bytes, int max_pieces) {
  if (chunk_bytes == 0) return 1;
  size_t pieces = (max_segment_bytes + chunk_bytes - 1) / chunk_bytes;
  pieces = std::min<size_t>(pieces, static_cast<size_t>(std::max(1, max_pieces)));
  return static_cast<int>(std::max<size_t>(pieces, 1));
}

AllReduceAlgorithm ChooseAllReduceAlgorithm(size_t bytes, size_t count, int size,
                                            size_t ring_threshold_bytes) {
  if (size <= 1) return AllReduceAlgorithm::kRecursiveDoubling;
  if (count < static_cast<size_t>(size)) return AllReduceAlgorithm::kRecursiveDoubling;
  return bytes >= ring_threshold_bytes ? AllReduceAlgorithm::kRing
                                       : AllReduceAlgorithm::kRecursiveDoubling;
}

ReduceScatterAlgorithm ChooseReduceScatterAlgorithm(int size, int direct_max_ranks) {
  return size > direct_max_ranks ? ReduceScatterAlgorithm::kRing
                                 : ReduceScatterAlgorithm::kDirect;
}

RecursiveDoublingRole RecursiveDoublingRoleFor(int rank, int size) {
  int p2 = 1;
  while (p2 * 2 <= size) p2 *= 2;
  int rem = size - p2;
  RecursiveDoublingRole role{-1, -1, p2};
  if (rank < 2 * rem) {
    if (rank % 2 == 0) {
      role.partner = rank + 1;
      role.new_rank = -1;  // hands its data to rank+1 and sits out
    } else {
      role.partner = rank - 1;
      role.new_rank = rank / 2;
    }
  } else {
    role.new_rank = rank - rem;
  }
  return role;
}

int RecursiveDoublingRealRank(int new_rank, int size) {
  int p2 = 1;
  while (p2 * 2 <= size) p2 *= 2;
  int rem = size - p2;
  return new_rank < rem ? new_rank * 2 + 1 : new_rank + rem;
}

}  // namespace braid::transport
