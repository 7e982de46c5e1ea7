// The sparsifiers' part of braid-compress-bench (scalecomp, topk, randomk; see
// compression/sparse.h): the data checks of their results and the timing of top-k selection
// alone. Pure functions over buffers, apart from the clock.
#ifndef BRAID_TOOLS_BENCH_SPARSE_BENCH_H_
#define BRAID_TOOLS_BENCH_SPARSE_BENCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "compression/registry.h"
#include "compression/topk.h"

namespace braid::bench {

bool IsSparseMethod(const std::string& method);

// The most non-zero elements a sparse result may hold for `count` elements on `ranks` ranks:
// k = ceil(count / ratio) for scalecomp and randomk (every rank keeps the same indices),
// ranks·k for topk (each rank its own).
size_t SparseLimit(const compression::CompressionSpec& spec, size_t count, int ranks);

// One rank's round trip of x = in[0..count) through a sparsifier on a one-rank world (memory
// empty): every element of `out` must be 0 or in's value exactly, at most `limit` of them
// non-zero, and with `by_magnitude` (the top-k methods) no unselected |x| may exceed a
// selected one. Returns the number of violations (0: the result is right) and the count of
// non-zero elements in *selected.
int64_t CheckSparseRoundTrip(const float* in, const float* out, size_t count, size_t limit,
                             bool by_magnitude, size_t* selected);

// Seconds one TopKSelector::Select(algorithm) of the k largest |x[0..count)| takes; the
// indices in *indices.
double TimeSelection(compression::TopKSelector* selector, const float* x, size_t count, size_t k,
                     compression::TopKAlgorithm algorithm, std::vector<uint64_t>* indices);

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_SPARSE_BENCH_H_
