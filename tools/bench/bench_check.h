// The data check of braid-bench (nccl-tests' -c): inputs follow a rank- and index-dependent
// pattern of small integers, so the reference result is computed locally and exactly and the
// output is compared bit for bit. Pure functions, unit-testable without processes.
//
// Exactness: sum/average patterns lie in [-8, 8] ([0, 16] for uint8) and product patterns in
// {-1, 1, 2} ({1, 2} for uint8), so every reduction is exact in every dtype up to
// kMaxExactRanks ranks (bfloat16 holds integers up to 256 exactly; float16 products overflow to
// infinity on both sides alike). Integer sums and products wrap as the Communicator's do.
// Average is the exact sum divided by the world size in float32 (float64 for float64),
// rounded once to the dtype, as Communicator::AllReduce defines it.
#ifndef BRAID_TOOLS_BENCH_BENCH_CHECK_H_
#define BRAID_TOOLS_BENCH_BENCH_CHECK_H_

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace braid::bench {

inline constexpr int kMaxExactRanks = 32;

// The pattern value of element `index` on rank `rank` for `op` (see above).
int64_t PatternValue(int rank, size_t index, DataType dtype, ReduceOp op);

// buf[i] = PatternValue(rank, first_index + i) for i < count, stored as `dtype`.
void FillPattern(void* buf, size_t count, DataType dtype, ReduceOp op, int rank,
                 size_t first_index);

// Number of i < count where buf[i] differs (bitwise) from `op` over ranks 0..ranks-1 of
// PatternValue(r, first_index + i).
size_t CountWrongReduced(const void* buf, size_t count, DataType dtype, ReduceOp op, int ranks,
                         size_t first_index);

// Number of i < count where buf[i] differs (bitwise) from PatternValue(rank, first_index + i):
// the check of copying collectives (all-gather, all-to-all, broadcast).
size_t CountWrongCopied(const void* buf, size_t count, DataType dtype, ReduceOp op, int rank,
                        size_t first_index);

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_BENCH_CHECK_H_
