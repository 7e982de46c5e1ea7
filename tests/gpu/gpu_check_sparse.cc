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
  k::LaunchScatter(idx, values, want.size(), 1.0f, /*add=*/false, out, nullptr);
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

// The memory after a step (SparseBucket::UpdateMemoryAndClear's arithmetic) and a scatter
// that divides and adds, against the CPU's, bit for bit, for β = 1 and β = 0.1.
void CheckMemoryUpdate() {
  const size_t n = 100003;
  const std::vector<float> g = Values(n, 61, true), m = Values(n, 62, true);
  std::vector<uint32_t> sent;
  for (uint32_t i = 5; i < n; i += 97) sent.push_back(i);
  for (float beta : {1.0f, 0.1f}) {
    std::vector<float> cm = m, cg = g, saved;
    for (uint32_t i : sent) saved.push_back(cm[i]);
    compression::AddFilterAndClear(cm.data(), cg.data(), n, beta);
    const float keep = 1.0f - beta;
    for (size_t i = 0; i < sent.size(); ++i) {
      cm[sent[i]] = beta == 1.0f ? 0.0f : keep * saved[i] + beta * 0.0f;
    }
    float *dm = ToDevice(m), *dg = ToDevice(g), *dsaved = ToDevice(std::vector<float>(sent.size()));
    uint32_t* didx = ToDevice(sent);
    k::LaunchGather(dm, nullptr, didx, sent.size(), dsaved, nullptr);
    k::LaunchAddFilterAndClear(dm, dg, n, beta, nullptr);
    k::LaunchMemoryAtSent(didx, dsaved, sent.size(), beta, dm, nullptr);
    std::string where;
    Report(SameBits(ToHost(dm, n), cm, &where) && SameBits(ToHost(dg, n), cg, &where),
           "sparse memory update, beta " + std::to_string(beta), where);
    // values / 3 added at the sent indices.
    std::vector<float> add_to = g;
    for (size_t i = 0; i < sent.size(); ++i) add_to[sent[i]] += saved[i] / 3.0f;
    CUDA_OK(cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice));
    k::LaunchScatter(didx, dsaved, sent.size(), 3.0f, /*add=*/true, dg, nullptr);
    Report(SameBits(ToHost(dg, n), add_to, &where), "sparse scatter, divided and added", where);
    for (void* d : {static_cast<void*>(dm), static_cast<void*>(dg), static_cast<void*>(dsaved),
                    static_cast<void*>(didx)}) {
      cudaFree(d);
    }
  }
}

}  // namespace

void CheckTopK() {
  CheckMemoryUpdate();
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
