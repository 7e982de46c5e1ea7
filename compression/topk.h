// Top-k selection by magnitude for the sparsifying compressors (scalecomp, topk), and the
// streaming kernels they share.
//
// Order. Elements compare by MagnitudeKey(x): the IEEE-754 bit pattern of x without its sign
// bit, as an unsigned integer. For finite x this orders exactly as |x| does (+0 and -0 are
// equal), and it puts infinities and NaNs above every finite value, so selection is defined
// (no undefined behaviour, as std::nth_element with a float comparison would have) whatever
// the input; the compressors reject non-finite gradients before they select anyway.
// Ties are broken by index: of equal magnitudes the lower index wins. So the top-k set is
// exactly the first k elements of the list sorted by (|x| descending, index ascending) — what
// a full stable sort would give — and it is the same on every machine.
//
// Algorithms, both O(N) expected, never a full sort:
//   kNthElement        copy the N keys, std::nth_element for the k-th largest key T, then one
//                      pass taking every key > T and the lowest-index keys == T. About four
//                      passes over N keys.
//   kSampledThreshold  estimate a threshold t <= T from 4096 keys at fixed pseudo-random
//                      positions (the (k/N)-quantile of the sample lowered by three standard
//                      deviations of its binomial count), collect the candidates with key >= t
//                      in one streaming pass (blocks of 32 without a candidate cost a
//                      vectorized max), then nth_element over the candidates only
//                      (about 1.5·k of them at k/N = 1%). Correct whatever t is: when fewer
//                      than k candidates pass, or far more than expected (many ties), it falls
//                      back to kNthElement. One pass over N keys.
//   kAuto              kSampledThreshold for N >= 32768 and k <= N/16, else kNthElement.
// BENCHMARKS.md compares the two (braid-compress-bench --parts codec).
#ifndef BRAID_COMPRESSION_TOPK_H_
#define BRAID_COMPRESSION_TOPK_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"

namespace braid::compression {

inline uint32_t MagnitudeKey(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7fffffffu;
}

// Keys at or above this are infinities (== it) or NaNs (above it).
constexpr uint32_t kNonFiniteKey = 0x7f800000u;

// One tensor of a bucket as the selection sees it; global index = the segment's offset in the
// concatenation of all segments + the element's index in the segment.
struct FloatSegment {
  const float* data = nullptr;
  size_t count = 0;
};

enum class TopKAlgorithm { kAuto, kNthElement, kSampledThreshold };

class TopKSelector {
 public:
  // Replaces *out with the global indices, ascending, of the k elements of largest magnitude
  // of the concatenated segments (ties: lower index first). k is clamped to the total count.
  void Select(absl::Span<const FloatSegment> segments, size_t k, std::vector<uint64_t>* out,
              TopKAlgorithm algorithm = TopKAlgorithm::kAuto);

  // The algorithm the last Select ran to its end (kNthElement after a sampled fallback).
  TopKAlgorithm last_algorithm() const { return last_; }

 private:
  void SelectByNthElement(absl::Span<const FloatSegment> segments, size_t total, size_t k,
                          std::vector<uint64_t>* out);
  bool SelectBySample(absl::Span<const FloatSegment> segments, size_t total, size_t k,
                      std::vector<uint64_t>* out);

  TopKAlgorithm last_ = TopKAlgorithm::kAuto;
  // Scratch, reused across calls (no allocation per step in steady state).
  std::vector<uint32_t> keys_, sample_;
  std::vector<uint64_t> candidates_;
};

// p[i] += m[i] for i < n, and returns the largest MagnitudeKey of the sums (>= kNonFiniteKey:
// some sum is infinite or NaN). The first pass of every sparsifier: error-feedback memory
// added to the gradient, and the finiteness check, in one read of each.
uint32_t AddAndMaxKey(float* p, const float* m, size_t n);

// The largest MagnitudeKey of x[0..n).
uint32_t MaxKey(const float* x, size_t n);

// The low-pass filtered memory update of every element, as if none had been sent:
// m[i] = (1 - beta)·m[i] + beta·p[i] (beta == 1: m[i] = p[i], a copy); then p[i] = 0.
// The sparsifiers then fix up the sent elements (sparse.h).
void FilterMemoryAndClear(float* m, float* p, size_t n, float beta);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_TOPK_H_
