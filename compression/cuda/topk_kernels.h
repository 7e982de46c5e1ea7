// Top-k selection by magnitude on a GPU, with the CPU's exact order (compression/topk.h):
// elements compare by MagnitudeKey (|x|'s bits; infinities and NaNs above every finite
// value), ties broken by the lower index, so the selected set is the CPU's, bit for bit, and
// the indices come out ascending. By radix select: four 8-bit histogram passes over the
// keys find the k-th largest key T (each pass reads the keys once; no sort), then one pass
// flags every key above T and the lowest-index keys equal to T, and CUB compacts the flagged
// indices in order. Plus the gather and scatter of the k values (the sparsifiers' exchange).
// Launch functions return a cudaError_t as an int (0: launched); `stream` is a cudaStream_t.
#ifndef BRAID_COMPRESSION_CUDA_TOPK_KERNELS_H_
#define BRAID_COMPRESSION_CUDA_TOPK_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace braid::compression::cuda {

// Device scratch LaunchTopK needs for n elements (n < 2^32).
size_t TopKScratchBytes(size_t n);

// indices[0..min(k, n)) = the ascending indices of the k elements of x[i] (+ addend[i] when
// addend is not null: the sparsifiers' g + m, formed on the fly) of largest magnitude.
// *nonfinite (device memory) is set to 1 when an element is an infinity or a NaN, else 0;
// the indices are then meaningless (the CPU's Select returns false). `scratch` holds
// TopKScratchBytes(n) bytes of device memory.
int LaunchTopK(const float* x, const float* addend, size_t n, size_t k, uint32_t* indices,
               uint32_t* nonfinite, void* scratch, void* stream);
// values[i] = x[indices[i]] (+ addend[indices[i]]), for i < k.
int LaunchGather(const float* x, const float* addend, const uint32_t* indices, size_t k,
                 float* values, void* stream);
// out[indices[i]] = values[i] / divisor (add: +=), for i < k: SparseBucket::Scatter (a
// division, not a reciprocal; none when divisor is 1).
int LaunchScatter(const uint32_t* indices, const float* values, size_t k, float divisor,
                  bool add, float* out, void* stream);
// The sparsifiers' memory after a step (SparseBucket::UpdateMemoryAndClear, the CPU's
// arithmetic, no fused multiply-add): saved[i] = m[indices[i]] first (LaunchGather), then
// m = (1 − β)·m + β·(g + m) and g = 0 densely (topk.h's AddFilterAndClear; β = 1: m = g + m),
// then at the sent indices m = (1 − β)·saved + β·0 (β = 1: 0).
int LaunchAddFilterAndClear(float* m, float* g, size_t n, float beta, void* stream);
int LaunchMemoryAtSent(const uint32_t* indices, const float* saved, size_t k, float beta,
                       float* m, void* stream);

}  // namespace braid::compression::cuda

#endif  // BRAID_COMPRESSION_CUDA_TOPK_KERNELS_H_
