// The GPU check's sparsifier part: the top-k selection against the CPU's TopKSelector (the
// same indices: its order, ties to the lower index), with and without the addend, on data
// with many ties, and the gather and scatter of the selected values.
#include "compression/cuda/topk_kernels.h"
#include "compression/topk.h"
#include "tests/gpu/gpu_check.h"

namespace braid {
namespace {

namespace k = compression::cuda;

void CheckTopKCase(const std::vector<float>& x, const std::vector<float>* addend, size_t kk,
                   const std::string& name) {
  compression::FloatSegment segment{x.data(), x.size(), addend ? addend->data() : nullptr};
  compression::TopKSelector selector;
  std::vector<uint64_t> want64;
  selector.Select({&segment, 1}, kk, &want64, compression::TopKAlgorithm::kNthElement);
  const std::vector<uint32_t> want(want64.begin(), want64.end());
  float* dx = ToDevice(x);
  float* da = addend ? ToDevice(*addend) : nullptr;
  uint32_t* idx = ToDevice(std::vector<uint32_t>(kk + 1, 0xffffffffu));
  uint32_t* flag = ToDevice(std::vector<uint32_t>{7});
  void* scratch = nullptr;
  CUDA_OK(cudaMalloc(&scratch, k::TopKScratchBytes(x.size())));
  const int e = k::LaunchTopK(dx, da, x.size(), kk, idx, flag, scratch, nullptr);
  std::string where;
  const std::vector<uint32_t> have = ToHost(idx, want.size());
  Report(e == 0 && ToHost(flag, 1)[0] == 0 && SameBits(have, want, &where), name, where);
  // The values at those indices, gathered, then scattered into zeros.
  float* values = ToDevice(std::vector<float>(kk + 1));
  float* out = ToDevice(std::vector<float>(x.size(), 0.0f));
  k::LaunchGather(dx, da, idx, want.size(), values, nullptr);
  k::LaunchScatter(idx, values, want.size(), out, nullptr);
  std::vector<float> expect(x.size(), 0.0f);
  for (uint32_t i : want) expect[i] = addend ? x[i] + (*addend)[i] : x[i];
  Report(SameBits(ToHost(out, x.size()), expect, &where), name + ", gathered and scattered",
         where);
  for (void* d : {static_cast<void*>(dx), static_cast<void*>(da), static_cast<void*>(idx),
                  static_cast<void*>(flag), scratch, static_cast<void*>(values),
                  static_cast<void*>(out)}) {
    cudaFree(d);
  }
}

}  // namespace

void CheckTopK() {
  const size_t n = 1000003;
  std::vector<float> x = Values(n, 51, true), addend = Values(n, 52, true);
  for (size_t i = 0; i < n; i += 3) x[i] = (i % 7) * 0.5f;  // many ties at every magnitude
  for (size_t kk : {size_t{1}, size_t{1000}, size_t{10000}, n / 3}) {
    CheckTopKCase(x, nullptr, kk, "top-k " + std::to_string(kk) + " of " + std::to_string(n));
  }
  CheckTopKCase(x, &addend, 10000, "top-k of g + m");
  std::vector<float> bad = x;
  bad[n / 2] = std::nanf("");
  float* d = ToDevice(bad);
  uint32_t* idx = ToDevice(std::vector<uint32_t>(10));
  uint32_t* flag = ToDevice(std::vector<uint32_t>{0});
  void* scratch = nullptr;
  CUDA_OK(cudaMalloc(&scratch, k::TopKScratchBytes(n)));
  k::LaunchTopK(d, nullptr, n, 10, idx, flag, scratch, nullptr);
  Report(ToHost(flag, 1)[0] == 1, "top-k reports a NaN");
  for (void* p : {static_cast<void*>(d), static_cast<void*>(idx), static_cast<void*>(flag),
                  scratch}) {
    cudaFree(p);
  }
}

double TopKSeconds(const float* x, size_t n, size_t kk) {
  uint32_t *idx = nullptr, *flag = nullptr;
  void* scratch = nullptr;
  CUDA_OK(cudaMalloc(&idx, kk * 4));
  CUDA_OK(cudaMalloc(&flag, 4));
  CUDA_OK(cudaMalloc(&scratch, k::TopKScratchBytes(n)));
  const double t = Time([&] { k::LaunchTopK(x, nullptr, n, kk, idx, flag, scratch, nullptr); });
  cudaFree(idx);
  cudaFree(flag);
  cudaFree(scratch);
  return t;
}

}  // namespace braid
