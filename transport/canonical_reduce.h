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

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_CANONICAL_REDUCE_H_
