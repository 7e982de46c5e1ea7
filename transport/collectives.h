// The collective algorithms, written once over the point-to-point layer (transport/p2p.h),
// as gloo's are free functions over its Pair: every backend runs the same code.
//
// Contract of every function here: it is called on every rank of `ctx` in the same order,
// with the same sizes and dtype/op (roots and buffers aside); arguments are not checked (the
// Communicator does that: transport/collective_communicator.h); it draws a fresh sequence
// number from ctx for its tags; it blocks until this rank's part is done and returns OK, or
// the first error: DeadlineExceeded (no message completed for ctx.options().timeout),
// Unavailable (a peer was lost), Internal (a message of the wrong length: ranks called
// different collectives or sizes), or the reason given to Abort(). Statistics are counted by
// ctx as messages complete (Note [Transport statistics] in transport/communicator.h).
//
// Traffic figures are per rank, for a buffer of N bytes on n ranks: "sent" is what goes on
// the wire (the transport bytes), "memory" the bytes read or written in this rank's memory,
// not counting the backend's own copies (UCX's shared-memory eager protocol copies a message
// once more into a bounce buffer; its CMA rendezvous reads the sender's buffer directly).
//
// Summation order: recursive doubling and the direct reduce-scatter combine every element in
// the canonical tree (Note [Canonical reduction order] in transport/canonical_reduce.h), so
// their results do not depend on where an element sits, on the message size or on which of
// them ran; the ring reduce-scatter adds one rank at a time along the ring. float16 and
// bfloat16 sums, averages and products are computed in float32 and rounded once, an average
// pre-divided (Note [16-bit arithmetic] in transport/canonical_reduce.h, which also says what
// that costs on the wire); min and max propagate NaN from any rank (transport/reduce.h).
#ifndef BRAID_TRANSPORT_COLLECTIVES_H_
#define BRAID_TRANSPORT_COLLECTIVES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "transport/context.h"
#include "transport/gather.h"
#include "transport/ring_schedule.h"

namespace braid::transport {

// ---- All-reduce: recv[i] = op over ranks of send[i]; send == recv is in place. ----

// Recursive doubling (Thakur, Rabenseifner & Gropp 2005, with their pre- and post-step for a
// world that is not a power of two): log2(p2) rounds, p2 the largest power of two <= n, in
// which partners exchange their whole buffers and both reduce. Latency-optimal: for small
// messages. Sent: N per round, log2(p2) N in all (+N for the ranks of the pre/post-step).
// Memory per round: the received copy (N), the reduction reading 2N and writing N.
// Order: canonical.
absl::Status AllReduceRecursiveDoubling(Context& ctx, const void* send, void* recv,
                                        size_t count, DataType dtype, ReduceOp op);

// Direct reduce-scatter then ring all-gather, pipelined (Note [Ring pipeline] in
// transport/pipeline.h): each rank receives its 1/n segment from every peer at once (fan-in
// n-1) and reduces them in the canonical order; the all-gather is the ring's n-1 steps.
// Bandwidth-optimal: sent 2(n-1)/n N, received the same. Memory: the reduce-scatter's
// receives land in a small scratch window that stays in cache ((n-1)/n N), the reduction
// reads the n operands of its segment (N, of which 1/n from this rank's input and the rest
// from cache) and writes N/n; the all-gather writes (n-1)/n N and the sends read as much.
// Fan-in n-1 is fine over shared memory but an incast across hosts with many ranks: used up
// to ctx.options().direct_max_ranks ranks. Order: canonical.
absl::Status AllReduceDirect(Context& ctx, const void* send, void* recv, size_t count,
                             DataType dtype, ReduceOp op);

// Ring reduce-scatter then ring all-gather, pipelined (Patarasuk & Yuan 2009): constant fan-in
// (one receive per step, from the left neighbour), the algorithm for large worlds. Sent
// 2(n-1)/n N, received the same. Memory: each of the n-1 reduce-scatter steps receives N/n
// into cache, reads N/n of this rank's input and writes N/n of partial sums. Order: segment k
// is summed along the ring, starting at the rank after its owner and ending with the owner,
// one rank at a time, so an element's rounding depends on which segment it falls in, i.e. on
// how tensors were fused: not canonical. Every rank still gets the owner's bits.
absl::Status AllReduceRing(Context& ctx, const void* send, void* recv, size_t count,
                           DataType dtype, ReduceOp op);

// AllReduceDirect (kDirect) or AllReduceRing (kRing) of the buffer `gather` maps, in place
// in `scratch` (gather.bytes() bytes, `count` elements): the same messages and result, each
// piece's copy in and out overlapped with the transfer (Note [Gathered all-reduce] in
// transport/gather.h). Memory: the copies' reads and writes besides the algorithm's.
absl::Status AllReduceGathered(Context& ctx, const GatherMap& gather, void* scratch,
                               size_t count, DataType dtype, ReduceOp op,
                               ReduceScatterAlgorithm reduce_scatter);

// ---- Reduce-scatter: `send` holds sum(recv_counts) elements; rank r receives into `recv`
// the reduction of elements [sum(recv_counts[0..r)), +recv_counts[r]). ----

// Direct: the reduce-scatter phase of AllReduceDirect, fan-in n-1. Sent (N - N_r), with N_r
// this rank's segment. Memory: received (N - N_r) into cache, reads N, writes N_r.
// Order: canonical.
absl::Status ReduceScatterDirect(Context& ctx, const void* send, void* recv,
                                 absl::Span<const size_t> recv_counts, DataType dtype,
                                 ReduceOp op);

// Ring: the reduce-scatter phase of AllReduceRing, fan-in 1, partial sums in a work buffer
// (ctx.Work) so `send` stays untouched. Sent (N - N_r) in n-1 steps. Memory: received
// (N - N_r) into cache, reads about as much of the input and writes about as much (partial
// sums, then its own segment's result).
// Order: along the ring, segment r from rank r+1 on, ending with rank r (see AllReduceRing).
absl::Status ReduceScatterRing(Context& ctx, const void* send, void* recv,
                               absl::Span<const size_t> recv_counts, DataType dtype,
                               ReduceOp op);

// ---- Copying collectives. ----

// All-gather(v) as a pipelined ring: rank r's `send_bytes` bytes land at block r of `recv`
// (blocks back to back in rank order, block p recv_bytes[p] bytes) on every rank. Received
// every block but its own, sum(recv_bytes) - recv_bytes[r]; sent every block but the one it
// receives last, sum(recv_bytes) - recv_bytes[(r+1) % n]. Memory: one local copy of the own
// block, the receives' writes and the sends' reads.
absl::Status AllGatherRing(Context& ctx, const void* send, size_t send_bytes, void* recv,
                           absl::Span<const size_t> recv_bytes);

// Binomial-tree broadcast of `bytes` bytes of `buf` from `root`: ceil(log2 n) rounds. The root
// sends N to each of its ceil(log2 n) children; every other rank receives N once and sends N
// to each of its children (at most log2 n - its depth). Memory: what it receives and sends.
absl::Status BroadcastBinomial(Context& ctx, void* buf, size_t bytes, int root);

// All-to-all(v), direct: every receive is posted, then every send (fan-in n-1). Block p of
// `send` (send_bytes[p] bytes) goes to rank p; block p of `recv` comes from rank p. Sent
// sum(send_bytes) - send_bytes[r]; memory: one local copy of the own block.
absl::Status AllToAllDirect(Context& ctx, const void* send, absl::Span<const size_t> send_bytes,
                            void* recv, absl::Span<const size_t> recv_bytes);

// Dissemination barrier (Hensgen, Finkel & Manber 1988): ceil(log2 n) rounds of one zero-byte
// message to rank + 2^k and one from rank - 2^k. Returns once every rank has entered.
absl::Status BarrierDissemination(Context& ctx);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_COLLECTIVES_H_
