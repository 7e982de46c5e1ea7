// PowerSGD's GPU kernels (compression/powersgd.h; Vogels et al., "PowerSGD: Practical
// Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019, Algorithm 1):
// the element-wise passes and the orthogonalization, and the two products through cuBLAS.
// Matrices are row-major in device memory: M rows × cols, P rows × rank, Q cols × rank.
// Launch functions return the launch's cudaError_t as an int (0: launched); `stream` is a
// cudaStream_t (null: the default stream).
#ifndef BRAID_COMPRESSION_CUDA_LOWRANK_KERNELS_H_
#define BRAID_COMPRESSION_CUDA_LOWRANK_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace braid::compression::cuda {

// m[i] += e[i]; *nonfinite (device memory, one uint32) is or-ed with 1 when a sum is not
// finite (set it to 0 first): lowrank_kernels.h's AddResidual.
int LaunchAddResidual(float* m, const float* e, size_t n, uint32_t* nonfinite, void* stream);
// The decompression of lowrank_kernels.h's Reconstruct, element for element the same
// arithmetic (p·q̂ summed over c = 0 .. rank − 1 in order, no fused multiply-add): the CPU's
// bits. qt is Q̂ transposed (rank × cols); residual may be null.
int LaunchReconstruct(const float* p, const float* qt, size_t rows, size_t cols, int rank,
                      float scale, float* m, float* residual, void* stream);
// Gram–Schmidt on the columns of p (rows × cols), as powersgd.h's Orthogonalize: norms and
// dot products accumulated in double by a fixed reduction tree (the same bits run after
// run; within float rounding of the CPU's, whose order is sequential).
int LaunchOrthogonalize(float* p, size_t rows, size_t cols, double epsilon, void* stream);
// qt[c][j] = q[j][c]: Q (cols × rank) transposed.
int LaunchTranspose(const float* q, size_t cols, int rank, float* qt, void* stream);

// P = M·Q and Q = Mᵀ·P through cuBLAS (FP32, no TF32: CUBLAS_PEDANTIC_MATH), on the current
// device. cuBLAS is opened on first use (libcublas.so.13: the CUDA toolkit's, or the
// nvidia-cublas Python package's on the library path), so braid needs it only where
// PowerSGD runs on a GPU. Errors: FailedPrecondition when cuBLAS cannot be opened, naming
// the library and dlopen's reason; Internal with cuBLAS's status otherwise.
absl::Status MultiplyMQ(const float* m, const float* q, int64_t rows, int64_t cols, int rank,
                        float* p, void* stream);
absl::Status MultiplyMtP(const float* m, const float* p, int64_t rows, int64_t cols, int rank,
                         float* q, void* stream);

}  // namespace braid::compression::cuda

#endif  // BRAID_COMPRESSION_CUDA_LOWRANK_KERNELS_H_
