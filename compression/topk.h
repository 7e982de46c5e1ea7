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
//                      and their keys in one streaming pass (AVX2: a block of 16 elements
//                      without a candidate costs two compares and a test), then nth_element
//                      over the candidates only (about 1.5·k of them at k/N = 1%). Correct
//                      whatever t is: when fewer than k candidates pass, or far more than
//                      expected (many ties), it falls back to kNthElement. One pass over N.
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

// One tensor of a bucket as the selection sees it: element i is data[i] + addend[i] (the
// sparsifiers' memory-compensated gradient g + m, formed on the fly so the memory is not
// touched before the step is known to succeed), or data[i] when addend is null. Global index
// = the segment's offset in the concatenation of all segments + i.
struct FloatSegment {
  const float* data = nullptr;
  size_t count = 0;
  const float* addend = nullptr;
};

enum class TopKAlgorithm { kAuto, kNthElement, kSampledThreshold };

class TopKSelector {
 public:
  // Replaces *out with the global indices, ascending, of the k elements of largest magnitude
  // of the concatenated segments (ties: lower index first); k is clamped to the total count.
  // Returns false, with *out empty, when some element is an infinity or a NaN: the check is
  // part of the same pass over the data, and a non-finite key never reaches a selection.
  bool Select(absl::Span<const FloatSegment> segments, size_t k, std::vector<uint64_t>* out,
              TopKAlgorithm algorithm = TopKAlgorithm::kAuto);

  // The algorithm the last Select ran to its end (kNthElement after a sampled fallback).
  TopKAlgorithm last_algorithm() const { return last_; }

 private:
  // kNthElement; false when non-finite.
  bool SelectByNthElement(absl::Span<const FloatSegment> segments, size_t total, size_t k,
                          std::vector<uint64_t>* out);
  // kSampledThreshold: 1 done, 0 fall back to kNthElement, -1 non-finite.
  int SelectBySample(absl::Span<const FloatSegment> segments, size_t total, size_t k,
                     std::vector<uint64_t>* out);

  TopKAlgorithm last_ = TopKAlgorithm::kAuto;
  // Scratch, reused across calls (no allocation per step in steady state).
  std::vector<uint32_t> keys_, sample_;
  std::vector<uint64_t> candidates_, offsets_;
};

// false: the portable candidate scan only (tests compare it with the AVX2 one, which must
// find the same candidates). Not thread-safe; default true.
void UseVectorSelection(bool enabled);

// The largest MagnitudeKey of x[i] + a[i] (of x[i] when a is null) over i < n; at or above
// kNonFiniteKey when some element is infinite or NaN. Reads only.
uint32_t MaxKeyOfSum(const float* x, const float* a, size_t n);

// The end of a sparsifier's step for one tensor, every element as if none had been sent
// (the sent ones are fixed up afterwards, sparse_core.cc): with p = g[i] + m[i],
// m[i] = (1 - beta)·m[i] + beta·(p - 0) (beta == 1: m[i] = p), then g[i] = 0 for the result.
// ErrorFeedback's Apply-then-Update expressions, bit for bit.
void AddFilterAndClear(float* m, float* g, size_t n, float beta);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_TOPK_H_
