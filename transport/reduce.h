// Element-wise reduction kernels of the data plane. Built with function multiversioning
// (an AVX2+F16C clone and a baseline clone chosen at load time), never -march=native.
#ifndef BRAID_TRANSPORT_REDUCE_H_
#define BRAID_TRANSPORT_REDUCE_H_

#include <cstddef>

#include "common/dtype.h"

namespace braid::transport {

// dst[i] = dst[i] op src[i] for i < count. `op` is kSum, kMin, kMax or kProduct (kAverage is
// kSum followed by DivideInPlace). float16 / bfloat16 are computed in float32 and rounded back
// to nearest-even after each operation (the collectives keep 16-bit partial results in
// float32 instead: Note [16-bit arithmetic] in transport/canonical_reduce.h). Integer sums
// wrap (two's complement), like NCCL/MPI. Min and max propagate NaN: when either operand is
// NaN the result is the first NaN operand (a, else b), so a NaN on any rank reaches the
// result (a plain a < b ? a : b, like std::min and minps, drops a NaN in `a`). Otherwise
// they return b on ties (-0 vs +0). dst and src may not overlap unless equal.
void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// out[i] = a[i] op b[i]; `out` may equal `a` or `b`. Same rules as ReduceInto.
void Reduce3(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// buf[i] = buf[i] / divisor for floating-point dtypes (half types via float32 and rounded
// back). Used to turn a sum into an average.
void DivideInPlace(void* buf, size_t count, DataType dtype, int divisor);

// True for the float16 / bfloat16 arithmetic reductions (sum, average, product), which the
// collectives compute in float32 and round once (Note [16-bit arithmetic]).
bool AccumulatesInFloat32(DataType dtype, ReduceOp op);

// dst[i] = src[i] / divisor in float32, src of `dtype` float16 or bfloat16 (exact for
// divisor 1: every 16-bit value is a float32). dst and src must not overlap.
void WidenToFloat32(float* dst, const void* src, size_t count, DataType dtype, int divisor);

// dst[i] = src[i] rounded to nearest even into `dtype` (float16 or bfloat16; beyond the
// format's range to infinity). dst and src must not overlap.
void NarrowFromFloat32(void* dst, const float* src, size_t count, DataType dtype);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_REDUCE_H_
