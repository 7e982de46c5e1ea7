// Pure measurement arithmetic of braid-bench, after nccl-tests (src/common.cu and the
// *_GetBw functions of src/{all_reduce,all_gather,reduce_scatter,alltoall,broadcast}.cu):
// size lists, element counts per collective, algorithm and bus bandwidth, medians.
// No I/O, so it is unit-tested without processes.
#ifndef BRAID_TOOLS_BENCH_BENCH_MATH_H_
#define BRAID_TOOLS_BENCH_BENCH_MATH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::bench {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast };

// "allreduce", "allgather", "reducescatter", "alltoall", "broadcast".
absl::string_view CollectiveName(Collective c);
absl::StatusOr<Collective> ParseCollective(absl::string_view name);

// "64", "1K", "64M", "2G" (also lower case, optional trailing "B"/"iB") -> bytes. Suffixes
// are powers of 1024, as nccl-tests' -b/-e. InvalidArgument on anything else.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);

// Sizes from `min_bytes`, multiplied by `factor` while <= `max_bytes` (nccl-tests -b/-e/-f).
// factor must be >= 2 unless min == max; InvalidArgument otherwise.
absl::StatusOr<std::vector<uint64_t>> SizeList(uint64_t min_bytes, uint64_t max_bytes,
                                               uint64_t factor);

// How one size of the sweep maps onto one collective call, as in nccl-tests: `bytes` is the
// total buffer the row reports (the all-reduce buffer, the all-gather output, the
// reduce-scatter input, the all-to-all buffer, the broadcast buffer) and algbw = bytes / time.
struct CollectiveShape {
  size_t count = 0;        // elements of `bytes` (the "count" column)
  size_t block_count = 0;  // per-rank block in elements (allgather/reducescatter/alltoall)
  uint64_t bytes = 0;      // count * element size
};

// Rounds `requested_bytes` down to what the collective can use with `ranks` ranks and
// `elem_size`-byte elements: a whole number of elements and, for the block collectives,
// a whole number of equal per-rank blocks. Never less than one element (one per rank for
// the block collectives), so a 4-byte row still measures latency.
CollectiveShape ShapeFor(Collective c, uint64_t requested_bytes, size_t elem_size, int ranks);

// busbw / algbw (nccl-tests doc/PERFORMANCE.md): all-reduce 2(n-1)/n; all-gather,
// reduce-scatter and all-to-all (n-1)/n; broadcast 1.
double BusBwFactor(Collective c, int ranks);

// bytes / seconds in GB/s (1e9 bytes per second, as nccl-tests).
double GigabytesPerSecond(uint64_t bytes, double seconds);

// Median of `values` (mean of the two middle ones for an even count); 0 for none.
double Median(std::vector<double> values);

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_BENCH_MATH_H_
