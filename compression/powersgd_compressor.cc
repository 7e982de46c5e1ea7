// PowerSGD (see powersgd.h): two all-reduces per bucket; P = M·Q and Q = Mᵀ·P̂ through
// OpenBLAS, the element-wise passes and the decompression in lowrank_kernels.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "compression/blas.h"
#include "compression/lowrank_kernels.h"
#include "compression/methods.h"
#include "compression/powersgd.h"
#include "compression/quantize.h"
#include "compression/state_array.h"
#include "compression/state_io.h"
#include "glog/logging.h"

namespace braid::compression {

PowerSgdPlan PlanPowerSgd(absl::Span<const int64_t> shape, const PowerSgdOptions& o) {
  PowerSgdPlan plan;
  // A shape ShapeElements refuses plans as an empty tensor; the runtime passes none (it
  // checks every shape where it enters).
  const int64_t count = ShapeElements("shape", shape).value_or(0);
  plan.payload_bytes = static_cast<uint64_t>(count) * sizeof(float);
  if (shape.size() < 2 || count <= 0) return plan;
  const int64_t rows = shape[0], cols = count / rows;
  // Exact in double for any tensor that fits in memory.
  const double compressed = static_cast<double>(rows + cols) * o.rank * o.min_compression_rate;
  if (compressed >= static_cast<double>(rows) * static_cast<double>(cols)) return plan;
  plan.compressed = true;
  plan.rows = rows;
  plan.cols = cols;
  plan.rank = o.rank;
  plan.payload_bytes = static_cast<uint64_t>(rows + cols) * o.rank * sizeof(float);
  return plan;
}

void Orthogonalize(float* p, size_t rows, size_t cols, double epsilon) {
  for (size_t j = 0; j < cols; ++j) {
    // Squares of floats neither overflow nor underflow in double, so a column of tiny
    // (even subnormal) values still normalizes instead of dividing by a zero norm.
    double sq = 0;
    for (size_t i = 0; i < rows; ++i) {
      const double v = p[i * cols + j];
      sq += v * v;
    }
    const double denom = std::sqrt(sq) + epsilon;
    if (!(denom > 0)) {  // a zero column stays zero: no 0/0
      for (size_t i = 0; i < rows; ++i) p[i * cols + j] = 0.0f;
      continue;
    }
    for (size_t i = 0; i < rows; ++i) {
      p[i * cols + j] = static_cast<float>(p[i * cols + j] / denom);
    }
    for (size_t k = j + 1; k < cols; ++k) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) {
        dot += static_cast<double>(p[i * cols + j]) * p[i * cols + k];
      }
      for (size_t i = 0; i < rows; ++i) {
        p[i * cols + k] = static_cast<float>(p[i * cols + k] - dot * p[i * cols + j]);
      }
    }
  }
}

void DrawQ(uint64_t seed, absl::string_view name, int64_t step, float* q, size_t count) {
  constexpr uint64_t kSalt = 0x50535344u;  // "PSGD": not the 4-bit codecs' streams
  const uint64_t base =
      Mix64(Mix64(Mix64(seed ^ kSalt) ^ NameHash(name)) ^ static_cast<uint64_t>(step));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t k = 0; 2 * k < count; ++k) {
    // splitmix64's stream: one 64-bit draw gives the two uniforms of one Box–Muller pair.
    const uint64_t h = Mix64(base + (k + 1) * 0x9E3779B97F4A7C15ull);
    const double u1 = (static_cast<double>(h >> 32) + 1.0) * 0x1p-32;  // (0, 1]: log finite
    const double u2 = static_cast<double>(h & 0xffffffffu) * 0x1p-32;
    const double r = std::sqrt(-2.0 * std::log(u1));
    q[2 * k] = static_cast<float>(r * std::cos(kTwoPi * u2));
    if (2 * k + 1 < count) q[2 * k + 1] = static_cast<float>(r * std::sin(kTwoPi * u2));
  }
}

namespace {

constexpr uint32_t kStateVersion = 1;
constexpr char kStateMagic[4] = {'P', 'S', 'G', 'D'};

// Rows of M handled per block when adding the residual feeds P = M·Q on the same rows, so the
// block is still in cache (L2) for the product: about 256 KiB of float32.
size_t BlockRows(int64_t cols) {
  return std::max<size_t>(1, (size_t{64} << 10) / static_cast<size_t>(cols));
}

// Up to this many columns, Product makes one matrix-vector product per column. Measured on
// the ResNet-18 gradient set, one thread, best of 6 (ms for all layers, sgemm vs sgemv per
// column): P = M·Q in 256 KiB row blocks 6.5 vs 1.4 (R = 1), 6.8 vs 4.3 (2), 7.9 vs 5.5 (4),
// 7.3 vs 9.8 (8); Q = Mᵀ·P̂ 6.1 vs 1.2, 6.6 vs 4.7, 8.1 vs 7.4, 8.4 vs 11.9.
constexpr int64_t kGemvColumns = 4;

// c (m × n) = a·b for row-major a (m × k, or k × m when `ta`) and b (k × n). For few columns
// one sgemv per column: each streams a at memory speed, where sgemm first packs a copy of a.
void Product(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
             const float* b, float* c) {
  if (n <= kGemvColumns) {
    // Row-major a is m × k (or k × m): gemv's own rows and columns; column j of b and c is
    // strided by n.
    for (int64_t j = 0; j < n; ++j) {
      blas::Sgemv(ta, ta ? k : m, ta ? m : k, a, lda, b + j, n, c + j, n);
    }
    return;
  }
  blas::Sgemm(ta, m, n, k, a, lda, b, c);
}

std::string Quoted(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  for (const std::string& n : names) q.push_back(absl::StrCat("'", n, "'"));
  return absl::StrJoin(q, ", ");
}

class PowerSgdCompressor : public Compressor {
 public:
  PowerSgdCompressor(const PowerSgdOptions& o, std::string spec)
      : o_(o), spec_(std::move(spec)) {}

  const std::string& spec() const override { return spec_; }
  void Reset(absl::string_view name) override {
    auto it = states_.find(name);
    if (it != states_.end()) states_.erase(it);
  }

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    const int world = comm.size();
    BRAID_ASSIGN_OR_RETURN(const size_t flags, Layout(tensors, ctx, world));
    BRAID_RETURN_IF_ERROR(FailBeforeCollectives(comm, PlaceStates(tensors, *ctx.device)));
    const bool local_ok = Compress(tensors, ctx);
    p_buf_[flags + comm.rank()] = local_ok ? 0.0f : 1.0f;
    // All-reduce #1: every P, every uncompressed tensor and the ranks' non-finite flags.
    BRAID_RETURN_IF_ERROR(comm.AllReduce(p_buf_.data(), p_buf_.data(), p_buf_.size(),
                                         DataType::kFloat32, ReduceOp::kSum));
    BRAID_RETURN_IF_ERROR(CheckReducedP(tensors, flags, world));
    ScatterUncompressed(tensors, ctx.op, world);
    ComputeQ(tensors);
    if (!q_buf_.empty()) {
      // All-reduce #2: every Q, averaged.
      BRAID_RETURN_IF_ERROR(comm.AllReduce(q_buf_.data(), q_buf_.data(), q_buf_.size(),
                                           DataType::kFloat32, ReduceOp::kAverage));
      BRAID_RETURN_IF_ERROR(CheckReducedQ(tensors));
    }
    Decompress(tensors, ctx, world);
    return absl::OkStatus();
  }

  absl::Status SaveState(std::string* out) const override;
  absl::Status LoadState(absl::string_view state) override;
  void DescribeSharedState(std::vector<SharedStateField>* out) const override;

 private:
  struct TensorState {
    int64_t rows = 0, cols = 0;
    int rank = 0;
    bool has_q = false;  // q holds last step's Q̂ (warm start), or a loaded one
    // On the tensor's device (Note [Compression state on the device]) once placed; a loaded
    // state's on the host until then, its arrays empty where the checkpoint had none.
    StateArray q;         // cols × rank, row-major
    StateArray residual;  // rows × cols, row-major (ef=1)
  };
  // One tensor of the bucket being reduced.
  struct Item {
    PowerSgdPlan plan;
    TensorState* state = nullptr;  // compressed tensors only
    size_t offset = 0;             // of its P (or its values) in p_buf_
    size_t q_offset = 0;           // of its Q in q_buf_ (compressed tensors only)
  };

  absl::StatusOr<size_t> Layout(absl::Span<const TensorView> tensors, StepContext& ctx,
                                int world);
  TensorState& StateFor(absl::string_view name, const PowerSgdPlan& plan);
  absl::Status PlaceStates(absl::Span<const TensorView> tensors, device::Device& device);
  bool Compress(absl::Span<const TensorView> tensors, const StepContext& ctx);
  absl::Status CheckReducedP(absl::Span<const TensorView> tensors, size_t flags, int world);
  void ScatterUncompressed(absl::Span<const TensorView> tensors, ReduceOp op, int world);
  void ComputeQ(absl::Span<const TensorView> tensors);
  absl::Status CheckReducedQ(absl::Span<const TensorView> tensors);
  void Decompress(absl::Span<const TensorView> tensors, const StepContext& ctx, int world);
  void RedrawZeroColumns(TensorState& s, uint64_t seed, absl::string_view name, int64_t step);

  PowerSgdOptions o_;
  std::string spec_;
  std::map<std::string, TensorState, std::less<>> states_;  // by tensor name
  // Scratch, reused across steps.
  std::vector<Item> items_;
  std::vector<float> p_buf_, q_buf_, qt_, row_;
};

absl::StatusOr<size_t> PowerSgdCompressor::Layout(absl::Span<const TensorView> tensors,
                                                  StepContext& ctx, int world) {
  items_.resize(tensors.size());
  size_t p = 0, q = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    Item& it = items_[i];
    it = Item{};
    it.plan = PlanPowerSgd(t.shape, o_);
    it.offset = p;
    if (i < ctx.payload_bytes.size()) ctx.payload_bytes[i] = it.plan.payload_bytes;
    if (!it.plan.compressed) {
      p += t.count;
      if (states_.count(t.name)) {
        LOG(WARNING) << "tensor '" << t.name << "' is no longer compressed by " << spec_
                     << ": its PowerSGD state is dropped";
        Reset(t.name);
      }
      continue;
    }
    if (static_cast<size_t>(it.plan.rows * it.plan.cols) != t.count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': ", t.count, " elements, but its shape holds ",
          it.plan.rows * it.plan.cols));
    }
    p += static_cast<size_t>(it.plan.rows) * it.plan.rank;
    it.q_offset = q;
    q += static_cast<size_t>(it.plan.cols) * it.plan.rank;
  }
  // States last: the map may rebalance while it grows, but element addresses stay put.
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (items_[i].plan.compressed) items_[i].state = &StateFor(tensors[i].name, items_[i].plan);
  }
  p_buf_.resize(p + world);
  std::fill(p_buf_.begin() + p, p_buf_.end(), 0.0f);
  q_buf_.resize(q);
  return p;
}

PowerSgdCompressor::TensorState& PowerSgdCompressor::StateFor(absl::string_view name,
                                                              const PowerSgdPlan& plan) {
  auto it = states_.find(name);
  if (it == states_.end()) it = states_.emplace(std::string(name), TensorState{}).first;
  TensorState& s = it->second;
  if (s.rows != plan.rows || s.cols != plan.cols || s.rank != plan.rank) {
    if (s.rows != 0) {
      LOG(WARNING) << "tensor '" << name << "' changed from a " << s.rows << " x " << s.cols
                   << " matrix (rank " << s.rank << ") to " << plan.rows << " x " << plan.cols
                   << " (rank " << plan.rank << ") under " << spec_
                   << ": its PowerSGD state (Q, residual) starts again";
    }
    s = TensorState{};
    s.rows = plan.rows;
    s.cols = plan.cols;
    s.rank = plan.rank;
  }
  return s;
}

// Every compressed tensor's Q (cols × rank; its values only when has_q) and, with ef=1,
// residual (rows × cols, zeros at first) on `device`.
absl::Status PowerSgdCompressor::PlaceStates(absl::Span<const TensorView> tensors,
                                             device::Device& device) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!items_[i].plan.compressed) continue;
    TensorState& s = *items_[i].state;
    absl::StatusOr<bool> kept = s.q.PlaceOn(device, static_cast<size_t>(s.cols) * s.rank);
    absl::Status placed = kept.status();
    if (kept.ok() && !*kept) s.has_q = false;  // zeros: no Q̂ to start from
    if (placed.ok() && o_.error_feedback) {
      placed = s.residual.PlaceOn(device, tensors[i].count).status();
    }
    if (!placed.ok()) {
      return absl::Status(placed.code(), absl::StrCat(spec_, ": tensor '", tensors[i].name,
                                                      "': placing its PowerSGD state (Q, "
                                                      "residual): ", placed.message()));
    }
  }
  return absl::OkStatus();
}

// Per compressed tensor: M = G + E (in the tensor's own buffer), P = M·Q into p_buf_, both on
// the same block of rows while it is in cache; uncompressed tensors are copied as they are.
// Returns false when any value was not finite; such a tensor's P gets a NaN, so the fault
// reaches the sum whatever the BLAS makes of non-finite input.
bool PowerSgdCompressor::Compress(absl::Span<const TensorView> tensors, const StepContext& ctx) {
  bool ok = true;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    const Item& it = items_[i];
    float* dst = p_buf_.data() + it.offset;
    if (!it.plan.compressed) {
      if (t.count) std::memcpy(dst, t.f32(), t.count * sizeof(float));
      ok &= AllFinite(t.f32(), t.count);
      continue;
    }
    TensorState& s = *it.state;
    const int64_t rows = it.plan.rows, cols = it.plan.cols, r = it.plan.rank;
    if (!s.has_q || !o_.warm_start) {  // s.q holds cols × r values (PlaceStates)
      DrawQ(ctx.seed, t.name, i < ctx.steps.size() ? ctx.steps[i] : 0, s.q.data(), s.q.size());
    }
    bool finite = true;
    const size_t block = BlockRows(cols);
    for (size_t r0 = 0; r0 < static_cast<size_t>(rows); r0 += block) {
      const size_t nr = std::min(block, static_cast<size_t>(rows) - r0);
      float* m = t.f32() + r0 * cols;
      finite &= o_.error_feedback ? AddResidual(m, s.residual.data() + r0 * cols, nr * cols)
                                  : AllFinite(m, nr * cols);
      Product(false, nr, r, cols, m, cols, s.q.data(), dst + r0 * r);
    }
    if (!finite) dst[0] = std::numeric_limits<float>::quiet_NaN();
    ok &= finite;
  }
  return ok;
}

// After all-reduce #1 every rank holds the same sums, so every rank takes the same decision.
absl::Status PowerSgdCompressor::CheckReducedP(absl::Span<const TensorView> tensors,
                                               size_t flags, int world) {
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) {
    if (p_buf_[flags + r] != 0.0f) ranks.push_back(r);
  }
  std::vector<std::string> bad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Item& it = items_[i];
    const size_t n = it.plan.compressed ? it.plan.rows * it.plan.rank : tensors[i].count;
    if (!AllFinite(p_buf_.data() + it.offset, n)) bad.emplace_back(tensors[i].name);
  }
  if (ranks.empty() && bad.empty()) return absl::OkStatus();
  const std::string where =
      ranks.empty() ? std::string("no rank's own values: their sum over the ranks overflowed")
                    : absl::StrCat("rank(s) ", absl::StrJoin(ranks, ", "));
  return absl::InvalidArgumentError(absl::StrCat(
      spec_, ": tensor(s) ", Quoted(bad), " hold NaN or infinite values (", where,
      "); this bucket of ", tensors.size(),
      " tensor(s) is not reduced and their PowerSGD state (Q, error-feedback residual) is "
      "kept from the previous step"));
}

void PowerSgdCompressor::ScatterUncompressed(absl::Span<const TensorView> tensors, ReduceOp op,
                                             int world) {
  const float divisor = op == ReduceOp::kAverage ? static_cast<float>(world) : 1.0f;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (items_[i].plan.compressed) continue;
    const float* src = p_buf_.data() + items_[i].offset;
    float* out = tensors[i].f32();
    for (size_t k = 0; k < tensors[i].count; ++k) out[k] = src[k] / divisor;
  }
}

// P̂ = orthonormalize(P); Q = Mᵀ·P̂ into q_buf_.
void PowerSgdCompressor::ComputeQ(absl::Span<const TensorView> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Item& it = items_[i];
    if (!it.plan.compressed) continue;
    float* p = p_buf_.data() + it.offset;
    Orthogonalize(p, it.plan.rows, it.plan.rank, o_.orthogonalization_epsilon);
    Product(true, it.plan.cols, it.plan.rank, it.plan.rows, tensors[i].f32(), it.plan.cols, p,
            q_buf_.data() + it.q_offset);
  }
}

absl::Status PowerSgdCompressor::CheckReducedQ(absl::Span<const TensorView> tensors) {
  std::vector<std::string> bad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Item& it = items_[i];
    if (!it.plan.compressed) continue;
    if (!AllFinite(q_buf_.data() + it.q_offset, it.plan.cols * it.plan.rank)) {
      bad.emplace_back(tensors[i].name);
    }
  }
  if (bad.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      spec_, ": tensor(s) ", Quoted(bad),
      ": Q = Mᵀ·P overflowed float32 (gradient values too large); this bucket of ",
      tensors.size(), " tensor(s) is not reduced and its PowerSGD state is kept"));
}

// result = P̂·Q̂ᵀ (times the world size for a sum); residual = M − P̂·Q̂ᵀ; keep Q̂.
void PowerSgdCompressor::Decompress(absl::Span<const TensorView> tensors, const StepContext& ctx,
                                    int world) {
  const float scale = ctx.op == ReduceOp::kSum ? static_cast<float>(world) : 1.0f;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Item& it = items_[i];
    if (!it.plan.compressed) continue;
    const TensorView& t = tensors[i];
    TensorState& s = *it.state;
    const int64_t rows = it.plan.rows, cols = it.plan.cols, r = it.plan.rank;
    const float* p = p_buf_.data() + it.offset;
    const float* q = q_buf_.data() + it.q_offset;
    qt_.resize(static_cast<size_t>(r * cols));
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t c = 0; c < r; ++c) qt_[c * cols + j] = q[j * r + c];
    }
    row_.resize(static_cast<size_t>(cols));
    Reconstruct(p, qt_.data(), rows, cols, static_cast<int>(r), scale, t.f32(),
                o_.error_feedback ? s.residual.data() : nullptr, row_.data());
    if (o_.warm_start) {
      std::copy(q, q + cols * r, s.q.data());
      s.has_q = true;
      RedrawZeroColumns(s, ctx.seed, t.name, (i < ctx.steps.size() ? ctx.steps[i] : 0) + 1);
    } else {
      s.has_q = false;
    }
  }
}

// A column of Q̂ that is exactly zero (a zero gradient, or a zero column of P̂) would give a
// zero P column at every later step: the warm start would never recover. It is redrawn.
void PowerSgdCompressor::RedrawZeroColumns(TensorState& s, uint64_t seed, absl::string_view name,
                                           int64_t step) {
  std::vector<float> fresh;
  float* q = s.q.data();
  for (int c = 0; c < s.rank; ++c) {
    bool zero = true;
    for (int64_t j = 0; j < s.cols && zero; ++j) zero = q[j * s.rank + c] == 0.0f;
    if (!zero) continue;
    if (fresh.empty()) {
      fresh.resize(s.q.size());
      DrawQ(seed, name, step, fresh.data(), fresh.size());
    }
    for (int64_t j = 0; j < s.cols; ++j) q[j * s.rank + c] = fresh[j * s.rank + c];
  }
}

absl::Status PowerSgdCompressor::SaveState(std::string* out) const {
  std::string saved;
  StateWriter w(&saved);
  w.Bytes(kStateMagic, sizeof kStateMagic);
  w.U32(kStateVersion);
  w.U32(static_cast<uint32_t>(states_.size()));
  for (const auto& [name, s] : states_) {
    w.String(name);
    w.I64(s.rows);
    w.I64(s.cols);
    w.U32(static_cast<uint32_t>(s.rank));
    // Copied to the host from the tensor's device.
    absl::StatusOr<std::vector<float>> q = std::vector<float>();
    if (s.has_q && o_.warm_start) q = s.q.ToHost();
    absl::StatusOr<std::vector<float>> residual = s.residual.ToHost();
    if (!q.ok() || !residual.ok()) {
      const absl::Status& e = q.ok() ? residual.status() : q.status();
      return absl::Status(e.code(), absl::StrCat(spec_, ": tensor '", name, "': copying its "
                                                 "PowerSGD state to the host: ", e.message()));
    }
    w.Floats(*q);
    w.Floats(*residual);
  }
  out->append(saved);
  return absl::OkStatus();
}

absl::Status PowerSgdCompressor::LoadState(absl::string_view state) {
  StateReader in(state, absl::StrCat("PowerSGD state for '", spec_, "'"));
  char magic[sizeof kStateMagic];
  in.Bytes(magic, sizeof magic);
  in.Check(std::memcmp(magic, kStateMagic, sizeof magic) == 0, "does not start with \"PSGD\"");
  const uint32_t version = in.U32();
  in.Check(version == kStateVersion,
           absl::StrCat("version ", version, ", this braid reads version ", kStateVersion));
  // The least a tensor takes: empty name, rows, cols, rank, empty Q and residual.
  const uint32_t count = in.Count("tensor count", 8 + 8 + 8 + 4 + 8 + 8);
  std::map<std::string, TensorState, std::less<>> loaded;
  for (uint32_t i = 0; i < count && in.status().ok(); ++i) {
    const std::string name = in.String("tensor name");
    TensorState s;
    s.rows = in.I64();
    s.cols = in.I64();
    s.rank = static_cast<int>(in.U32());
    const std::vector<float> q = in.Floats(absl::StrCat("tensor '", name, "': Q"));
    const std::vector<float> residual = in.Floats(absl::StrCat("tensor '", name, "': residual"));
    if (!in.status().ok()) break;
    const std::string what = absl::StrCat("tensor '", name, "'");
    const uint64_t qn = static_cast<uint64_t>(s.cols) * s.rank;
    in.Check(!loaded.count(name), absl::StrCat(what, " appears twice"));
    const bool shape_ok = s.rows > 0 && s.cols > 0 && s.rows <= (int64_t{1} << 40) / s.cols;
    in.Check(shape_ok, absl::StrCat(what, ": bad matrix shape ", s.rows, " x ", s.cols));
    // rows·cols only once the shape is known to be sane: a crafted one would overflow.
    const uint64_t elements = shape_ok ? static_cast<uint64_t>(s.rows * s.cols) : 0;
    in.Check(s.rank == o_.rank, absl::StrCat(what, ": saved with rank ", s.rank,
                                             ", but this compressor's rank is ", o_.rank));
    in.Check(q.empty() || (o_.warm_start && q.size() == qn),
             absl::StrCat(what, ": Q of ", q.size(), " values, expected ",
                          o_.warm_start ? absl::StrCat(qn, " or 0") : "0 (warm_start=0)"));
    in.Check(residual.empty() || (o_.error_feedback && residual.size() == elements),
             absl::StrCat(what, ": residual of ", residual.size(), " values, expected ",
                          o_.error_feedback ? absl::StrCat(elements, " or 0") : "0 (ef=0)"));
    in.Check(AllFinite(q.data(), q.size()) && AllFinite(residual.data(), residual.size()),
             absl::StrCat(what, ": non-finite values"));
    if (!in.status().ok()) break;
    // In host memory until a step places it on its tensor's device.
    absl::StatusOr<StateArray> host_q = StateArray::FromHost(device::HostDevice(), q);
    absl::StatusOr<StateArray> host_e = StateArray::FromHost(device::HostDevice(), residual);
    if (!host_q.ok()) return host_q.status();
    if (!host_e.ok()) return host_e.status();
    s.q = *std::move(host_q);
    s.residual = *std::move(host_e);
    s.has_q = !s.q.empty();
    loaded.emplace(name, std::move(s));
  }
  in.Check(in.done(), "bytes left over after the last tensor");
  if (!in.status().ok()) return in.status();
  states_ = std::move(loaded);
  return absl::OkStatus();
}

// Q is the same on every rank after every step (all-reduce #2, then the same redraws), and
// so are the matrix shapes and the residuals' lengths (not their values).
void PowerSgdCompressor::DescribeSharedState(std::vector<SharedStateField>* out) const {
  for (const auto& [name, s] : states_) {
    out->push_back({name, "matrix rows", static_cast<uint64_t>(s.rows)});
    out->push_back({name, "matrix cols", static_cast<uint64_t>(s.cols)});
    uint64_t q_hash = 0;
    if (s.has_q && o_.warm_start) {
      absl::StatusOr<std::vector<float>> q = s.q.ToHost();
      // A Q this rank cannot read differs from every Q (the ranks are then told they differ).
      LOG_IF(ERROR, !q.ok()) << spec_ << ": tensor '" << name << "': reading Q: " << q.status();
      q_hash = q.ok() ? StableHash(q->data(), q->size() * sizeof(float)) : ~uint64_t{0};
    }
    out->push_back({name, "Q", q_hash, /*hashed=*/true});
    out->push_back({name, "residual length", s.residual.size()});
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Compressor>> MakePowerSgdCompressor(
    const PowerSgdOptions& options, std::string spec) {
  BRAID_RETURN_IF_ERROR(blas::Load());  // OpenBLAS, pinned to one thread (blas.h says why)
  return std::unique_ptr<Compressor>(std::make_unique<PowerSgdCompressor>(options, std::move(spec)));
}

}  // namespace braid::compression
