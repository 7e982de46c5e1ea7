// The CUDA kernels of the device interface (device/cuda/cuda_device.cc): fill, convert and
// reduce, launched on a stream. Plain declarations (no CUDA types), so C++ compiled by the
// host compiler calls them; each returns the launch's cudaError_t as an int (0: launched).
#ifndef BRAID_DEVICE_CUDA_DEVICE_KERNELS_H_
#define BRAID_DEVICE_CUDA_DEVICE_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace braid::device::cuda {

// dst[0..count) = the `element_bytes`-byte value at `pattern` (1, 2, 4 or 8 bytes).
int LaunchFillPattern(void* dst, size_t count, const void* pattern, size_t element_bytes,
                      void* stream);
// dst = `to`(src), float32 from and to float16, bfloat16 (round to nearest even, common/
// half.h's arithmetic: the host's bits) and float64. Other pairs: cudaErrorInvalidValue.
int LaunchConvert(void* dst, DataType to, const void* src, DataType from, size_t count,
                  void* stream);
// inout[i] = op(inout[i], in[i]) with transport/reduce.h's rules (a NaN operand of min and
// max wins, the first one; ties give `in`; 16-bit types through float32, rounded back);
// kAverage sums.
int LaunchReduce(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op,
                 void* stream);

}  // namespace braid::device::cuda

#endif  // BRAID_DEVICE_CUDA_DEVICE_KERNELS_H_
