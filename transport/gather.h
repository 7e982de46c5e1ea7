// Gathered all-reduce: the all-reduce of a bucket whose tensors lie scattered in memory,
// with the copies into and out of the contiguous buffer overlapped with the transfer.
//
// Note [Gathered all-reduce]
// A fused bucket of tensors that do not lie back to back (PyTorch allocates each gradient on
// its own) is all-reduced as one buffer: the runtime gathers the tensors into its fusion
// buffer, reduces that and scatters the results back (runtime/allreduce_pipeline.h). Done
// as three passes, the copy in reads every input and writes the whole buffer before the
// first byte moves, and the copy out starts after the last byte arrived: two passes over
// the bucket's bytes in memory that the transfer waits for (a scattered 200-tensor step took
// about twice one pre-fused buffer). Communicator::AllReduceGathered takes the pieces
// instead, and the pipelined algorithms (Note [Ring pipeline], transport/pipeline.h) take
// each pipeline piece where it lies: a piece that lies within one tensor is sent from its
// input, reduced from its input into its output, and received straight into its output,
// with no copy at all; a piece that spans tensors is copied into the scratch buffer just
// before its first stage reads it and out just after its last stage wrote it, overlapping
// the other pieces' transfers and touching bytes still in cache. The messages are the same
// (sizes, tags, order) and the reduction reads the same bytes in the same order as over the
// gathered buffer, so the result has the same bits: ranks may gather or copy as they like. Recursive
// doubling (small buffers), one rank, and the ring of 16-bit sums (which widens its whole
// input first) copy in, reduce and copy out as three passes.
#ifndef BRAID_TRANSPORT_GATHER_H_
#define BRAID_TRANSPORT_GATHER_H_

#include <cstddef>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "transport/communicator.h"
#include "transport/context.h"

namespace braid::transport {

// Where each piece lies in the gathered buffer. The pieces outlive the map.
class GatherMap {
 public:
  explicit GatherMap(absl::Span<const GatheredPiece> pieces);

  size_t bytes() const { return bytes_; }

  // Copies bytes [begin, begin + n) of the gathered buffer from the pieces' inputs to
  // `buffer` + begin, or from there to the pieces' outputs.
  void CopyIn(char* buffer, size_t begin, size_t n, const Kernels& kernels) const;
  void CopyOut(const char* buffer, size_t begin, size_t n, const Kernels& kernels) const;

  // The piece that holds all of bytes [begin, begin + n) of the gathered buffer (n > 0), and
  // where they start in it (*offset); null when they span pieces, or n is 0.
  const GatheredPiece* Within(size_t begin, size_t n, size_t* offset) const;

 private:
  // The last piece that starts at or before byte `begin` (pieces not empty).
  size_t First(size_t begin) const;
  // Calls visit(piece, offset in the piece, offset in the buffer, bytes) for each part of
  // [begin, begin + n) that lies in one piece.
  template <typename Visit>
  void ForRange(size_t begin, size_t n, Visit visit) const;

  absl::Span<const GatheredPiece> pieces_;
  std::vector<size_t> starts_;  // starts_[i]: piece i's offset in the buffer
  size_t bytes_ = 0;
};

// InvalidArgument unless the pieces' bytes add up to `count` elements of `dtype`.
absl::Status CheckGathered(absl::Span<const GatheredPiece> pieces, size_t count,
                           DataType dtype);

// The three-pass form, where nothing overlaps: copies every piece of `map` into `buffer`,
// runs `reduce` (an all-reduce in place in `buffer`), and on success copies every piece out.
absl::Status ReduceInThreePasses(const GatherMap& map, char* buffer, const Kernels& kernels,
                                 absl::FunctionRef<absl::Status()> reduce);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_GATHER_H_
