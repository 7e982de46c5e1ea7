// Launch shapes shared by braid's element-wise CUDA kernels (device/cuda, compression/cuda):
// blocks of kThreads threads, each thread striding over the elements past the grid's size,
// so one launch covers any count.
#ifndef BRAID_DEVICE_CUDA_LAUNCH_CUH_
#define BRAID_DEVICE_CUDA_LAUNCH_CUH_

#include <cstddef>

namespace braid::cuda_launch {

inline constexpr int kThreads = 256;

// Enough blocks to fill a GPU (at most 65535, at least 1) for `count` elements.
inline unsigned Blocks(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

}  // namespace braid::cuda_launch

// for (i over [0, n)) striding by the grid's threads.
#define BRAID_GRID_STRIDE(i, n)                                            \
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (n); \
       i += size_t{gridDim.x} * blockDim.x)

#endif  // BRAID_DEVICE_CUDA_LAUNCH_CUH_
