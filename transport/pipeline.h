// The pipelined engine behind the bandwidth-optimal collectives: a reduce-scatter (direct or
// ring) and/or a ring all-gather over a buffer cut into per-rank segments.
//
// Note [Ring pipeline]
// Every segment is cut into the same number P of pieces, and piece j of every segment moves
// through the stages on its own: the reduce-scatter stage(s), then the all-gather's n-1 ring
// steps. At most `ring_window` pieces are in flight, each with its own slot of scratch (so
// what arrives is still in cache when it is reduced), and a piece's next stage starts as soon
// as its previous one finished, while other pieces are still in flight.
//  - Direct reduce-scatter, one stage: every rank sends piece j of each peer's segment to that
//    peer and receives piece j of its own segment from every peer (fan-in n-1), then reduces
//    the n contributions in the canonical order (transport/canonical_reduce.h).
//  - Ring reduce-scatter, n-1 stages (Patarasuk & Yuan 2009): at each, a rank receives a
//    partial sum from its left neighbour, adds its own input and sends the result on at the
//    next stage (fan-in 1).
//  - Ring all-gather, n-1 stages: a rank sends the piece it completed last to the right and
//    receives one from the left, straight into the output.
// The owned segment's result is written straight to its destination (out = reduce(inputs)),
// so an out-of-place call never copies its input first. A stage starts only once the previous
// one's sends completed too, so no buffer is overwritten while a peer may still read it.
// With a GatherMap (Note [Gathered all-reduce], transport/gather.h; an all-reduce in place
// in `work`, the scratch), piece j of a segment that lies within one of the map's pieces is
// read from that input and its result written to (and all-gathered from) that output; one
// that spans pieces is copied into `work` when piece j starts and out once its last stage
// completed.
// Tags: slot = stage * P + j (Note [Tag layout]); P is capped so that stays below 2^16.
#ifndef BRAID_TRANSPORT_PIPELINE_H_
#define BRAID_TRANSPORT_PIPELINE_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "transport/context.h"
#include "transport/gather.h"
#include "transport/ring_schedule.h"

namespace braid::transport {

enum class ReduceScatterKind { kNone, kDirect, kRing };

struct RingPipelineArgs {
  const char* send = nullptr;    // this rank's input, full layout (reduce-scatter only)
  char* work = nullptr;          // full layout: partial sums, the all-gather's blocks
  char* owned_out = nullptr;     // the owned segment's final reduction (nullptr: into work)
  std::vector<Span1D> segments;  // one per rank, in elements
  size_t elem = 1;               // bytes per element
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;  // kAverage: sum, then the owner divides by n
  ReduceScatterKind reduce_scatter = ReduceScatterKind::kNone;
  bool all_gather = true;
  // Rank r owns segment RingOwnedSegment(r, n, shift) after the reduce-scatter, and the
  // all-gather starts by sending it: 0 for an all-reduce, n-1 to own segment r.
  int shift = 0;
  // Set: an all-reduce (reduce-scatter and all-gather, send == work, no owned_out) of the
  // buffer this map gathers into `work`.
  const GatherMap* gather = nullptr;
};

// Runs the pipeline on ctx (n >= 2). Errors: those of transport/collectives.h.
absl::Status RunRingPipeline(Context& ctx, const RingPipelineArgs& args);

// Pieces per segment: enough that none is larger than `chunk_bytes` (at most 4096), at least
// 1, and few enough that `stages` * pieces tags fit in a slot (Note [Tag layout]). Needs
// stages < kMaxTagSlots.
int PipelinePieces(size_t max_segment_bytes, size_t chunk_bytes, int stages);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_PIPELINE_H_
