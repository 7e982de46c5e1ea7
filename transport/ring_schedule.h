// Pure planning functions for the data plane's algorithms: how a buffer is cut into
// segments and chunks, which segment a rank sends and receives at each ring step, and which
// all-reduce algorithm a message size gets. No I/O: unit-tested without processes.
#ifndef BRAID_TRANSPORT_RING_SCHEDULE_H_
#define BRAID_TRANSPORT_RING_SCHEDULE_H_

#include <cstddef>
#include <vector>

namespace braid::transport {

// [offset, offset + count) in elements.
struct Span1D {
  size_t offset = 0;
  size_t count = 0;
  bool operator==(const Span1D& o) const { return offset == o.offset && count == o.count; }
};

// Cuts `count` elements into `parts` contiguous spans; the first count % parts get one more.
std::vector<Span1D> PartitionEven(size_t count, int parts);

// Spans laid back to back from per-part counts (reduce-scatter with per-rank counts).
std::vector<Span1D> PartitionByCounts(const std::vector<size_t>& counts);

// One step of the ring all-reduce for one rank: send segment `send_segment` to rank+1 and
// receive segment `recv_segment` from rank-1. In the reduce-scatter phase the received data is
// reduced into the local segment; in the all-gather phase it overwrites it.
struct RingStep {
  enum Phase { kReduceScatter, kAllGather } phase;
  int step;          // 0 .. size-2 within the phase
  int send_segment;
  int recv_segment;
};

// Ring all-reduce (reduce-scatter then all-gather; Patarasuk & Yuan 2009) for `rank` of
// `size`: 2(size-1) steps. The pipeline (transport/pipeline.h) runs its all-gather phase, and
// its reduce-scatter phase above CollectiveOptions::direct_max_ranks ranks; below, the
// reduce-scatter is direct instead (every rank receives its segment from every peer), so that
// each element is reduced in the canonical order (transport/canonical_reduce.h). After the
// reduce-scatter phase rank r owns segment (r+1) % size fully reduced. `owned_shift` rotates
// the schedule so rank r ends up owning segment (r + 1 + owned_shift) % size: reduce-scatter
// uses owned_shift = size-1 to own segment r.
std::vector<RingStep> RingSchedule(int rank, int size, int owned_shift = 0);

// Segment rank `rank` owns fully reduced after the reduce-scatter phase.
int RingOwnedSegment(int rank, int size, int owned_shift = 0);

// Splits `segment` into `pieces` pipeline chunks (PartitionEven, offsets kept absolute).
std::vector<Span1D> SplitSpan(const Span1D& segment, int pieces);

// Pipeline depth for a ring: enough pieces that none is larger than `chunk_bytes`, at most
// `max_pieces`, at least 1.
int RingPieces(size_t max_segment_bytes, size_t chunk_bytes, int max_pieces);

enum class AllReduceAlgorithm { kRing, kRecursiveDoubling };

// Recursive doubling (latency-optimal: log2(size) rounds) below `ring_threshold_bytes` or when
// there are fewer elements than ranks; the bandwidth-optimal reduce-scatter + all-gather
// ("ring", whose reduce-scatter ChooseReduceScatterAlgorithm picks) above. size 1 needs
// neither but reports kRecursiveDoubling.
AllReduceAlgorithm ChooseAllReduceAlgorithm(size_t bytes, size_t count, int size,
                                            size_t ring_threshold_bytes);

enum class ReduceScatterAlgorithm { kDirect, kRing };

// Direct (fan-in size-1, canonical reduction order) up to `direct_max_ranks` ranks; the ring
// (fan-in 1, summation order depends on the element's segment) above, where n-1 peers
// sending to one rank at once would be an incast across hosts.
ReduceScatterAlgorithm ChooseReduceScatterAlgorithm(int size, int direct_max_ranks);

// Recursive doubling for a size that is not a power of two (Thakur, Rabenseifner & Gropp
// 2005): with p2 the largest power of two <= size and rem = size - p2, ranks below 2*rem
// pair up first: the even one hands its data to the odd one and sits out ("extra"); the
// others take part under a new rank. Returns -1 for an extra rank.
struct RecursiveDoublingRole {
  int new_rank;     // rank among the p2 participants, or -1 if this rank sits out
  int partner;      // for a pairing rank (rank < 2*rem): the rank it pairs with; else -1
  int p2;           // participants
};
RecursiveDoublingRole RecursiveDoublingRoleFor(int rank, int size);
// Real rank of participant `new_rank`.
int RecursiveDoublingRealRank(int new_rank, int size);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_RING_SCHEDULE_H_
