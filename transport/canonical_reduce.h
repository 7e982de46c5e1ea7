// The one order in which braid combines the ranks' contributions to an element.
//
// Note [Canonical reduction order]
// Floating-point reduction is not associative, so the bits of a result depend on the order
// of the operations. braid combines the n contributions to every element in one fixed tree,
// whatever the element's position, the message size or the algorithm: the tree recursive
// doubling builds (Thakur, Rabenseifner & Gropp 2005). With p2 the largest power of two <= n
// and rem = n - p2, ranks 2i and 2i+1 are combined first for i < rem; that leaves p2 values
// (the pairs, then ranks 2*rem .. n-1), which are combined as a balanced binary tree:
// neighbours at distance 1, then 2, 4, ... Every combination puts the lower ranks' operand
// first, so even min/max of signed zeros and NaN payloads come out the same on every rank.
// Hence a tensor reduces to the same bits whether it is fused into a bucket with others or
// not, and whichever algorithm its bucket's size selects. Recursive doubling and the direct
// reduce-scatter keep this order; the ring reduce-scatter cannot (it adds one rank at a time
// along the ring) and is used only above CollectiveOptions::direct_max_ranks ranks.
//
// Note [16-bit arithmetic]
// float16 and bfloat16 sums, averages and products are computed in float32 and rounded to
// the 16-bit type once, at the end, in every algorithm: rounding after each combination
// would make an intermediate sum overflow (float16's maximum is 65504) or lose the small
// operands, although the result fits. An average pre-divides: each rank's contribution is
// widened and divided by n in float32 before it is summed, as NCCL's average pre-multiplies,
// so no partial sum exceeds the largest input and an average whose true value is
// representable is returned (within one rounding), for bfloat16 too, whose range is
// float32's own. Per algorithm:
//  - direct reduce-scatter (alone or in an all-reduce): the owner widens the n received
//    16-bit operands block by block (CanonicalReduceWide) and rounds once; the wire carries
//    16 bits, as before;
//  - recursive doubling (small messages): runs on a float32 copy, so the partial results it
//    exchanges are float32 (twice the bytes of a latency-bound message);
//  - ring reduce-scatter (above direct_max_ranks): a float32 copy too, so the ring's partial
//    sums travel as float32; the all-gather that follows moves the rounded 16-bit result.
// Every algorithm combines the same float32 values in its documented order, so the
// canonical ones stay bit-identical to each other (fused == unfused). Min and max need no
// widening: their result is one of the operands. float32 and float64 sum then divide.
#ifndef BRAID_TRANSPORT_CANONICAL_REDUCE_H_
#define BRAID_TRANSPORT_CANONICAL_REDUCE_H_

#include <cstddef>
#include <vector>

#include "common/dtype.h"
#include "transport/context.h"

namespace braid::transport {

// out[i] = the canonical tree over ranks r = 0..n-1 of operands[r][i], for i < count, with
// `op` (kSum, kMin, kMax or kProduct; an average is a sum then a division). operands.size()
// is n >= 1. Every operand but at most one must be writable (writable[r]): the tree keeps its
// intermediate values there. `out` may be the non-writable operand.
void CanonicalReduce(const Kernels& kernels, void* out, std::vector<const char*> operands,
                     std::vector<bool> writable, size_t count, DataType dtype, ReduceOp op);

// Elements per block of CanonicalReduceWide: its scratch holds n blocks of float32.
constexpr size_t kWideBlock = 2048;

// The canonical tree for float16 / bfloat16 operands in float32 (Note [16-bit arithmetic]):
// each operand is widened and divided by `divisor` (the world size for an average, else 1),
// the tree is evaluated in float32 with `op` (kSum or kProduct), and the result rounded once
// into `out` (which may be an operand). No operand is written. `scratch` holds at least
// operands.size() * kWideBlock floats.
void CanonicalReduceWide(const Kernels& kernels, void* out,
                         const std::vector<const char*>& operands, size_t count, DataType dtype,
                         ReduceOp op, int divisor, float* scratch);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_CANONICAL_REDUCE_H_
