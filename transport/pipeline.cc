#include "transport/pipeline.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/canonical_reduce.h"
#include "transport/reduce.h"
#include "transport/tag.h"

namespace braid::transport {
namespace {

constexpr int kMaxPieces = 4096;

class RingPipeline {
 public:
  RingPipeline(Context& ctx, const RingPipelineArgs& a);
  absl::Status Run();

 private:
  struct Piece {
    int stage = 0;
    int slot = -1;  // scratch slot while in flight
    bool done = false;
    std::vector<Request> sends, recvs;  // the current stage's
  };

  absl::Status Start();
  absl::Status Post(int j);
  absl::Status PostDirect(int j);
  absl::Status PostRingStep(int j, const RingStep& st, bool first_stage);
  absl::Status PostGather(int j, const RingStep& st);
  void Finish(int j);
  // Copies piece j of every segment in from the gather map, or out to it.
  void Gather(int j, bool in);
  void ReduceDirect(int j);
  void ReduceRingStep(int j, const RingStep& st, bool last);
  absl::StatusOr<bool> Step();
  void CancelAll();

  // This rank's input for piece `s`: with a gather map, where it lies when it lies within
  // one piece of the map, else its copy in the scratch (Note [Gathered all-reduce]).
  const char* In(const Span1D& s) const {
    if (a_.gather == nullptr) return a_.send + s.offset * a_.elem;
    size_t at = 0;
    const GatheredPiece* p = Whole(s, &at);
    return p != nullptr ? static_cast<const char*>(p->input) + at : Work(s);
  }
  char* Work(const Span1D& s) const { return a_.work + s.offset * a_.elem; }
  // Where piece `s`'s final result goes: with a gather map, its output when it lies within
  // one piece of the map, else the scratch (copied out once the piece is done).
  char* Result(const Span1D& s) const {
    if (a_.gather == nullptr) return Work(s);
    size_t at = 0;
    const GatheredPiece* p = Whole(s, &at);
    return p != nullptr ? static_cast<char*>(p->output) + at : Work(s);
  }
  // The gather map's piece that holds all of piece `s` (and where `s` starts in it), or
  // null when `s` spans pieces: then it passes through the scratch.
  const GatheredPiece* Whole(const Span1D& s, size_t* at) const {
    return a_.gather->Within(s.offset * a_.elem, Bytes(s), at);
  }
  // Where the owned segment's result for piece `s` goes.
  char* OwnedOut(const Span1D& s) const {
    if (a_.owned_out == nullptr) return Result(s);
    return a_.owned_out + (s.offset - a_.segments[owned_].offset) * a_.elem;
  }
  char* Slot(int j) const { return scratch_ + ps_[j].slot * slot_bytes_; }
  char* PeerSlot(int j, int p) const {  // direct: where peer p's piece j lands
    const int k = p < rank_ ? p : p - 1;
    return Slot(j) + static_cast<size_t>(k) * stride_ * a_.elem;
  }
  Tag TagFor(int j) const {
    return Tag{seq_, static_cast<uint32_t>(ps_[j].stage * pieces_ + j)};
  }
  size_t Bytes(const Span1D& s) const { return s.count * a_.elem; }

  Context& ctx_;
  const RingPipelineArgs& a_;
  const int n_, rank_, left_, right_, owned_;
  const ReduceOp base_;
  std::vector<RingStep> rs_, ag_;  // ring reduce-scatter steps, all-gather steps
  int rs_stages_ = 0, total_stages_ = 0, pieces_ = 1, window_ = 1;
  std::vector<std::vector<Span1D>> piece_of_;  // [segment][piece]
  size_t stride_ = 0;                          // largest piece, in elements
  size_t slot_bytes_ = 0;
  char* scratch_ = nullptr;
  float* wide_ = nullptr;  // CanonicalReduceWide's blocks (16-bit arithmetic only)
  uint32_t seq_ = 0;
  std::vector<Piece> ps_;
  std::vector<int> free_slots_;
  int next_ = 0, first_ = 0, finished_ = 0;  // next piece to start; pieces before first_ done
};

RingPipeline::RingPipeline(Context& ctx, const RingPipelineArgs& a)
    : ctx_(ctx),
      a_(a),
      n_(ctx.size()),
      rank_(ctx.rank()),
      left_((ctx.rank() - 1 + ctx.size()) % ctx.size()),
      right_((ctx.rank() + 1) % ctx.size()),
      owned_(RingOwnedSegment(ctx.rank(), ctx.size(), a.shift)),
      base_(a.op == ReduceOp::kAverage ? ReduceOp::kSum : a.op) {
  for (const RingStep& s : RingSchedule(rank_, n_, a.shift)) {
    if (s.phase == RingStep::kReduceScatter && a.reduce_scatter == ReduceScatterKind::kRing) {
      rs_.push_back(s);
    }
    if (s.phase == RingStep::kAllGather && a.all_gather) ag_.push_back(s);
  }
  CHECK(a.gather == nullptr ||
        (a.send == a.work && a.owned_out == nullptr && a.all_gather &&
         a.reduce_scatter != ReduceScatterKind::kNone))
      << "a gather map is for an all-reduce in place";
  rs_stages_ = a.reduce_scatter == ReduceScatterKind::kDirect ? 1 : static_cast<int>(rs_.size());
  total_stages_ = rs_stages_ + static_cast<int>(ag_.size());
  size_t max_seg = 0;
  for (const Span1D& s : a.segments) max_seg = std::max(max_seg, s.count);
  if (total_stages_ == 0) return;  // nothing to do: Run() returns at once
  pieces_ = PipelinePieces(max_seg * a.elem, ctx.options().chunk_bytes, total_stages_);
  piece_of_.resize(n_);
  for (int s = 0; s < n_; ++s) piece_of_[s] = SplitSpan(a.segments[s], pieces_);
  stride_ = (max_seg + pieces_ - 1) / pieces_;
  window_ = std::max(1, std::min(pieces_, ctx.options().ring_window));
  if (a.reduce_scatter == ReduceScatterKind::kDirect) {
    slot_bytes_ = static_cast<size_t>(n_ - 1) * stride_ * a.elem;
  } else if (a.reduce_scatter == ReduceScatterKind::kRing) {
    slot_bytes_ = stride_ * a.elem;
  }
  if (slot_bytes_ > 0) scratch_ = ctx.Scratch(window_ * slot_bytes_);
  // Note [16-bit arithmetic]: the direct reduce-scatter sums 16-bit operands in float32
  // blocks; the ring one is handed float32 by its caller (collectives.cc).
  CHECK(a.reduce_scatter != ReduceScatterKind::kRing || !AccumulatesInFloat32(a.dtype, a.op))
      << "the ring reduce-scatter takes 16-bit arithmetic widened to float32";
  if (a.reduce_scatter == ReduceScatterKind::kDirect && AccumulatesInFloat32(a.dtype, a.op)) {
    wide_ = ctx.Wide(static_cast<size_t>(n_) * kWideBlock);
  }
  seq_ = ctx.NextSeq();
  ps_.resize(pieces_);
  for (int w = window_ - 1; w >= 0; --w) free_slots_.push_back(w);
}

absl::Status RingPipeline::Start() {
  const int j = next_++;
  ps_[j].slot = free_slots_.back();
  free_slots_.pop_back();
  if (a_.gather != nullptr) Gather(j, /*in=*/true);
  return Post(j);
}

absl::Status RingPipeline::Post(int j) {
  const int stage = ps_[j].stage;
  if (stage >= rs_stages_) return PostGather(j, ag_[stage - rs_stages_]);
  if (a_.reduce_scatter == ReduceScatterKind::kDirect) return PostDirect(j);
  return PostRingStep(j, rs_[stage], stage == 0);
}

absl::Status RingPipeline::PostDirect(int j) {
  Piece& p = ps_[j];
  const Span1D& mine = piece_of_[owned_][j];
  p.sends.assign(n_ - 1, Request{});
  p.recvs.assign(n_ - 1, Request{});
  const Tag tag = TagFor(j);
  // Receives first, so a peer's send finds its receive posted where it can.
  for (int i = 1, k = 0; i < n_; ++i, ++k) {
    const int from = (rank_ - i + n_) % n_;
    BRAID_RETURN_IF_ERROR(ctx_.Recv(from, tag, PeerSlot(j, from), Bytes(mine), &p.recvs[k]));
  }
  for (int i = 1, k = 0; i < n_; ++i, ++k) {
    const int to = (rank_ + i) % n_;
    const Span1D& theirs = piece_of_[RingOwnedSegment(to, n_, a_.shift)][j];
    BRAID_RETURN_IF_ERROR(ctx_.Send(to, tag, In(theirs), Bytes(theirs), &p.sends[k]));
  }
  return absl::OkStatus();
}

absl::Status RingPipeline::PostRingStep(int j, const RingStep& st, bool first_stage) {
  Piece& p = ps_[j];
  const Span1D& rp = piece_of_[st.recv_segment][j];
  const Span1D& sp = piece_of_[st.send_segment][j];
  p.sends.assign(1, Request{});
  p.recvs.assign(1, Request{});
  BRAID_RETURN_IF_ERROR(ctx_.Recv(left_, TagFor(j), Slot(j), Bytes(rp), &p.recvs[0]));
  // The first stage sends this rank's input; later ones the partial sum the previous made.
  const char* src = first_stage ? In(sp) : Work(sp);
  return ctx_.Send(right_, TagFor(j), src, Bytes(sp), &p.sends[0]);
}

absl::Status RingPipeline::PostGather(int j, const RingStep& st) {
  Piece& p = ps_[j];
  const Span1D& rp = piece_of_[st.recv_segment][j];
  const Span1D& sp = piece_of_[st.send_segment][j];
  p.sends.assign(1, Request{});
  p.recvs.assign(1, Request{});
  BRAID_RETURN_IF_ERROR(ctx_.Recv(left_, TagFor(j), Result(rp), Bytes(rp), &p.recvs[0]));
  return ctx_.Send(right_, TagFor(j), Result(sp), Bytes(sp), &p.sends[0]);
}

void RingPipeline::ReduceDirect(int j) {
  const Span1D& mine = piece_of_[owned_][j];
  std::vector<const char*> operands(n_);
  std::vector<bool> writable(n_);
  for (int p = 0; p < n_; ++p) {
    operands[p] = p == rank_ ? In(mine) : PeerSlot(j, p);
    writable[p] = p != rank_;
  }
  char* out = OwnedOut(mine);
  if (wide_ != nullptr) {  // rounded once, an average pre-divided (Note [16-bit arithmetic])
    CanonicalReduceWide(ctx_.kernels(), out, operands, mine.count, a_.dtype, base_,
                        a_.op == ReduceOp::kAverage ? n_ : 1, wide_);
    return;
  }
  CanonicalReduce(ctx_.kernels(), out, std::move(operands), std::move(writable), mine.count,
                  a_.dtype, base_);
  if (a_.op == ReduceOp::kAverage) ctx_.kernels().Divide(out, mine.count, a_.dtype, n_);
}

void RingPipeline::ReduceRingStep(int j, const RingStep& st, bool last) {
  const Span1D& piece = piece_of_[st.recv_segment][j];
  char* out = last ? OwnedOut(piece) : Work(piece);
  // The partial sum of the ranks before this one on the ring comes first.
  ctx_.kernels().Reduce(out, Slot(j), In(piece), piece.count, a_.dtype, base_);
  if (last && a_.op == ReduceOp::kAverage) {
    ctx_.kernels().Divide(out, piece.count, a_.dtype, n_);
  }
}

void RingPipeline::Gather(int j, bool in) {
  for (int s = 0; s < n_; ++s) {
    const Span1D& piece = piece_of_[s][j];
    size_t at = 0;
    if (Whole(piece, &at) != nullptr) continue;
    if (in) {
      a_.gather->CopyIn(a_.work, piece.offset * a_.elem, Bytes(piece), ctx_.kernels());
    } else {
      a_.gather->CopyOut(a_.work, piece.offset * a_.elem, Bytes(piece), ctx_.kernels());
    }
  }
}

void RingPipeline::Finish(int j) {
  const int stage = ps_[j].stage;
  if (stage >= rs_stages_) return;  // the all-gather received straight into place
  if (a_.reduce_scatter == ReduceScatterKind::kDirect) {
    ReduceDirect(j);
  } else {
    ReduceRingStep(j, rs_[stage], stage == rs_stages_ - 1);
  }
}

absl::StatusOr<bool> RingPipeline::Step() {
  for (int j = first_; j < next_; ++j) {
    Piece& p = ps_[j];
    if (p.done) continue;
    BRAID_ASSIGN_OR_RETURN(bool got, ctx_.TestAll(absl::MakeSpan(p.recvs)));
    if (!got) continue;
    BRAID_ASSIGN_OR_RETURN(bool sent, ctx_.TestAll(absl::MakeSpan(p.sends)));
    if (!sent) continue;
    Finish(j);
    if (++p.stage < total_stages_) {
      BRAID_RETURN_IF_ERROR(Post(j));
      continue;
    }
    p.done = true;
    ++finished_;
    if (a_.gather != nullptr) Gather(j, /*in=*/false);
    free_slots_.push_back(p.slot);
    while (first_ < next_ && ps_[first_].done) ++first_;
    if (next_ < pieces_) BRAID_RETURN_IF_ERROR(Start());
  }
  return finished_ == pieces_;
}

void RingPipeline::CancelAll() {
  for (Piece& p : ps_) {
    ctx_.Cancel(absl::MakeSpan(p.recvs));
    ctx_.Cancel(absl::MakeSpan(p.sends));
  }
}

absl::Status RingPipeline::Run() {
  if (total_stages_ == 0) return absl::OkStatus();
  absl::Status s;
  while (s.ok() && next_ < window_) s = Start();
  if (s.ok()) s = ctx_.Drive([this]() { return Step(); });
  if (!s.ok()) CancelAll();
  return s;
}

}  // namespace

int PipelinePieces(size_t max_segment_bytes, size_t chunk_bytes, int stages) {
  CHECK_GT(stages, 0);
  CHECK_LT(static_cast<uint32_t>(stages), kMaxTagSlots);
  const int tag_cap = static_cast<int>(kMaxTagSlots / static_cast<uint32_t>(stages));
  return std::max(1, std::min(RingPieces(max_segment_bytes, chunk_bytes, kMaxPieces), tag_cap));
}

absl::Status RunRingPipeline(Context& ctx, const RingPipelineArgs& args) {
  CHECK_GE(ctx.size(), 2);
  CHECK_EQ(args.segments.size(), static_cast<size_t>(ctx.size()));
  RingPipeline pipeline(ctx, args);
  return pipeline.Run();
}

}  // namespace braid::transport
