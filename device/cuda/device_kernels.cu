// The device interface's kernels (device_kernels.h). The element arithmetic is the host's:
// common/half.h's conversions (BRAID_HD) and transport/reduce.cc's rules, restated below for
// the types it widens; compiled with --fmad=false (nothing here multiplies and adds, but the
// rule holds for every braid CUDA source).
#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>

#include "common/half.h"
#include "device/cuda/device_kernels.h"
#include "device/cuda/launch.cuh"

namespace braid::device::cuda {
namespace {

using cuda_launch::Blocks;
using cuda_launch::kThreads;

template <typename T>
__global__ void FillKernel(T* dst, size_t count, T value) {
  BRAID_GRID_STRIDE(i, count) {
    dst[i] = value;
  }
}

template <typename T>
int Fill(void* dst, size_t count, const void* pattern, cudaStream_t s) {
  T value;
  std::memcpy(&value, pattern, sizeof(T));
  FillKernel<T><<<Blocks(count), kThreads, 0, s>>>(static_cast<T*>(dst), count, value);
  return static_cast<int>(cudaGetLastError());
}

// Integers add and multiply as unsigned (wrapping, as the host's), floats as themselves.
template <typename T, bool = std::is_integral_v<T>>
struct WideOf { using type = T; };
template <typename T>
struct WideOf<T, true> { using type = std::make_unsigned_t<std::common_type_t<T, unsigned>>; };

// Loads and stores of each dtype as the reduction computes them (transport/reduce.cc).
template <typename S>
struct Native {
  using Storage = S;
  using Compute = typename WideOf<S>::type;
  __device__ static S Load(S v) { return v; }
  __device__ static S Store(S v) { return v; }
};
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  __device__ static float Load(uint16_t h) { return Float16ToFloat(h); }
  __device__ static uint16_t Store(float f) { return FloatToFloat16(f); }
};
struct BHalf {
  using Storage = uint16_t;
  using Compute = float;
  __device__ static float Load(uint16_t h) { return BFloat16ToFloat(h); }
  __device__ static uint16_t Store(float f) { return FloatToBFloat16(f); }
};

template <typename Codec>
__global__ void ReduceKernel(typename Codec::Storage* inout,
                             const typename Codec::Storage* in, size_t count, ReduceOp op) {
  using C = typename Codec::Compute;
  BRAID_GRID_STRIDE(i, count) {
    const auto a = Codec::Load(inout[i]);
    const auto b = Codec::Load(in[i]);
    decltype(a + b) r;
    switch (op) {
      case ReduceOp::kMin: r = a != a ? a : (a < b ? a : b); break;  // a NaN in `a` wins
      case ReduceOp::kMax: r = a != a ? a : (a > b ? a : b); break;
      case ReduceOp::kProduct: r = static_cast<C>(a) * static_cast<C>(b); break;
      default: r = static_cast<C>(a) + static_cast<C>(b); break;  // sum, average
    }
    inout[i] = Codec::Store(static_cast<decltype(a)>(r));
  }
}

template <typename Codec>
int Reduce(void* inout, const void* in, size_t count, ReduceOp op, cudaStream_t s) {
  using S = typename Codec::Storage;
  ReduceKernel<Codec><<<Blocks(count), kThreads, 0, s>>>(static_cast<S*>(inout),
                                                         static_cast<const S*>(in), count, op);
  return static_cast<int>(cudaGetLastError());
}

// to[i] = To(From(from[i])) through float32.
template <typename From, typename To>
__global__ void ConvertKernel(typename To::Storage* to, const typename From::Storage* from,
                              size_t count) {
  BRAID_GRID_STRIDE(i, count) {
    to[i] = To::Store(static_cast<typename To::Compute>(From::Load(from[i])));
  }
}

template <typename From, typename To>
int Convert(void* dst, const void* src, size_t count, cudaStream_t s) {
  ConvertKernel<From, To><<<Blocks(count), kThreads, 0, s>>>(
      static_cast<typename To::Storage*>(dst), static_cast<const typename From::Storage*>(src),
      count);
  return static_cast<int>(cudaGetLastError());
}

template <typename To>
int ConvertFromFloat32(void* dst, const void* src, size_t count, cudaStream_t s) {
  return Convert<Native<float>, To>(dst, src, count, s);
}

}  // namespace

int LaunchFillPattern(void* dst, size_t count, const void* pattern, size_t element_bytes,
                      void* stream) {
  if (count == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  switch (element_bytes) {
    case 1: return Fill<uint8_t>(dst, count, pattern, s);
    case 2: return Fill<uint16_t>(dst, count, pattern, s);
    case 4: return Fill<uint32_t>(dst, count, pattern, s);
    case 8: return Fill<uint64_t>(dst, count, pattern, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int LaunchConvert(void* dst, DataType to, const void* src, DataType from, size_t count,
                  void* stream) {
  if (count == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (from == DataType::kFloat32) {
    switch (to) {
      case DataType::kFloat16: return ConvertFromFloat32<Half>(dst, src, count, s);
      case DataType::kBFloat16: return ConvertFromFloat32<BHalf>(dst, src, count, s);
      case DataType::kFloat64: return ConvertFromFloat32<Native<double>>(dst, src, count, s);
      default: break;
    }
  } else if (to == DataType::kFloat32) {
    switch (from) {
      case DataType::kFloat16: return Convert<Half, Native<float>>(dst, src, count, s);
      case DataType::kBFloat16: return Convert<BHalf, Native<float>>(dst, src, count, s);
      case DataType::kFloat64: return Convert<Native<double>, Native<float>>(dst, src, count, s);
      default: break;
    }
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int LaunchReduce(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op,
                 void* stream) {
  if (count == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DataType::kFloat32: return Reduce<Native<float>>(inout, in, count, op, s);
    case DataType::kFloat64: return Reduce<Native<double>>(inout, in, count, op, s);
    case DataType::kFloat16: return Reduce<Half>(inout, in, count, op, s);
    case DataType::kBFloat16: return Reduce<BHalf>(inout, in, count, op, s);
    case DataType::kInt32: return Reduce<Native<int32_t>>(inout, in, count, op, s);
    case DataType::kInt64: return Reduce<Native<int64_t>>(inout, in, count, op, s);
    case DataType::kUInt8: return Reduce<Native<uint8_t>>(inout, in, count, op, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace braid::device::cuda
