// Element-wise reduction kernels of the data plane. Built with function multiversioning
// (an AVX2+F16C clone and a baseline clone chosen at load time), never -march=native.
#ifndef BRAID_TRANSPORT_REDUCE_H_
#define BRAID_TRANSPORT_REDUCE_H_

#include <cstddef>

#include "common/dtype.h"

namespace braid::transport {

// dst[i] = dst[i] op src[i] for i < count. `op` is kSum, kMin, kMax or kProduct (kAverage is
// kSum followed by DivideInPlace). float16 / bfloat16 are computed in float32 and rounded back
// to nearest-even after each operation. Integer sums wrap (two's complement), like NCCL/MPI.
// dst and src may not overlap unless equal.
void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// out[i] = a[i] op b[i]; `out` may equal `a` or `b`. Same rules as ReduceInto.
void Reduce3(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// buf[i] = buf[i] / divisor for floating-point dtypes (half types via float32 and rounded
// back). Used to turn a sum into an average.
void DivideInPlace(void* buf, size_t count, DataType dtype, int divisor);

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_REDUCE_H_
