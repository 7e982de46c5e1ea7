// PowerSGD: low-rank gradient compression that aggregates with plain all-reduce.
//
// Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
// Distributed Optimization", NeurIPS 2019, Algorithm 1 (rank-R compression, one step of
// subspace iteration warm-started from the previous step) inside Algorithm 2 (error feedback).
// Per gradient tensor, viewed as a matrix M of shape rows × cols = shape[0] × (count/shape[0])
// (a conv kernel out × in × kh × kw becomes out × in·kh·kw), on every rank w:
//
//   M_w  = G_w + E_w                      error feedback: add last step's residual (ef=1)
//   Q    = last step's Q (warm_start=1), else a standard-normal draw, cols × R, the same on
//          every rank (seeded by BRAID_SEED, the tensor's name and its step; see DrawQ)
//   P_w  = M_w · Q                        rows × R
//   P    = Σ_w P_w                        all-reduce #1 (sum: the next step is scale-free)
//   P̂    = orthonormalize(P)             Gram–Schmidt on the columns (Orthogonalize)
//   Q_w  = M_wᵀ · P̂                      cols × R
//   Q̂    = (1/W)·Σ_w Q_w                 all-reduce #2 (average over the W ranks)
//   result = P̂·Q̂ᵀ  (average), W·P̂·Q̂ᵀ  (sum)
//   E_w  = M_w − P̂·Q̂ᵀ                   the new residual (ef=1), as the authors' code and
//                                          PyTorch's powerSGD_hook do
//
// Every rank ends with the same P̂ and Q̂, hence bit-identical results: the orthogonalization
// and the decompression are braid's own loops (lowrank_kernels.h), which give the same bits on
// every CPU; OpenBLAS (blas.h), whose kernels differ by CPU model, only computes each rank's
// own P_w and Q_w. The last Q̂ is kept for the next step (warm start); a column
// of Q̂ that is exactly zero (a zero gradient) is redrawn for the next step, since a zero
// column would stay zero forever.
//
// Which tensors are compressed: those with at least two dimensions whose compressed size
// (rows + cols)·R·min_compression_rate is below rows·cols (PowerSGD's and powerSGD_hook's
// rule). The others (1-D tensors: biases, norms; small matrices) are all-reduced exactly,
// packed into the same buffer as the P matrices: one bucket costs two all-reduces in all,
// whatever its number of tensors. Payload bytes per step: (rows + cols)·R·4 per compressed
// tensor, count·4 per uncompressed one (counted under powersgd too). All-reduce #1 carries,
// per tensor in bucket order, its P (rows × R, row-major) or its values, then one float per
// rank (its non-finite flag, below); all-reduce #2 the compressed tensors' Q (cols × R) in
// bucket order.
//
// Non-finite input: a NaN or infinity in any tensor of a bucket (after adding the residual)
// on any rank fails the whole bucket on every rank with InvalidArgument naming the tensors
// and the ranks; the ranks agree through a flag per rank carried by all-reduce #1, so no
// rank waits for a collective the others skipped. Nothing of that step is kept: residuals
// and Q stay as they were, so the next finite step continues as if the bad one never came.
// An overflow of Q̂ (finite but enormous gradients) fails the same way after all-reduce #2.
//
// State for checkpoints (SaveState / LoadState, Compressor interface): per tensor its Q (when
// warm_start=1) and residual (when ef=1), in this format (integers little-endian):
//   "PSGD" (4 bytes), version u32 = 1, tensor count u32, then per tensor
//     name (u64 length + bytes), rows i64, cols i64, rank u32,
//     q: u64 count (cols·rank, or 0 when none is kept) + float32 values, row-major cols × rank,
//     residual: u64 count (rows·cols, or 0) + float32 values, row-major rows × cols.
// LoadState replaces every tensor's state; a tensor whose loaded shape or rank differs from
// what it later reduces restarts from a fresh Q and a zero residual with a warning (as does
// any tensor whose shape changes between steps).
#ifndef BRAID_COMPRESSION_POWERSGD_H_
#define BRAID_COMPRESSION_POWERSGD_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "compression/compressor.h"

namespace braid::compression {

// The spec's options (compression/registry.h: powersgd:rank=R,min_compression_rate=...).
struct PowerSgdOptions {
  int rank = 1;                        // R, columns of P and Q
  double min_compression_rate = 2.0;   // compress only when rows·cols > (rows+cols)·R·this
  bool error_feedback = true;          // ef
  bool warm_start = true;              // reuse last step's Q
  double orthogonalization_epsilon = 0.0;  // column /= (norm + epsilon)
};

// How one tensor is reduced.
struct PowerSgdPlan {
  bool compressed = false;
  int64_t rows = 0, cols = 0;  // the matrix view (compressed tensors only)
  int rank = 0;                // R (compressed tensors only)
  uint64_t payload_bytes = 0;  // (rows + cols)·R·4, or count·4 when sent uncompressed
};

// The plan for a tensor of `shape` (pure; count = ShapeElements(shape), common/limits.h; a
// shape it refuses plans as an empty tensor).
PowerSgdPlan PlanPowerSgd(absl::Span<const int64_t> shape, const PowerSgdOptions& options);

// Orthonormalizes the `cols` columns of the row-major rows × cols matrix `p` in place by
// modified Gram–Schmidt (norms and dot products in double): column j /= (‖column j‖ + epsilon),
// then is projected out of the later columns. A column of norm 0 (or one whose norm plus
// epsilon is 0) is left all zeros — never NaN, for any epsilon >= 0.
void Orthogonalize(float* p, size_t rows, size_t cols, double epsilon);

// Fills q[0..count) with standard-normal draws determined by (seed, name, step) alone
// (Box–Muller on a counter-based hash), identical on every rank and every run.
void DrawQ(uint64_t seed, absl::string_view name, int64_t step, float* q, size_t count);

// FailedPrecondition when OpenBLAS cannot be opened (blas.h).
absl::StatusOr<std::unique_ptr<Compressor>> MakePowerSgdCompressor(
    const PowerSgdOptions& options, std::string spec);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_POWERSGD_H_
