// PowerSGD's kernels (lowrank_kernels.h). Compiled with --fmad=false: Reconstruct must round
// as the CPU's (compression/lowrank_kernels.cc, -ffp-contract=off) does.
#include <cuda_runtime.h>

#include "compression/cuda/lowrank_kernels.h"
#include "device/cuda/launch.cuh"

namespace braid::compression::cuda {
namespace {

using cuda_launch::Blocks;
using cuda_launch::kThreads;

__device__ bool NonFinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }

__global__ void AddResidualKernel(float* m, const float* e, size_t n, uint32_t* nonfinite) {
  bool bad = false;
  BRAID_GRID_STRIDE(i, n) {
    const float v = m[i] + e[i];
    m[i] = v;
    bad = bad || NonFinite(v);
  }
  if (bad) atomicOr(nonfinite, 1u);
}

__global__ void ReconstructKernel(const float* p, const float* qt, size_t rows, size_t cols,
                                  int rank, float scale, float* m, float* residual) {
  BRAID_GRID_STRIDE(k, rows * cols) {
    const size_t i = k / cols, j = k % cols;
    const float* pi = p + i * rank;
    float approx = pi[0] * qt[j];
    for (int c = 1; c < rank; ++c) approx += pi[c] * qt[static_cast<size_t>(c) * cols + j];
    if (residual != nullptr) residual[k] = m[k] - approx;
    m[k] = scale * approx;
  }
}

__global__ void TransposeKernel(const float* q, size_t cols, int rank, float* qt) {
  BRAID_GRID_STRIDE(k, cols * rank) {
    const size_t j = k / rank, c = k % rank;
    qt[c * cols + j] = q[k];
  }
}

// The sum over the block of each thread's `v`, in a fixed tree: every thread gets it.
__device__ double BlockSum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double sum = shared[0];
  __syncthreads();
  return sum;
}

// One block for the whole matrix: the columns one after the other, as the CPU's loop.
__global__ void OrthogonalizeKernel(float* p, size_t rows, size_t cols, double epsilon) {
  __shared__ double shared[kThreads];
  for (size_t j = 0; j < cols; ++j) {
    double sq = 0;
    for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
      const double v = p[i * cols + j];
      sq += v * v;
    }
    const double denom = sqrt(BlockSum(sq, shared)) + epsilon;
    for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
      // a zero column stays zero: no 0/0
      p[i * cols + j] = denom > 0 ? static_cast<float>(p[i * cols + j] / denom) : 0.0f;
    }
    __syncthreads();
    if (!(denom > 0)) continue;
    for (size_t k = j + 1; k < cols; ++k) {
      double dot = 0;
      for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
        dot += static_cast<double>(p[i * cols + j]) * p[i * cols + k];
      }
      dot = BlockSum(dot, shared);
      for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
        p[i * cols + k] = static_cast<float>(p[i * cols + k] - dot * p[i * cols + j]);
      }
      __syncthreads();
    }
  }
}

int Launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int LaunchAddResidual(float* m, const float* e, size_t n, uint32_t* nonfinite, void* stream) {
  if (n == 0) return 0;
  AddResidualKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(m, e, n,
                                                                                  nonfinite);
  return Launched();
}

int LaunchReconstruct(const float* p, const float* qt, size_t rows, size_t cols, int rank,
                      float scale, float* m, float* residual, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  if (rank < 1) return static_cast<int>(cudaErrorInvalidValue);
  ReconstructKernel<<<Blocks(rows * cols), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p, qt, rows, cols, rank, scale, m, residual);
  return Launched();
}

int LaunchOrthogonalize(float* p, size_t rows, size_t cols, double epsilon, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  OrthogonalizeKernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, rows, cols,
                                                                              epsilon);
  return Launched();
}

int LaunchTranspose(const float* q, size_t cols, int rank, float* qt, void* stream) {
  if (cols == 0 || rank < 1) return 0;
  TransposeKernel<<<Blocks(cols * rank), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      q, cols, rank, qt);
  return Launched();
}

}  // namespace braid::compression::cuda
