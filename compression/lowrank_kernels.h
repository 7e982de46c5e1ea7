// The element-wise loops of PowerSGD (powersgd.h), in their own file for their flags: -O3
// -fno-trapping-math vectorize them, and -ffp-contract=off (no fused multiply-add) keeps
// Reconstruct bit-identical between its AVX2 and baseline clones, so ranks on hosts with
// different CPUs still compute the same result from the same P̂ and Q̂. (OpenBLAS chooses its
// kernel by CPU model, so the decompression does not go through it.)
#ifndef BRAID_COMPRESSION_LOWRANK_KERNELS_H_
#define BRAID_COMPRESSION_LOWRANK_KERNELS_H_

#include <cstddef>

namespace braid::compression {

// m[i] += e[i] for i < n; true when every sum is finite.
bool AddResidual(float* m, const float* e, size_t n);

// true when every x[i], i < n, is finite.
bool AllFinite(const float* x, size_t n);

// The decompression of a rows × cols matrix from p (rows × rank, row-major) and qt (Q̂
// transposed: rank × cols, row-major): approx[i][j] = Σ_c p[i][c]·qt[c][j], summed in the order
// c = 0, 1, ..., rank − 1 without fused multiply-add; then, row by row,
//   residual != null:  residual[i][j] = m[i][j] − approx[i][j];  m[i][j] = scale·approx[i][j]
//   residual == null:  m[i][j] = scale·approx[i][j]
// `row` is scratch of `cols` floats.
void Reconstruct(const float* p, const float* qt, size_t rows, size_t cols, int rank,
                 float scale, float* m, float* residual, float* row);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_LOWRANK_KERNELS_H_
