// Radix select for the top-k, and the sparsifiers' gather, scatter and memory update
// (topk_kernels.h). Compiled with --fmad=false: the memory update must round as the CPU's
// (topk.cc's AddFilterAndClear, under fp-contract=off) does.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include "common/half.h"
#include "compression/cuda/topk_kernels.h"
#include "device/cuda/launch.cuh"

namespace braid::compression::cuda {
namespace {

using cuda_launch::Blocks;
using cuda_launch::kThreads;

// Where the selection stands after each pass: the key's high bits found so far (prefix under
// mask) and how many of the elements with that prefix are still to be taken.
struct Selection {
  uint32_t prefix;
  uint32_t mask;
  uint32_t remaining;
  uint32_t nonfinite;
  uint32_t histogram[256];
};

// The scratch, in order: the Selection, then per element its tie flag, its rank among ties,
// its selection flag and its index, then CUB's temporary storage.
struct Layout {
  size_t ties, ranks, flags, ids, selected, cub, cub_bytes, total;
};

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

Layout LayoutFor(size_t n) {
  Layout l{};
  size_t scan = 0, select = 0;
  cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<uint32_t*>(nullptr),
                                static_cast<uint32_t*>(nullptr), static_cast<int64_t>(n));
  cub::DeviceSelect::Flagged(nullptr, select, static_cast<uint32_t*>(nullptr),
                             static_cast<uint8_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                             static_cast<int64_t*>(nullptr), static_cast<int64_t>(n));
  l.ties = Align(sizeof(Selection));
  l.ranks = l.ties + Align(n * 4);
  l.flags = l.ranks + Align(n * 4);
  l.ids = l.flags + Align(n);
  l.selected = l.ids + Align(n * 4);
  l.cub = l.selected + Align(sizeof(int64_t));
  l.cub_bytes = scan > select ? scan : select;
  l.total = l.cub + Align(l.cub_bytes);
  return l;
}

__device__ uint32_t Key(const float* x, const float* addend, size_t i) {
  return FloatBits(addend != nullptr ? x[i] + addend[i] : x[i]) & 0x7fffffffu;
}

__global__ void StartKernel(Selection* s, uint32_t k) {
  if (threadIdx.x == 0) {
    s->prefix = 0;
    s->mask = 0;
    s->remaining = k;
    s->nonfinite = 0;
  }
  s->histogram[threadIdx.x] = 0;  // 256 threads
}

// The histogram of digit (key >> shift) & 255 of the keys that carry the prefix so far.
__global__ void HistogramKernel(const float* x, const float* addend, size_t n, int shift,
                                Selection* s) {
  __shared__ uint32_t local[256];
  local[threadIdx.x] = 0;  // 256 threads
  __syncthreads();
  const uint32_t prefix = s->prefix, mask = s->mask;
  bool nonfinite = false;
  BRAID_GRID_STRIDE(i, n) {
    const uint32_t key = Key(x, addend, i);
    nonfinite = nonfinite || key >= 0x7f800000u;
    if ((key & mask) == prefix) atomicAdd(&local[(key >> shift) & 255u], 1u);
  }
  if (nonfinite) atomicOr(&s->nonfinite, 1u);
  __syncthreads();
  if (local[threadIdx.x] != 0) atomicAdd(&s->histogram[threadIdx.x], local[threadIdx.x]);
}

// The digit, from the largest, whose bucket holds the k-th largest key still wanted.
__global__ void ChooseKernel(Selection* s, int shift) {
  uint32_t remaining = s->remaining;
  for (int d = 255; d >= 0; --d) {
    const uint32_t count = s->histogram[d];
    if (count >= remaining) {
      s->prefix |= static_cast<uint32_t>(d) << shift;
      s->mask |= 255u << shift;
      break;
    }
    remaining -= count;
  }
  s->remaining = remaining;
  for (int d = 0; d < 256; ++d) s->histogram[d] = 0;
}

__global__ void TiesKernel(const float* x, const float* addend, size_t n, const Selection* s,
                           uint32_t* ties, uint32_t* ids) {
  BRAID_GRID_STRIDE(i, n) {
    ties[i] = Key(x, addend, i) == s->prefix ? 1u : 0u;
    ids[i] = static_cast<uint32_t>(i);
  }
}

// Every key above T, and the first `remaining` keys equal to T by index.
__global__ void FlagKernel(const float* x, const float* addend, size_t n, const Selection* s,
                           const uint32_t* ranks, uint8_t* flags) {
  BRAID_GRID_STRIDE(i, n) {
    const uint32_t key = Key(x, addend, i);
    flags[i] = key > s->prefix || (key == s->prefix && ranks[i] < s->remaining);
  }
}

__global__ void GatherKernel(const float* x, const float* addend, const uint32_t* indices,
                             size_t k, float* values) {
  BRAID_GRID_STRIDE(i, k) {
    const uint32_t j = indices[i];
    values[i] = addend != nullptr ? x[j] + addend[j] : x[j];
  }
}

__global__ void ScatterKernel(const uint32_t* indices, const float* values, size_t k,
                              float divisor, bool add, float* out) {
  BRAID_GRID_STRIDE(i, k) {
    const float v = divisor == 1.0f ? values[i] : values[i] / divisor;
    out[indices[i]] = add ? out[indices[i]] + v : v;
  }
}

__global__ void AddFilterAndClearKernel(float* m, float* g, size_t n, float beta) {
  const float keep = 1.0f - beta;
  BRAID_GRID_STRIDE(i, n) {
    const float p = g[i] + m[i];
    m[i] = beta == 1.0f ? p : keep * m[i] + beta * (p - 0.0f);
    g[i] = 0.0f;
  }
}

__global__ void MemoryAtSentKernel(const uint32_t* indices, const float* saved, size_t k,
                                   float beta, float* m) {
  const float keep = 1.0f - beta, d = 0.0f;
  BRAID_GRID_STRIDE(i, k) { m[indices[i]] = beta == 1.0f ? d : keep * saved[i] + beta * d; }
}

int Launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

size_t TopKScratchBytes(size_t n) { return LayoutFor(n).total; }

int LaunchTopK(const float* x, const float* addend, size_t n, size_t k, uint32_t* indices,
               uint32_t* nonfinite, void* scratch, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  if (n >= (size_t{1} << 32)) return static_cast<int>(cudaErrorInvalidValue);
  k = k < n ? k : n;
  const Layout l = LayoutFor(n);
  char* base = static_cast<char*>(scratch);
  auto* s = reinterpret_cast<Selection*>(base);
  auto* ties = reinterpret_cast<uint32_t*>(base + l.ties);
  auto* ranks = reinterpret_cast<uint32_t*>(base + l.ranks);
  auto* flags = reinterpret_cast<uint8_t*>(base + l.flags);
  auto* ids = reinterpret_cast<uint32_t*>(base + l.ids);
  auto* selected = reinterpret_cast<int64_t*>(base + l.selected);
  StartKernel<<<1, 256, 0, st>>>(s, static_cast<uint32_t>(k));
  for (int shift = 24; shift >= 0 && k > 0; shift -= 8) {
    HistogramKernel<<<Blocks(n), 256, 0, st>>>(x, addend, n, shift, s);
    ChooseKernel<<<1, 1, 0, st>>>(s, shift);
  }
  if (k == 0) {  // still the non-finite check
    HistogramKernel<<<Blocks(n), 256, 0, st>>>(x, addend, n, 24, s);
  }
  cudaMemcpyAsync(nonfinite, &s->nonfinite, 4, cudaMemcpyDeviceToDevice, st);
  if (k == 0 || n == 0) return Launched();
  TiesKernel<<<Blocks(n), kThreads, 0, st>>>(x, addend, n, s, ties, ids);
  size_t cub_bytes = l.cub_bytes;
  cudaError_t e = cub::DeviceScan::ExclusiveSum(base + l.cub, cub_bytes, ties, ranks,
                                                static_cast<int64_t>(n), st);
  if (e != cudaSuccess) return static_cast<int>(e);
  FlagKernel<<<Blocks(n), kThreads, 0, st>>>(x, addend, n, s, ranks, flags);
  cub_bytes = l.cub_bytes;
  e = cub::DeviceSelect::Flagged(base + l.cub, cub_bytes, ids, flags, indices, selected,
                                 static_cast<int64_t>(n), st);
  return e != cudaSuccess ? static_cast<int>(e) : Launched();
}

int LaunchGather(const float* x, const float* addend, const uint32_t* indices, size_t k,
                 float* values, void* stream) {
  if (k == 0) return 0;
  GatherKernel<<<Blocks(k), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, addend,
                                                                               indices, k, values);
  return Launched();
}

int LaunchScatter(const uint32_t* indices, const float* values, size_t k, float divisor,
                  bool add, float* out, void* stream) {
  if (k == 0) return 0;
  ScatterKernel<<<Blocks(k), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      indices, values, k, divisor, add, out);
  return Launched();
}

int LaunchAddFilterAndClear(float* m, float* g, size_t n, float beta, void* stream) {
  if (n == 0) return 0;
  AddFilterAndClearKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      m, g, n, beta);
  return Launched();
}

int LaunchMemoryAtSent(const uint32_t* indices, const float* saved, size_t k, float beta,
                       float* m, void* stream) {
  if (k == 0) return 0;
  MemoryAtSentKernel<<<Blocks(k), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      indices, saved, k, beta, m);
  return Launched();
}

}  // namespace braid::compression::cuda
