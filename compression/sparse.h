// Sparsifying compressors: scalecomp (cyclic local top-k with low-pass filtered error
// feedback) and the two baselines it is measured against, topk and randomk.
//
// ScaleComp — C.-Y. Chen et al., "ScaleCom: Scalable Sparsified Gradient Compression for
// Communication-Efficient Distributed Training", NeurIPS 2020. At step t, on rank i of n, with
// g_i the rank's gradient and m_i its memory (zeros at first; float32, one per tensor):
//   p_i   = m_i + g_i                                   memory-compensated gradient
//   l     = t mod n                                     the cyclic leader (leader=cyclic)
//   I     = top-k indices of |p_l|                      the leader's local top-k (topk.h)
//   CLT_k(p_i) = p_i ⊙ 1_I                              cyclic local top-k: every rank keeps
//                                                       the leader's indices
//   out   = Σ_i CLT_k(p_i)        (sum)                 one all-reduce of the k values p_i[I],
//         = (Σ_i CLT_k(p_i)) / n  (average)             scattered into zeros at I
//   m_i  <- (1 - β)·m_i + β·(p_i - CLT_k(p_i))          the low-pass filtered memory (eq. 4)
// β = 1 is ordinary error feedback (m_i = p_i - CLT_k(p_i): what was not sent waits for the
// next step); β < 1 damps the memory of noisy selections, which the paper finds keeps
// large-batch training with scaled learning rates stable. Because every rank keeps the
// same indices, CLT_k commutes with the sum — Σ_i CLT_k(p_i) = CLT_k(Σ_i p_i) — so the sparse
// sum travels as one all-reduce of k dense values whatever n is: no gradient build-up.
// Per bucket: one broadcast of the leader's indices, one all-reduce of the values.
//
// Selection. ratio = dense size / k: k = ceil(N / ratio), at least 1 (N elements > 0).
// granularity=bucket (default, as ScaleCom selects over the fused gradient): one top-k over
// the concatenation of the bucket's tensors (memory kept per tensor, so a tensor may land in
// another bucket next step). granularity=tensor: k_j = ceil(N_j / ratio) per tensor, selected
// per tensor; the bucket still sends one broadcast and one all-reduce. Fusion depends on
// timing, so a bucket-granularity result can differ between two runs of the same job, unless
// the tensors are enqueued as a group (Runtime::BeginGroup: one bucket; braid.torch's
// DistributedOptimizer sends a step's gradients as one group for these methods);
// granularity=tensor (or BRAID_FUSION_THRESHOLD=0) repeats bit for bit. Which tensors share
// the selection matters: per tensor (or per small bucket) each keeps ratio-th of its
// elements, while over a whole model's gradient the layers with the largest elements (often
// the small first and last ones) get many times their share (BENCHMARKS.md, section 9). The leader step t is
// the compressed-step count of the bucket's first tensor (StepContext::steps[0]).
//
// Wire. Indices are int32 (int64 when a bucket holds 2^31 elements or more), global in the
// bucket, ascending; the all-ones word (-1) is topk's sentinel. scalecomp broadcasts [header][k indices] from the leader (header 0, or
// 1 + the bucket position of the tensor the leader found non-finite) and all-reduces (sum)
// k + n float32: the k values and one status word per rank (1 + its first non-finite
// tensor, or 0); an average divides the k sums by n afterwards, identically on every rank,
// so every rank ends with bit-identical results.
// Bytes per rank and step: payload (what a compression ratio divides) = 4·k, the values this
// rank contributes, constant in n; the leader's indices (w·k bytes, w = 4 or 8) are shared by
// all ranks and show in the transport bytes: a bandwidth-optimal all-reduce sends
// 2(n-1)/n·4·(k + n) bytes, plus this rank's part of the index broadcast.
//
// Non-finite input. A NaN or infinity in p never reaches the selection: p = g + m is formed
// on the fly, and the pass that reads it (the leader's candidate scan, every other rank's
// check) finds the largest magnitude first. A leader with a non-finite p broadcasts the
// header instead of indices; any other rank flags its status word in the all-reduce it runs
// anyway. Either way every rank returns the same InvalidArgument naming the tensors and
// ranks, with no extra collective and nothing left waiting. The memory is written only after
// every status was 0, so after a failed step every rank holds its memory as before it.
//
// Errors of Reduce: InvalidArgument (non-finite input; scalecomp's leader=R with R not a
// rank), Internal (indices received that are not ascending or not in the bucket: every rank
// learns it through the status words), and the communicator's (Unavailable,
// DeadlineExceeded, Cancelled); after any error the tensors' contents are unspecified.
//
// Baselines (those the paper compares against), both with the same memory and β:
//   topk    each rank selects the top-k of its own |p_i| and all-gathers k (index, value)
//           pairs; every rank adds all n lists into zeros in rank order, each value divided
//           by n first for an average, so every rank ends bit-identical. Payload 4·k + w·k;
//           bytes received grow as (n - 1)·k·(4 + w): the gradient build-up. A rank with a
//           non-finite p sends the sentinel index -1 with the tensor's position in its first
//           value instead of pairs.
//   randomk k indices from a seed every rank shares (BRAID_SEED, the bucket's tensor names,
//           the step): one uniformly random index in each of k strata of equal size (N/k,
//           rounded), so exactly k distinct indices and every element selected with
//           probability ~k/N. No index exchange: one all-reduce of k values (and the status
//           words) as scalecomp. Values are not rescaled by N/k: the memory carries the rest.
// The paper reports 70-150x compression with ScaleComp (ratio 100 is the default here).
#ifndef BRAID_COMPRESSION_SPARSE_H_
#define BRAID_COMPRESSION_SPARSE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "compression/compressor.h"
#include "compression/topk.h"

namespace braid::compression {

enum class SparseGranularity { kBucket, kTensor };

struct SparseOptions {
  double ratio = 100;  // dense elements per selected element, >= 1
  float beta = 1.0f;   // low-pass filter of the memory, in (0, 1]; 1 = plain error feedback
  SparseGranularity granularity = SparseGranularity::kBucket;
  int leader = -1;  // scalecomp: -1 = cyclic (t mod n), else this fixed rank
  TopKAlgorithm selection = TopKAlgorithm::kAuto;  // tests and benchmarks pick one
};

// k for `count` elements: ceil(count / ratio), at least 1 when count > 0, at most count.
size_t SparseK(size_t count, double ratio);

// How a bucket is sparsified: pure, so it is unit-tested.
struct SparsePlan {
  std::vector<uint64_t> offset;  // tensors + 1 entries: each tensor's start in the bucket
  std::vector<size_t> k;         // per tensor (granularity=tensor) or one entry (bucket)
  size_t total_k = 0;            // the sum of k
  size_t index_bytes = 4;        // 4, or 8 for buckets of 2^31 elements or more
};
SparsePlan PlanSparse(absl::Span<const size_t> counts, const SparseOptions& options);

struct CompressionSpec;
// The compressor of a parsed scalecomp / topk / randomk spec (registry.h).
std::unique_ptr<Compressor> CreateSparseCompressor(const CompressionSpec& spec);

std::unique_ptr<Compressor> MakeScaleCompCompressor(const SparseOptions& options,
                                                    std::string spec);
std::unique_ptr<Compressor> MakeTopKCompressor(const SparseOptions& options, std::string spec);
// `randomk` (the shared-seed baseline above), not the harmful test-only `test_randomk`.
std::unique_ptr<Compressor> MakeSharedRandomKCompressor(const SparseOptions& options,
                                                        std::string spec);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_SPARSE_H_
