// What the GPU check's parts (gpu_check.cc, gpu_check_powersgd.cc) share: the report, device
// buffers to and from the host, inputs with each format's edge values, bit comparison and a
// timer. Hand-rolled instead of GoogleTest: the GPU machine has no GoogleTest, and the
// check's report (one line per check, then the throughputs) is what BENCHMARKS.md records.
#ifndef BRAID_TESTS_GPU_GPU_CHECK_H_
#define BRAID_TESTS_GPU_GPU_CHECK_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace braid {

inline int g_failures = 0;

inline void Report(bool ok, const std::string& name, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.empty() ? "" : ": ",
              detail.c_str());
  if (!ok) ++g_failures;
}

#define CUDA_OK(call)                                                               \
  do {                                                                              \
    const cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_));                  \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// Device memory holding a copy of `host`, and back.
template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  CUDA_OK(cudaMalloc(&d, host.size() * sizeof(T) + 1));
  CUDA_OK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<T> host(n);
  CUDA_OK(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Gradient-like values (normal, wide range) with each format's edges mixed in: zeros, signed
// zeros, subnormals, the float16 limits, and, unless `finite`, infinities and NaNs.
inline std::vector<float> Values(size_t n, uint32_t seed, bool finite) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(normal(rng), exponent(rng));
  const float edges[] = {0.0f, -0.0f, 1e-45f, -3e-39f, 65504.0f, 65520.0f, 6e-8f, 1e30f};
  for (size_t i = 0; i < n; i += 97) v[i] = edges[(i / 97) % 8];
  if (!finite && n > 300) {
    const uint32_t payload_nans[] = {0x7fa00000u, 0xffc12345u, 0x7f800001u};
    v[n / 3] = std::nanf("");
    v[n / 2] = INFINITY;
    for (int j = 0; j < 3; ++j) std::memcpy(&v[n / 5 + 11 * j], &payload_nans[j], 4);
  }
  return v;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b, std::string* where) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      *where = "first difference at element " + std::to_string(i);
      return false;
    }
  }
  return true;
}

// Seconds per call of `fn`, the median of 5 timed runs after a warm-up.
inline double Time(const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    CUDA_OK(cudaDeviceSynchronize());
    const auto start = std::chrono::steady_clock::now();
    fn();
    CUDA_OK(cudaDeviceSynchronize());
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  t.erase(t.begin());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Bit for bit, except that two NaNs match whatever their payloads: a GPU's arithmetic on a
// NaN gives the canonical NaN where x86 keeps the operand's payload (both keep which elements
// are NaN). For the results of arithmetic; shared integer code (half.h's conversions, the
// codes and scales) is compared with SameBits.
inline bool IsNaN(DataType dtype, const char* p) {
  switch (dtype) {
    case DataType::kFloat32: { float v; std::memcpy(&v, p, 4); return std::isnan(v); }
    case DataType::kFloat64: { double v; std::memcpy(&v, p, 8); return std::isnan(v); }
    case DataType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return (h & 0x7fff) > 0x7c00; }
    case DataType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); return (h & 0x7fff) > 0x7f80; }
    default: return false;
  }
}
inline bool SameOrNaN(DataType dtype, const void* a, const void* b, size_t n, std::string* where) {
  const size_t size = DataTypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    const char* x = static_cast<const char*>(a) + i * size;
    const char* y = static_cast<const char*>(b) + i * size;
    if (std::memcmp(x, y, size) != 0 && !(IsNaN(dtype, x) && IsNaN(dtype, y))) {
      *where = "first difference at element " + std::to_string(i);
      return false;
    }
  }
  return true;
}
inline bool SameOrNaN(const std::vector<float>& a, const std::vector<float>& b,
                      std::string* where) {
  return a.size() == b.size() && SameOrNaN(DataType::kFloat32, a.data(), b.data(), a.size(), where);
}

// The checks of PowerSGD's kernels and its compression time (gpu_check_powersgd.cc).
void CheckPowerSgd();
void TimePowerSgd();
// The top-k selection's checks, and its time for k of n elements at x (gpu_check_sparse.cc).
void CheckTopK();
double TopKSeconds(const float* x, size_t n, size_t k);

}  // namespace braid

#endif  // BRAID_TESTS_GPU_GPU_CHECK_H_
