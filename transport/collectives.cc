#include "transport/collectives.h"

#include <vector>

#include "common/status_macros.h"
#include "transport/pipeline.h"
#include "transport/reduce.h"
#include "transport/ring_schedule.h"

namespace braid::transport {
namespace {

// Posts a receive from `from` (unless < 0) and a send to `to` (unless < 0) under `tag`, and
// waits for both; nothing is left pending when it returns.
absl::Status SendRecv(Context& ctx, Tag tag, int to, const void* send, size_t send_bytes,
                      int from, void* recv, size_t recv_bytes) {
  Request reqs[2];
  absl::Status s;
  if (from >= 0) s = ctx.Recv(from, tag, recv, recv_bytes, &reqs[0]);
  if (s.ok() && to >= 0) s = ctx.Send(to, tag, send, send_bytes, &reqs[1]);
  if (s.ok()) return ctx.WaitAll(absl::MakeSpan(reqs));  // cancels what is left on failure
  ctx.Cancel(absl::MakeSpan(reqs));
  return s;
}

// Waits for `reqs` if `posted` is OK; otherwise cancels them and returns `posted`.
absl::Status WaitPosted(Context& ctx, absl::Status posted, std::vector<Request>& reqs) {
  if (posted.ok()) return ctx.WaitAll(absl::MakeSpan(reqs));
  ctx.Cancel(absl::MakeSpan(reqs));
  return posted;
}

ReduceOp BaseOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

// Slots of recursive doubling: 0 the pre-step, 1 + round the butterfly, then the post-step.
constexpr uint32_t kPostStepSlot = 64;

// A float32 copy of a 16-bit input, each element divided by n for an average (Note [16-bit
// arithmetic]): what recursive doubling and the ring reduce-scatter combine.
float* WidenInput(Context& ctx, const void* send, size_t count, DataType dtype, ReduceOp op) {
  float* wide = ctx.Wide(count);
  ctx.kernels().Widen(wide, send, count, dtype, op == ReduceOp::kAverage ? ctx.size() : 1);
  return wide;
}

// The ring reduce-scatter of a widened input: float32 partial sums along the ring, in a
// float32 work buffer of the input's length, which it returns; this rank's result is at its
// segment's offset there. `shift` as RingPipelineArgs::shift.
absl::StatusOr<const float*> RingReduceScatterWide(Context& ctx, const float* wide,
                                                   const std::vector<Span1D>& segments,
                                                   ReduceOp op, int shift) {
  RingPipelineArgs a;
  a.segments = segments;
  const size_t total = segments.back().offset + segments.back().count;
  a.send = reinterpret_cast<const char*>(wide);
  a.work = ctx.Work(total * sizeof(float));
  a.elem = sizeof(float);
  a.dtype = DataType::kFloat32;
  a.op = BaseOp(op);
  a.reduce_scatter = ReduceScatterKind::kRing;
  a.all_gather = false;
  a.shift = shift;
  BRAID_RETURN_IF_ERROR(RunRingPipeline(ctx, a));
  return reinterpret_cast<const float*>(a.work);
}

// AllReduceRing for 16-bit arithmetic: the reduce-scatter in float32, each owner rounds its
// segment once, and the ring all-gather moves the 16-bit result.
absl::Status AllReduceRingWide(Context& ctx, const void* send, void* recv, size_t count,
                               DataType dtype, ReduceOp op) {
  const size_t elem = DataTypeSize(dtype);
  const std::vector<Span1D> segments = PartitionEven(count, ctx.size());
  const float* wide = WidenInput(ctx, send, count, dtype, op);
  BRAID_ASSIGN_OR_RETURN(const float* sums,
                         RingReduceScatterWide(ctx, wide, segments, op, /*shift=*/0));
  const Span1D& own = segments[RingOwnedSegment(ctx.rank(), ctx.size(), 0)];
  ctx.kernels().Narrow(static_cast<char*>(recv) + own.offset * elem, sums + own.offset,
                       own.count, dtype);
  RingPipelineArgs a;
  a.work = static_cast<char*>(recv);
  a.segments = segments;
  a.elem = elem;
  a.shift = 0;  // the segment this rank owns after the reduce-scatter goes first
  return RunRingPipeline(ctx, a);
}

// `gather` set: `send` == `recv` is the scratch the map gathers into (Note [Gathered
// all-reduce], transport/gather.h).
absl::Status AllReducePipelined(Context& ctx, const void* send, void* recv, size_t count,
                                DataType dtype, ReduceOp op, ReduceScatterKind kind,
                                const GatherMap* gather = nullptr) {
  const size_t elem = DataTypeSize(dtype);
  if (gather != nullptr &&
      (ctx.size() == 1 || (kind == ReduceScatterKind::kRing && AccumulatesInFloat32(dtype, op)))) {
    // Three passes: one rank has nothing to overlap; the 16-bit ring widens its whole input
    // before its first message.
    char* buf = static_cast<char*>(recv);
    return ReduceInThreePasses(*gather, buf, ctx.kernels(), [&] {
      return AllReducePipelined(ctx, buf, buf, count, dtype, op, kind);
    });
  }
  if (ctx.size() == 1) {
    ctx.kernels().Copy(recv, send, count * elem);  // the average of one rank is itself
    return absl::OkStatus();
  }
  if (kind == ReduceScatterKind::kRing && AccumulatesInFloat32(dtype, op)) {
    return AllReduceRingWide(ctx, send, recv, count, dtype, op);
  }
  RingPipelineArgs a;
  a.send = static_cast<const char*>(send);
  a.work = static_cast<char*>(recv);
  a.segments = PartitionEven(count, ctx.size());
  a.elem = elem;
  a.dtype = dtype;
  a.op = op;
  a.reduce_scatter = kind;
  a.gather = gather;
  return RunRingPipeline(ctx, a);
}

absl::Status ReduceScatterPipelined(Context& ctx, const void* send, void* recv,
                                    absl::Span<const size_t> recv_counts, DataType dtype,
                                    ReduceOp op, ReduceScatterKind kind) {
  const size_t elem = DataTypeSize(dtype);
  if (ctx.size() == 1) {
    ctx.kernels().Copy(recv, send, recv_counts[0] * elem);
    return absl::OkStatus();
  }
  RingPipelineArgs a;
  a.segments = PartitionByCounts({recv_counts.begin(), recv_counts.end()});
  const size_t total = a.segments.back().offset + a.segments.back().count;
  if (kind == ReduceScatterKind::kRing && AccumulatesInFloat32(dtype, op)) {
    // Note [16-bit arithmetic]: float32 partial sums, this rank's segment rounded once.
    const float* wide = WidenInput(ctx, send, total, dtype, op);
    BRAID_ASSIGN_OR_RETURN(const float* sums,
                           RingReduceScatterWide(ctx, wide, a.segments, op, ctx.size() - 1));
    const Span1D& own = a.segments[ctx.rank()];
    ctx.kernels().Narrow(recv, sums + own.offset, own.count, dtype);
    return absl::OkStatus();
  }
  a.send = static_cast<const char*>(send);
  // The ring keeps its partial sums in a work buffer, so `send` stays untouched; the direct
  // reduce-scatter writes its only result straight to `recv`.
  a.work = kind == ReduceScatterKind::kRing ? ctx.Work(total * elem) : nullptr;
  a.owned_out = static_cast<char*>(recv);
  a.elem = elem;
  a.dtype = dtype;
  a.op = op;
  a.reduce_scatter = kind;
  a.all_gather = false;
  a.shift = ctx.size() - 1;  // rank r owns segment r
  return RunRingPipeline(ctx, a);
}

}  // namespace

namespace {

// Recursive doubling in place on `recv` (Note [Canonical reduction order]); an average
// divides the sum at the end.
absl::Status RecursiveDoublingInPlace(Context& ctx, char* recv, size_t count, DataType dtype,
                                      ReduceOp op) {
  const int n = ctx.size(), rank = ctx.rank();
  const size_t bytes = count * DataTypeSize(dtype);
  const Kernels& k = ctx.kernels();
  const uint32_t seq = ctx.NextSeq();
  const ReduceOp base = BaseOp(op);
  char* tmp = ctx.Scratch(bytes);
  const RecursiveDoublingRole role = RecursiveDoublingRoleFor(rank, n);
  // The lower rank's operand always comes first (Note [Canonical reduction order]).
  auto reduce_with = [&](int peer) {
    if (peer < rank) {
      k.Reduce(recv, tmp, recv, count, dtype, base);
    } else {
      k.Reduce(recv, recv, tmp, count, dtype, base);
    }
  };
  // Pre-step: an extra rank hands its data to its partner and sits out.
  if (role.partner >= 0 && role.new_rank < 0) {
    BRAID_RETURN_IF_ERROR(SendRecv(ctx, Tag{seq, 0}, role.partner, recv, bytes, -1, nullptr, 0));
  } else if (role.partner >= 0) {
    BRAID_RETURN_IF_ERROR(SendRecv(ctx, Tag{seq, 0}, -1, nullptr, 0, role.partner, tmp, bytes));
    reduce_with(role.partner);
  }
  if (role.new_rank >= 0) {
    uint32_t slot = 1;
    for (int mask = 1; mask < role.p2; mask <<= 1, ++slot) {
      const int peer = RecursiveDoublingRealRank(role.new_rank ^ mask, n);
      BRAID_RETURN_IF_ERROR(SendRecv(ctx, Tag{seq, slot}, peer, recv, bytes, peer, tmp, bytes));
      reduce_with(peer);
    }
    if (op == ReduceOp::kAverage) k.Divide(recv, count, dtype, n);
  }
  // Post-step: the partner returns the result to its extra rank.
  if (role.partner >= 0 && role.new_rank < 0) {
    return SendRecv(ctx, Tag{seq, kPostStepSlot}, -1, nullptr, 0, role.partner, recv, bytes);
  }
  if (role.partner >= 0) {
    return SendRecv(ctx, Tag{seq, kPostStepSlot}, role.partner, recv, bytes, -1, nullptr, 0);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduceRecursiveDoubling(Context& ctx, const void* send, void* recv,
                                        size_t count, DataType dtype, ReduceOp op) {
  if (ctx.size() > 1 && AccumulatesInFloat32(dtype, op)) {
    // Note [16-bit arithmetic]: the doubling runs on a float32 copy, rounded once at the end.
    float* wide = WidenInput(ctx, send, count, dtype, op);
    BRAID_RETURN_IF_ERROR(RecursiveDoublingInPlace(ctx, reinterpret_cast<char*>(wide), count,
                                                   DataType::kFloat32, BaseOp(op)));
    ctx.kernels().Narrow(recv, wide, count, dtype);
    return absl::OkStatus();
  }
  ctx.kernels().Copy(recv, send, count * DataTypeSize(dtype));
  if (ctx.size() == 1) return absl::OkStatus();
  return RecursiveDoublingInPlace(ctx, static_cast<char*>(recv), count, dtype, op);
}

absl::Status AllReduceDirect(Context& ctx, const void* send, void* recv, size_t count,
                             DataType dtype, ReduceOp op) {
  return AllReducePipelined(ctx, send, recv, count, dtype, op, ReduceScatterKind::kDirect);
}

absl::Status AllReduceRing(Context& ctx, const void* send, void* recv, size_t count,
                           DataType dtype, ReduceOp op) {
  return AllReducePipelined(ctx, send, recv, count, dtype, op, ReduceScatterKind::kRing);
}

absl::Status AllReduceGathered(Context& ctx, const GatherMap& gather, void* scratch,
                               size_t count, DataType dtype, ReduceOp op,
                               ReduceScatterAlgorithm reduce_scatter) {
  return AllReducePipelined(ctx, scratch, scratch, count, dtype, op,
                            reduce_scatter == ReduceScatterAlgorithm::kDirect
                                ? ReduceScatterKind::kDirect
                                : ReduceScatterKind::kRing,
                            &gather);
}

absl::Status ReduceScatterDirect(Context& ctx, const void* send, void* recv,
                                 absl::Span<const size_t> recv_counts, DataType dtype,
                                 ReduceOp op) {
  return ReduceScatterPipelined(ctx, send, recv, recv_counts, dtype, op,
                                ReduceScatterKind::kDirect);
}

absl::Status ReduceScatterRing(Context& ctx, const void* send, void* recv,
                               absl::Span<const size_t> recv_counts, DataType dtype,
                               ReduceOp op) {
  return ReduceScatterPipelined(ctx, send, recv, recv_counts, dtype, op,
                                ReduceScatterKind::kRing);
}

absl::Status AllGatherRing(Context& ctx, const void* send, size_t send_bytes, void* recv,
                           absl::Span<const size_t> recv_bytes) {
  std::vector<Span1D> segs = PartitionByCounts({recv_bytes.begin(), recv_bytes.end()});
  char* out = static_cast<char*>(recv);
  ctx.kernels().Copy(out + segs[ctx.rank()].offset, send, send_bytes);
  if (ctx.size() == 1) return absl::OkStatus();
  RingPipelineArgs a;
  a.work = out;
  a.segments = std::move(segs);
  a.shift = ctx.size() - 1;  // step 0 sends this rank's own block
  return RunRingPipeline(ctx, a);
}

absl::Status BroadcastBinomial(Context& ctx, void* buf, size_t bytes, int root) {
  const int n = ctx.size();
  if (n == 1) return absl::OkStatus();
  const uint32_t seq = ctx.NextSeq();
  // Over ranks renumbered so that the root is 0. `low` is vrank's lowest set bit (for the
  // root, the first power of two >= n): the parent is vrank - low, the children are
  // vrank + m for the powers of two m < low.
  const int vrank = (ctx.rank() - root + n) % n;
  int low = 1;
  while (low < n && !(vrank & low)) low <<= 1;
  if (vrank != 0) {
    const int parent = (vrank - low + root) % n;
    BRAID_RETURN_IF_ERROR(SendRecv(ctx, Tag{seq, 0}, -1, nullptr, 0, parent, buf, bytes));
  }
  std::vector<Request> reqs;
  absl::Status posted;
  for (int m = low >> 1; m > 0 && posted.ok(); m >>= 1) {
    if (vrank + m >= n) continue;
    reqs.emplace_back();  // a request may move while pending
    posted = ctx.Send((vrank + m + root) % n, Tag{seq, 0}, buf, bytes, &reqs.back());
  }
  return WaitPosted(ctx, posted, reqs);
}

absl::Status AllToAllDirect(Context& ctx, const void* send, absl::Span<const size_t> send_bytes,
                            void* recv, absl::Span<const size_t> recv_bytes) {
  const int n = ctx.size(), rank = ctx.rank();
  std::vector<Span1D> so = PartitionByCounts({send_bytes.begin(), send_bytes.end()});
  std::vector<Span1D> ro = PartitionByCounts({recv_bytes.begin(), recv_bytes.end()});
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  ctx.kernels().Copy(r + ro[rank].offset, s + so[rank].offset, recv_bytes[rank]);
  if (n == 1) return absl::OkStatus();
  const uint32_t seq = ctx.NextSeq();
  std::vector<Request> reqs(2 * (n - 1));
  absl::Status posted;
  size_t k = 0;
  // Peers in the order rank+1, rank+2, ... so that not every rank sends to rank 0 first.
  for (int i = 1; i < n && posted.ok(); ++i) {
    const int from = (rank - i + n) % n;
    posted = ctx.Recv(from, Tag{seq, 0}, r + ro[from].offset, recv_bytes[from], &reqs[k++]);
  }
  for (int i = 1; i < n && posted.ok(); ++i) {
    const int to = (rank + i) % n;
    posted = ctx.Send(to, Tag{seq, 0}, s + so[to].offset, send_bytes[to], &reqs[k++]);
  }
  return WaitPosted(ctx, posted, reqs);
}

absl::Status BarrierDissemination(Context& ctx) {
  const int n = ctx.size(), rank = ctx.rank();
  if (n == 1) return absl::OkStatus();
  const uint32_t seq = ctx.NextSeq();
  uint32_t round = 0;
  for (int k = 1; k < n; k <<= 1, ++round) {
    BRAID_RETURN_IF_ERROR(SendRecv(ctx, Tag{seq, round}, (rank + k) % n, nullptr, 0,
                                   (rank - k + n) % n, nullptr, 0));
  }
  return absl::OkStatus();
}

}  // namespace braid::transport
