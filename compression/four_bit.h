// The 4-bit all-reduce (fp4 / int4), planned as a pure function so its layout is unit-tested.
//
// 4-bit codes cannot be summed as codes, so a bucket is reduced in five steps:
//   1. every rank quantizes every chunk of every tensor (quantize.h; optionally after adding
//      its error-feedback residual);
//   2. all-to-all: rank p receives every rank's codes (and scales) for shard p;
//   3. rank p decodes them (each scale divided by n to average) and sums them in float32
//      in rank order 0..n-1;
//   4. rank p re-quantizes its reduced shard (seeded by tensor and step, not by p, so a
//      tensor's result does not depend on the bucket it was fused into);
//   5. all-gather of the re-quantized shards; every rank decodes all of them — also its own
//      shard, from the codes — so every rank ends bit-identical.
// Two quantizations whatever the number of ranks, and each rank sends 2(n-1)/n of its payload,
// which is ~1/7.5 of float32's bytes at chunk=128 (64 code bytes + a 4-byte scale per 512).
//
// Error bound, element-wise, for the mean of x_0..x_{n-1}: with s_r the scale of the element's
// chunk on rank r and s_out the scale of its reduced chunk,
//   fp4:  |result - mean| <= (1/n)·Σ_r (3/4)·s_r + (3/4)·s_out
//   int4: |result - mean| <= (1/n)·Σ_r s_r + s_out            (s = max|chunk| / 7)
// (for kSum multiply the first term by n, and s_out is the sum's scale), and the result is
// unbiased: E[result] = mean, since both roundings are. Error feedback (ef=1) carries step 1's
// error to the next step (the bound above holds per step for the residual-corrected input).
//
// Chunks never straddle tensors (each tensor's scales are its own, as GradScale's per-layer
// scaling intends); shards are contiguous runs of whole chunks balanced by element count.
#ifndef BRAID_COMPRESSION_FOUR_BIT_H_
#define BRAID_COMPRESSION_FOUR_BIT_H_

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/types/span.h"

namespace braid::compression {

struct FourBitChunk {
  size_t tensor = 0;       // index into the bucket's tensors
  size_t begin = 0;        // first element within that tensor
  size_t count = 0;        // elements (== chunk except at a tensor's end)
  int shard = 0;           // rank owning this chunk's reduction
  size_t scale_index = 0;  // index of its scale within the shard's block
  size_t code_offset = 0;  // byte offset of its codes within the shard's block
};

// A shard's block on the wire: [float32 scale × chunks][packed codes of each chunk in order].
struct FourBitLayout {
  std::vector<FourBitChunk> chunks;            // tensor-major, element order
  std::vector<size_t> shard_first_chunk;       // ranks + 1 entries
  std::vector<size_t> shard_bytes;             // block size per shard
  std::vector<size_t> shard_offset;            // ranks + 1 entries: prefix sums of shard_bytes
  std::vector<uint64_t> tensor_payload_bytes;  // per tensor: its scales + codes
};

FourBitLayout PlanFourBit(absl::Span<const size_t> counts, size_t chunk, int ranks);

// The 32-bit stochastic-rounding seed for one quantization stage (1: a rank's own input,
// 2: the re-quantization of a reduced shard, with rank -1) of tensor `name` at `step` on
// `rank`. Element i of the tensor then draws UniformDraw(seed, i).
uint32_t StreamSeed(uint64_t job_seed, int rank, absl::string_view name, int64_t step, int stage);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_FOUR_BIT_H_
